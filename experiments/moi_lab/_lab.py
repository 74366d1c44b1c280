"""What the MoI lab's scripts share: the per-question retriever orders, the answer scores, the blend table.

Not a script: ``moi_quality.py``, ``moi_designs.py``, ``placement.py`` and ``question_orders.py``
import it (they never import each other), so that each number is computed one way in the study.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci


def question_orders(records: Sequence[Any], kinds: Sequence[str] = ("bm25", "dense"),
                    embedder: str | None = None, device: str = "auto") -> dict[str, dict[str, list[str]]]:
    """``{record.id: {kind: [passage ids, best first]}}`` for each record's own passages."""
    from ragkit.retrievers import BM25Retriever

    out: dict[str, dict[str, list[str]]] = {r.id: {} for r in records}
    if "bm25" in kinds:
        for rec in records:
            bm = BM25Retriever().index(list(rec.passages))
            hits = bm.search([rec.question], k=len(rec.passages))[0].ids()
            rest = [p.id for p in rec.passages if p.id not in set(hits)]  # no term in common: given order
            out[rec.id]["bm25"] = list(hits) + rest
    if "dense" in kinds:
        from ragkit.models import load_embedder

        model = load_embedder(embedder, device=device)
        qv = model.encode([r.question for r in records], normalize_embeddings=True, batch_size=64)
        texts = [f"{p.title}\n{p.text}" if p.title else p.text for r in records for p in r.passages]
        pv = model.encode(texts, normalize_embeddings=True, batch_size=64)
        start = 0
        for i, rec in enumerate(records):
            n = len(rec.passages)
            sims = pv[start: start + n] @ qv[i]
            start += n
            order = sorted(range(n), key=lambda j: (-float(sims[j]), j))
            out[rec.id]["dense"] = [rec.passages[j].id for j in order]
    return out


def reorder(records: list[Any], order: str, orders_file: str | None) -> list[Any]:
    """Each record with its passages in ``order``: ``given``, or ``bm25`` / ``dense`` from the file."""
    if order == "given":
        return records
    if orders_file:
        table = json.loads(open(orders_file, encoding="utf-8").read())["orders"]
    else:
        table = question_orders(records, (order,))
    out = []
    for rec in records:
        ids = table[rec.id][order]
        by_id = {p.id: p for p in rec.passages}
        if set(ids) != set(by_id):
            raise SystemExit(f"{orders_file}: the {order} order of {rec.id} does not hold its passages: "
                             "write the file again with experiments/moi_lab/question_orders.py for this data")
        out.append(dataclasses.replace(rec, passages=tuple(by_id[i] for i in ids)))
    return out


def answer_scores(fmt: str, answer: str, refs: list[str]) -> dict[str, Any]:
    """EM and F1 (SQuAD normalisation) of one answer and, on MS MARCO, ROUGE-L by rouge-score and by
    the leaderboard's protocol, as ``ragkit.eval.runner.answer_metrics`` computes them (``None``
    elsewhere)."""
    from ragkit.eval.metrics import exact_match_max, f1_max
    from ragkit.eval.runner import answer_metrics

    ms = answer_metrics("msmarco", answer, refs) if fmt == "msmarco" else {}
    return {"em": exact_match_max(answer, refs), "f1": f1_max(answer, refs),
            "rouge_l": ms.get("rouge_l"), "rouge_l_official": ms.get("rougeL_official")}


def blend_table(row: dict[str, Any], ids: list[list[str]], golds: list[set[str]], k: int, blends: list[float],
                base_mrr: np.ndarray, blend: Any) -> list[dict[str, Any]]:
    """MRR@k of MoI's ranking at each blend weight ``β``, from a row's stored utilities and fallbacks.

    As :class:`ragkit.debias.MoI` ranks: a query that fell back keeps the retriever order;
    otherwise passages sort by ``blend(u, β)`` descending, ties in retriever order. The prior is
    the retriever's ranks (no scores are passed to MoI in these benchmarks).
    """
    out = []
    for beta in blends:
        mrr = []
        for u, fb, pid, g in zip(row["per_question_utilities"], row["per_question_fallback"], ids, golds):
            if fb:
                order = list(range(len(pid)))
            else:
                v = blend(np.asarray(u, dtype=np.float64), beta)
                order = sorted(range(len(pid)), key=lambda j: (-float(v[j]), j))
            mrr.append(rank_metrics([pid[j] for j in order], g, k)[0])
        arr = np.asarray(mrr)
        out.append({"beta": beta, "mrr@10": float(arr.mean()), "minus_order": paired_ci(arr, base_mrr)})
    return out
