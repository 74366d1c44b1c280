"""Rank fusion as plain functions over runs ``{query_id: {doc_id: score}}``.

The dict format is ranx's ``Run`` format, so results can be compared with ``ranx.fuse`` directly.
Within a run, a query's documents are ranked by descending score, ties broken by ascending doc
id (rank 1 = best).

These are written here rather than called from ``ranx.fuse`` (which gives the same fused scores,
tested): ranx is an optional extra (``ragkit[eval]``) because it brings numba, pandas, seaborn,
fastparquet and ir-datasets, and hybrid retrieval is core; a dozen lines of plain Python also
fuse a handful of runs without numba's compilation on first use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

__all__ = ["Run", "check_weights", "rank_docs", "rrf", "min_max_normalize", "weighted_sum", "minmax_fusion", "fuse"]

Run = Mapping[str, Mapping[str, float]]


def _check_runs(runs: Sequence[Run]) -> list[str]:
    if not runs:
        raise ValueError("fusion needs at least one run")
    qids: list[str] = list(runs[0])
    for i, run in enumerate(runs[1:], 1):
        if set(run) != set(qids):
            raise ValueError(
                f"run {i} has other query ids than run 0; every run must cover the same queries"
            )
    return qids


def check_weights(weights: Sequence[float] | None, n_runs: int) -> list[float]:
    """One finite weight per run (default all 1); NaN or infinite weights are refused (a NaN
    weight would turn every fused score into NaN)."""
    if weights is None:
        return [1.0] * n_runs
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"weights must be a list of numbers, got {weights!r}")
    w = []
    for i, x in enumerate(weights):
        try:
            v = float(x)
        except (TypeError, ValueError):
            raise ValueError(f"fusion weight {i} is {x!r}, not a number") from None
        if not math.isfinite(v):
            raise ValueError(f"fusion weight {i} is {x!r}; weights must be finite numbers")
        w.append(v)
    if len(w) != n_runs:
        raise ValueError(f"{n_runs} runs but {len(w)} weights; give one weight per run")
    return w


def _check_k(k: float) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k <= 0:
        raise ValueError(f"the RRF constant k must be a positive finite number, got {k!r}")


def rank_docs(results: Mapping[str, float]) -> list[str]:
    """Doc ids of one query's results, best first (score descending, then doc id)."""
    return sorted(results, key=lambda d: (-float(results[d]), d))


def rrf(runs: Sequence[Run], k: int = 60) -> dict[str, dict[str, float]]:
    """Reciprocal rank fusion (Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms
    Condorcet and individual Rank Learning Methods", SIGIR 2009)::

        RRF(d) = sum_r 1 / (k + rank_r(d))

    over the runs ``r`` that retrieved ``d``, with 1-based ranks and ``k = 60`` by default.

    Parameters
    ----------
    runs
        Runs ``{qid: {doc: score}}`` over the same query ids.
    k
        The smoothing constant (> 0).

    Returns
    -------
    dict
        The fused run ``{qid: {doc: rrf_score}}``.
    """
    _check_k(k)
    qids = _check_runs(runs)
    out: dict[str, dict[str, float]] = {}
    for q in qids:
        per_run = [{d: 1 / (k + i + 1) for i, d in enumerate(rank_docs(run[q]))} for run in runs]
        docs = dict.fromkeys(d for r in per_run for d in r)
        out[q] = {d: sum(r.get(d, 0.0) for r in per_run) for d in docs}
    return out


def min_max_normalize(run: Run) -> dict[str, dict[str, float]]:
    """Per query, ``(s - min) / max(max - min, 1e-9)`` (scores in [0, 1]; ranx's min-max norm)."""
    out: dict[str, dict[str, float]] = {}
    for q, res in run.items():
        if not res:
            out[q] = {}
            continue
        lo, hi = min(res.values()), max(res.values())
        den = max(hi - lo, 1e-9)
        out[q] = {d: (float(s) - lo) / den for d, s in res.items()}
    return out


def weighted_sum(
    runs: Sequence[Run], weights: Sequence[float] | None = None
) -> dict[str, dict[str, float]]:
    """``score(d) = sum_r w_r * s_r(d)`` with ``s_r(d) = 0`` when run ``r`` missed ``d``."""
    qids = _check_runs(runs)
    w = check_weights(weights, len(runs))
    for i, run in enumerate(runs):
        for q in qids:
            for d, sc in run[q].items():
                if not math.isfinite(float(sc)):
                    raise ValueError(
                        f"run {i} gives document {d!r} of query {q!r} the score {sc!r}; fusion "
                        "needs finite scores (drop or repair that run's NaN/inf scores)")
    out: dict[str, dict[str, float]] = {}
    for q in qids:
        docs = dict.fromkeys(d for run in runs for d in run[q])
        out[q] = {d: sum(wi * run[q].get(d, 0.0) for wi, run in zip(w, runs)) for d in docs}
    return out


def minmax_fusion(
    runs: Sequence[Run], weights: Sequence[float] | None = None
) -> dict[str, dict[str, float]]:
    """Min-max weighted score fusion (Fox & Shaw, "Combination of Multiple Searches", TREC-2
    1993; normalisation as in Lee, "Analyses of multiple evidence combination", SIGIR 1997)::

        score(d) = sum_r w_r * (s_r(d) - min_r) / (max_r - min_r)

    per query, where ``min_r``/``max_r`` are run ``r``'s extreme scores for that query and a
    document missing from run ``r`` contributes 0. Equal weights by default.
    """
    return weighted_sum([min_max_normalize(r) for r in runs], weights)


def fuse(runs: Sequence[Run], method: str = "rrf", weights: Sequence[float] | None = None,
         k: int = 60) -> dict[str, dict[str, float]]:
    """Dispatch to :func:`rrf` (``method="rrf"``, optional per-run ``weights`` multiply each
    run's ``1/(k + rank)`` term) or :func:`minmax_fusion` (``method="minmax"``)."""
    if method == "rrf":
        if weights is None:
            return rrf(runs, k=k)
        _check_k(k)
        qids = _check_runs(runs)
        ranked = [{q: {d: 1 / (k + i + 1) for i, d in enumerate(rank_docs(r[q]))} for q in qids}
                  for r in runs]
        return weighted_sum(ranked, weights)
    if method == "minmax":
        return minmax_fusion(runs, weights)
    raise ValueError(f"unknown fusion method {method!r}; use 'rrf' or 'minmax'")
