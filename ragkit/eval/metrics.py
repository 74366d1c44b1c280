"""Answer and retrieval metrics used across ragkit.

Answer metrics
--------------
* :func:`~ragkit.text.normalize_answer`, :func:`exact_match`, :func:`f1_score` (from
  :mod:`ragkit.text`) reproduce the official
  HotpotQA evaluation script (Yang et al., 2018), itself derived from SQuAD v1.1
  (Rajpurkar et al., 2016): lowercase, drop ASCII punctuation, drop the articles
  ``a|an|the``, collapse white space; token F1 over the normalised tokens, where a prediction
  or reference that normalises to ``yes``, ``no`` or ``noanswer`` scores 0 unless both are equal.
* :func:`best_subspan_em` is the NQ-open metric of "Lost in the Middle" (Liu et al., 2024):
  1 if some normalised gold alias is a substring of the normalised output.
* :func:`rouge_l` is ROUGE-L F-measure (Lin, 2004) through the ``rouge-score`` package
  (its default tokenizer: lowercase, alphanumeric tokens; no stemming), max over references.
* :func:`bleu` is sentence-level BLEU-n (Papineni et al., 2002) through ``sacrebleu`` with
  ``max_ngram_order=n``, ``effective_order=True``, ``smooth_method="exp"``, ``tokenize="13a"``,
  ``lowercase=True``, all references used jointly (multi-reference BLEU); scaled to [0, 1].

Retrieval metrics
-----------------
:func:`ir_metrics` evaluates :class:`~ragkit.types.RankedList` runs, e.g. ``mrr@10``,
``ndcg@10``, ``recall@2``. The common metrics (:data:`BUILTIN_IR_METRICS`) are computed here
with ranx's definitions (Bassani, "ranx: A Blazing-Fast Python Library for Ranking Evaluation and
Comparison", ECIR 2022; equality is tested): ranx itself pulls numba, pandas, seaborn,
fastparquet and ir-datasets into an install that needs a dozen lines of it. Any other ranx
metric name is evaluated by ranx (``pip install "ragkit[eval]"``).

``normalize_answer``, ``exact_match`` and ``f1_score`` live in :mod:`ragkit.text` (the shared core
below debias, eval and training); this module re-exports the two scores as part of the metrics.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from ragkit.text import exact_match, f1_precision_recall, f1_score, normalize_answer
from ragkit.types import RankedList

__all__ = [
    "exact_match",
    "f1_score",
    "f1_precision_recall",
    "max_over_references",
    "exact_match_max",
    "f1_max",
    "best_subspan_em",
    "rouge_l",
    "bleu",
    "ir_metrics",
    "ir_metrics_per_query",
    "rank_metrics",
    "DEFAULT_IR_METRICS",
    "BUILTIN_IR_METRICS",
]

DEFAULT_IR_METRICS: tuple[str, ...] = ("mrr@10", "ndcg@10", "recall@2", "recall@10")
BUILTIN_IR_METRICS: tuple[str, ...] = ("mrr", "recall", "precision", "hit_rate", "ndcg", "map")
"""Metric names (each with an optional ``@k`` cut-off) computed without ranx."""

def _refs(references: str | Iterable[str]) -> list[str]:
    if isinstance(references, str):
        return [references]
    return [str(r) for r in references]


def max_over_references(
    metric: Callable[[str, str], float], prediction: str, references: str | Iterable[str]
) -> float:
    """``max_r metric(prediction, r)``; 0.0 when there is no reference."""
    refs = _refs(references)
    if not refs:
        return 0.0
    return max(float(metric(prediction, r)) for r in refs)


def exact_match_max(prediction: str, references: str | Iterable[str]) -> float:
    """Exact match against the best of several references."""
    return max_over_references(exact_match, prediction, references)


def f1_max(prediction: str, references: str | Iterable[str]) -> float:
    """Token F1 against the best of several references."""
    return max_over_references(f1_score, prediction, references)


def best_subspan_em(prediction: str, references: str | Iterable[str]) -> float:
    """1.0 if any normalised gold alias occurs (as a substring) in the normalised prediction.

    The NQ-open metric of Liu et al., "Lost in the Middle" (TACL 2024). Empty aliases are ignored.
    """
    pred = normalize_answer(prediction)
    for r in _refs(references):
        g = normalize_answer(r)
        if g and g in pred:
            return 1.0
    return 0.0


@lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(prediction: str, references: str | Iterable[str]) -> float:
    """ROUGE-L F-measure (longest common subsequence; Lin, 2004), max over references.

    Uses ``rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)``.
    0.0 when there is no reference.
    """
    refs = _refs(references)
    if not refs:
        return 0.0
    scorer = _rouge_scorer()
    return max(float(scorer.score(r, str(prediction))["rougeL"].fmeasure) for r in refs)


@lru_cache(maxsize=8)
def _bleu_metric(n: int, lowercase: bool, tokenize: str) -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU(
        max_ngram_order=n,
        effective_order=True,
        smooth_method="exp",
        lowercase=lowercase,
        tokenize=tokenize,
    )


def bleu(
    prediction: str,
    references: str | Iterable[str],
    n: int = 1,
    lowercase: bool = True,
    tokenize: str = "13a",
) -> float:
    """Sentence-level BLEU-n in [0, 1] (Papineni et al., 2002) through sacrebleu.

    ``BLEU = BP · exp(Σ_{i≤n} (1/n) log p_i)`` with modified i-gram precisions ``p_i`` counted
    against all references jointly, brevity penalty ``BP = min(1, exp(1 - r/c))`` (``r`` the
    closest reference length). Settings: ``effective_order=True`` (orders with no candidate
    n-grams are dropped, as recommended for sentences), ``smooth_method="exp"``,
    ``tokenize="13a"``, ``lowercase=True``. 0.0 when there is no reference or the
    prediction is empty.

    Parameters
    ----------
    n
        Maximum n-gram order (1 for BLEU-1, 2 for BLEU-2).
    """
    if n < 1 or n > 4:
        raise ValueError(f"BLEU order n must be in 1..4, got {n}")
    refs = _refs(references)
    if not refs or not str(prediction).strip():
        return 0.0
    score = float(_bleu_metric(n, lowercase, tokenize).sentence_score(str(prediction), refs).score)
    return min(1.0, max(0.0, score / 100.0))


def _ranx_inputs(
    qrels: Mapping[str, Iterable[str] | Mapping[str, int]],
    run: Mapping[str, RankedList | Mapping[str, float]],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    q: dict[str, dict[str, int]] = {}
    for qid, rel in qrels.items():
        d = {str(k): int(v) for k, v in rel.items()} if isinstance(rel, Mapping) else {str(x): 1 for x in rel}
        d = {k: v for k, v in d.items() if v > 0}
        if d:
            q[str(qid)] = d
    r: dict[str, dict[str, float]] = {}
    for qid, ranked in run.items():
        if str(qid) not in q:
            continue
        d2 = ranked.to_run_dict() if isinstance(ranked, RankedList) else {str(k): float(v) for k, v in ranked.items()}
        # ranx cannot hold an empty ranking: give it a dummy non-relevant document.
        r[str(qid)] = d2 or {"__ragkit_empty__": 0.0}
    for qid in q:
        r.setdefault(qid, {"__ragkit_empty__": 0.0})
    return q, r


def _builtin_metric(name: str) -> tuple[str, int | None] | None:
    """``"mrr@10"`` -> ``("mrr", 10)``; ``None`` for a name not in :data:`BUILTIN_IR_METRICS`."""
    base, _, cut = name.partition("@")
    if base not in BUILTIN_IR_METRICS or (cut and not cut.isdigit()):
        return None
    return base, int(cut) if cut else None


def _builtin_value(name: str, rel: Mapping[str, int], scores: Mapping[str, float]) -> float:
    """One query's metric with ranx's definitions (``rel``: relevance > 0 per relevant id).

    Documents are ranked by decreasing score, ties in the run's order. With ``R`` relevant
    documents, the top-``k`` list and ``rel_i`` the relevance at 1-based rank ``i``:
    MRR = 1 / (rank of the first relevant); recall = relevant retrieved / R; precision =
    relevant retrieved / k; hit_rate = 1 if any relevant is retrieved; nDCG = DCG / IDCG with
    DCG = sum_i rel_i / log2(i + 1) (Järvelin and Kekäläinen's linear gain, ranx's ``ndcg``);
    MAP = (1 / R) sum over relevant retrieved of precision at their rank.
    """
    base, k = _builtin_metric(name)  # type: ignore[misc]
    ranked = [d for d, _ in sorted(scores.items(), key=lambda kv: -kv[1])]
    top = ranked[:k] if k is not None else ranked
    hits = [1 if d in rel else 0 for d in top]
    n_rel = len(rel)
    if base == "mrr":
        return next((1.0 / i for i, h in enumerate(hits, 1) if h), 0.0)
    if base == "recall":
        return sum(hits) / n_rel
    if base == "precision":
        return sum(hits) / (k if k is not None else max(len(top), 1))
    if base == "hit_rate":
        return float(any(hits))
    if base == "map":
        found, total = 0, 0.0
        for i, h in enumerate(hits, 1):
            if h:
                found += 1
                total += found / i
        return total / n_rel
    import math

    dcg = sum(rel[d] / math.log2(i + 1) for i, d in enumerate(top, 1) if d in rel)
    ideal = sorted(rel.values(), reverse=True)[: k if k is not None else None]
    idcg = sum(v / math.log2(i + 1) for i, v in enumerate(ideal, 1))
    return dcg / idcg if idcg > 0 else 0.0


def ir_metrics_per_query(
    qrels: Mapping[str, Iterable[str] | Mapping[str, int]],
    run: Mapping[str, RankedList | Mapping[str, float]],
    metrics: Sequence[str] = DEFAULT_IR_METRICS,
) -> dict[str, dict[str, float]]:
    """Per-query retrieval metrics: ``{metric: {query_id: value}}`` (built in, or through ranx).

    Same inputs as :func:`ir_metrics`; only queries with at least one relevant id appear (a
    query missing from ``run`` scores 0).
    """
    if not metrics:
        raise ValueError("ir_metrics needs at least one metric name, e.g. ('mrr@10',)")
    q, r = _ranx_inputs(qrels, run)
    if not q:
        return {m: {} for m in metrics}
    if all(_builtin_metric(m) is not None for m in metrics):
        return {m: {qid: _builtin_value(m, q[qid], r[qid]) for qid in q} for m in metrics}
    from ragkit.types import require_extra

    others = [m for m in metrics if _builtin_metric(m) is None]
    require_extra(["ranx"], f"the retrieval metric(s) {', '.join(others)} (built in: {', '.join(BUILTIN_IR_METRICS)})")
    from ranx import Qrels, Run, evaluate

    ranx_run = Run(r)
    with warnings.catch_warnings():  # numba's "unsafe cast uint64 -> int64" notice inside ranx
        warnings.simplefilter("ignore")
        evaluate(Qrels(q), ranx_run, list(metrics), make_comparable=True, save_results_in_run=True)
    return {m: {qid: float(v) for qid, v in ranx_run.scores[m].items()} for m in metrics}


def ir_metrics(
    qrels: Mapping[str, Iterable[str] | Mapping[str, int]],
    run: Mapping[str, RankedList | Mapping[str, float]],
    metrics: Sequence[str] = DEFAULT_IR_METRICS,
) -> dict[str, float]:
    """Mean retrieval metrics of a run (:data:`BUILTIN_IR_METRICS` built in, any other ranx metric through ranx).

    Parameters
    ----------
    qrels
        ``{query_id: relevant ids}`` (an iterable of ids, relevance 1) or
        ``{query_id: {doc_id: relevance}}``. Queries without any relevant id are dropped
        (they have no defined recall/MRR).
    run
        ``{query_id: RankedList}`` (converted with :meth:`RankedList.to_run_dict`) or
        ``{query_id: {doc_id: score}}``.
    metrics
        ranx metric names, e.g. ``("mrr@10", "ndcg@10", "recall@2", "recall@10")``.

    Returns
    -------
    dict
        ``{metric: mean over the judged queries}``; NaN for every metric when no query is judged.
    """
    per = ir_metrics_per_query(qrels, run, metrics)
    return {m: (sum(v.values()) / len(v) if v else float("nan")) for m, v in per.items()}


def rank_metrics(ranking_ids: Sequence[str], gold: Iterable[str], k: int = 10) -> tuple[float, float]:
    """``(MRR@k, recall@2)`` of one ranking against its gold ids, without ranx.

    ``MRR@k`` is the reciprocal rank of the first gold id within the top ``k`` (0 when none is there);
    ``recall@2`` is the share of the gold ids in the top 2 (Manning et al., *Introduction to
    Information Retrieval*, 2008, ch. 8). On one query both equal ranx's ``mrr@k`` and ``recall@2``.
    """
    gold = set(gold)
    rr = 0.0
    for r, pid in enumerate(ranking_ids[:k]):
        if pid in gold:
            rr = 1.0 / (r + 1)
            break
    rec2 = len(gold & set(ranking_ids[:2])) / max(1, len(gold))
    return rr, rec2
