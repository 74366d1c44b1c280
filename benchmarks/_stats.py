"""Per-query ranking metrics and paired bootstrap intervals shared by the MoI benchmarks.

``MRR@k`` is the reciprocal rank of the first gold passage within the top ``k`` (0 when none
is there); ``recall@2`` is the share of a query's gold passages in the top 2 (Manning et al.,
*Introduction to Information Retrieval*, 2008, ch. 8). Both equal ranx's ``mrr@k`` and
``recall@2`` on one query; they are computed here so that a benchmark needs no ranx.

The paired interval is the percentile bootstrap (Efron & Tibshirani, 1993) of the mean of the
per-query differences ``x_i - y_i`` over the same queries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def rank_metrics(ranking_ids: Sequence[str], gold: Iterable[str], k: int = 10) -> tuple[float, float]:
    """(MRR@k, recall@2) of one ranking against its gold ids."""
    gold = set(gold)
    rr = 0.0
    for r, pid in enumerate(ranking_ids[:k]):
        if pid in gold:
            rr = 1.0 / (r + 1)
            break
    rec2 = len(gold & set(ranking_ids[:2])) / max(1, len(gold))
    return rr, rec2


def label_references(labs: Sequence[Any], seed: int = 0, n_perm: int = 200) -> dict[str, dict[str, list[float]]]:
    """Per-question (MRR@10, recall@2) of MoI label rankings and of a random order, against gold.

    ``labs``: label records (``ranking``, ``passage_ids``, ``gold_ids``), each with gold paragraphs.
    ``"teacher"`` scores each label's own ranking; ``"random"`` is the mean over ``n_perm`` random
    permutations of its passages (Monte Carlo expectation): what the labels carry, and what a
    student that learned nothing scores.
    """
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {n: {"mrr@10": [], "recall@2": []} for n in ("teacher", "random")}
    for lab in labs:
        rows = {"teacher": np.array([rank_metrics(list(lab.ranking), lab.gold_ids)]),
                "random": np.array([rank_metrics(list(rng.permutation(list(lab.passage_ids))), lab.gold_ids)
                                    for _ in range(n_perm)])}
        for name, r in rows.items():
            out[name]["mrr@10"].append(float(r[:, 0].mean()))
            out[name]["recall@2"].append(float(r[:, 1].mean()))
    return out


def paired_ci(x: Sequence[float], y: Sequence[float], seed: int = 0, n_boot: int = 2000) -> list[float]:
    """``[mean(x - y), low, high]``: the mean paired difference and its 95% bootstrap interval."""
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    if d.size == 0:
        return [float("nan")] * 3
    rng = np.random.default_rng(seed)
    boots = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
    return [float(d.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]
