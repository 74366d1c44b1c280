"""The ``prune`` placement: keep only passages whose leave-one-out utility says they help.

Leave-one-out gives each candidate a signed utility ``u_i = o(all) − o(all \\ i)`` (MoI's
``loo`` design): ``u_i < 0`` means the outcome (the question's likelihood, the answer's) is higher
*without* passage ``i``, i.e. the passage distracts. Reordering alone does not remove such a
passage from the prompt (Cuconasu et al., "Do RAG Systems Suffer From Positional Bias?", arXiv
2505.15561, find a highly distracting passage in the top 10 for most queries), so ``prune``
selects instead of reordering:

    S = the first K passages of the ranking with u_i ≥ 0,

fewer than ``K`` when fewer help. When no candidate helps (``u_i < 0`` for all ``i``) the prompt
still gets the single best-ranked passage (a prompt is never empty: an empty context would turn
the question into closed-book answering, a different system) and the result carries
``abstain=True``, the signal an application can act on (answer "I don't know", retrieve again,
or show the passages without an answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PruneResult", "prune"]


@dataclass(frozen=True)
class PruneResult:
    """The passages ``prune`` keeps for one query.

    Attributes
    ----------
    selected
        Indices of the kept passages, in ranking order (the prompt order).
    abstain
        ``True`` when no candidate has ``u_i ≥ 0`` (then ``selected`` is the top-ranked passage alone).
    harmful
        Indices of the candidates with ``u_i < 0``, in ranking order.
    harmful_share
        ``len(harmful) / N``: the share of candidates leave-one-out calls harmful.
    """

    selected: tuple[int, ...]
    abstain: bool
    harmful: tuple[int, ...]
    harmful_share: float


def prune(ranking: Sequence[int], utilities: Sequence[float] | np.ndarray, k: int) -> PruneResult:
    """Top ``k`` of ``ranking`` among the passages with ``utilities[i] >= 0`` (module docstring).

    Parameters
    ----------
    ranking
        Passage indices, best first (a permutation of ``0..N-1``).
    utilities
        Signed leave-one-out utility of each passage, in input order (``N`` values; NaN counts as
        harmful, never as helpful).
    k
        At most this many passages are kept.

    Returns
    -------
    PruneResult
        The kept passages, the abstain signal and the harmful share.
    """
    u = np.asarray(utilities, dtype=np.float64).reshape(-1)
    rk = [int(i) for i in ranking]
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if sorted(rk) != list(range(u.shape[0])):
        raise ValueError(f"the ranking must list each of the {u.shape[0]} passages once, got {rk}")
    if not rk:
        raise ValueError("no passages to prune; pass at least one")
    helps = [i for i in rk if u[i] >= 0]  # NaN >= 0 is False: an undefined utility never helps
    harmful = tuple(i for i in rk if not u[i] >= 0)
    if helps:
        return PruneResult(tuple(helps[:k]), False, harmful, len(harmful) / len(rk))
    return PruneResult((rk[0],), True, harmful, 1.0)
