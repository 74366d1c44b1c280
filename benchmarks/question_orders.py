"""Per-question retriever orders: each question's own passages ranked by BM25 and by the dense embedder.

HotpotQA gives 10 paragraphs per question in a random order and MS MARCO 10 Bing passages; MoI's
"on the retriever's list" rows start from these passages ranked by a real retriever instead:

- ``bm25``: the question against its own passages with ragkit's ``BM25Retriever`` (bm25s, Lucene
  variant, k1 = 1.5, b = 0.75; Robertson & Zaragoza, 2009);
- ``dense``: cosine similarity of the embedder's normalised embeddings (the embedded
  all-MiniLM-L6-v2 by default), ties broken by the given order.

Writes ``{"orders": {question_id: {"bm25": [ids], "dense": [ids]}}}`` so that a machine without
the embedder (a GPU machine that reaches no hub) can run ``moi_quality.py --orders FILE``, and
``"metrics"``: gold-passage MRR@10 and recall@2 of the given, BM25 and dense orders over the
questions that have gold passages (``_stats.rank_metrics``), with each retriever order minus the
given order (paired 95% bootstrap interval).

    python3 benchmarks/question_orders.py --data ../shared/data/hotpotqa/dev.jsonl --out /tmp/orders-dev.json
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from _harness import gpu_epilog, rel, write_result
from _stats import paired_ci, rank_metrics


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


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog(
        "question_orders.py",
        "--data ../shared/data/hotpotqa/dev.jsonl --embedder BAAI/bge-small-en-v1.5 --device cuda "
        "--out /tmp/orders-dev.json",
        generator=False)
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="HotpotQA JSONL or MS MARCO QnA JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="bm25,dense")
    ap.add_argument("--embedder", default=None, help="dense encoder (default: the embedded MiniLM)")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ragkit.datasets import detect_format, load_dataset

    records = load_dataset(detect_format(args.data), args.data)
    kinds = args.kinds.split(",")
    table = question_orders(records, kinds, args.embedder, args.device)
    gold = [r for r in records if r.gold_ids]
    per: dict[str, list[tuple[float, float]]] = {
        kind: [rank_metrics(table[r.id][kind] if kind != "given" else [p.id for p in r.passages], r.gold_ids, 10)
               for r in gold] for kind in ("given", *kinds)}
    metrics = {kind: {"mrr@10": float(np.mean([m for m, _ in v])), "recall@2": float(np.mean([x for _, x in v])),
                      "n": len(v)} for kind, v in per.items()}
    for kind in kinds:
        metrics[kind]["mrr@10_minus_given"] = paired_ci([m for m, _ in per[kind]], [m for m, _ in per["given"]])
    write_result(args.out, {"data": rel(args.data), "kinds": kinds, "embedder": args.embedder or "embedded MiniLM",
                            "metrics": metrics, "orders": table})
    for kind, m in metrics.items():
        print(f"{kind:<6} MRR@10 {m['mrr@10']:.3f}  recall@2 {m['recall@2']:.3f}  n={m['n']}")
    n = len(records)
    agree = np.mean([t["bm25"][0] == t["dense"][0] for t in table.values()]) if "dense" in args.kinds else None
    print(f"{n} questions; top-1 agreement bm25/dense: {agree}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
