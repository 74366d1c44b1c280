"""Baselines beside Mixture-of-Intervention: fixed reorderings, answer voting, permutation
self-consistency.

- :func:`retriever_order`, :func:`reverse_order`: the given order and its reversal (best last,
  next to the question: exploits recency bias).
- :func:`both_ends_order`: the "lost in the middle" reorder (Liu et al., TACL 2024): best first,
  second best last, third second, fourth second to last, ... so the weakest passages sit in the
  middle.
- :func:`vote`: answer voting over orderings: the majority of normalised answers (ties: the
  answer seen first, i.e. from the earliest ordering; the retriever order comes first in every
  design). Lee et al. (arXiv 2412.10684) report it as the strongest simple alternative to MoI.
- Permutation self-consistency (Tang et al., "Found in the Middle: Permutation Self-Consistency
  Improves Listwise Ranking in Large Language Models", NAACL 2024): rank under each of several
  orderings, then aggregate the rankings with Borda count, ``B(p) = Σ_m (k − 1 − r_m(p))``, or
  reciprocal rank fusion, ``RRF(p) = Σ_m 1 / (c + r_m(p) + 1)`` (Cormack et al., SIGIR 2009).

Choice for the per-ordering ranking (a small generator cannot produce reliable listwise
rankings, and passage-level attributions are not available from one ordering): each
ordering's greedy answer ranks the passages by answer support, the fraction of the answer's
normalised tokens that occur in the passage (title + text), ties broken by the passage's slot
in that ordering (earlier first, the order the model read them). The rankings therefore change
with the ordering exactly as the answers do; with a cyclic design the slot tie-break averages
out and the final ties fall back to the retriever order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragkit.debias.designs import slots_of
from ragkit.types import Passage

__all__ = [
    "retriever_order",
    "reverse_order",
    "both_ends_order",
    "vote",
    "answer_support",
    "per_ordering_rankings",
    "borda",
    "rrf",
]


def retriever_order(k: int) -> list[int]:
    """``[0, 1, ..., k-1]``."""
    return list(range(k))


def reverse_order(k: int) -> list[int]:
    """``[k-1, ..., 0]``: the best passage last, next to the question."""
    return list(range(k))[::-1]


def both_ends_order(ranking: Sequence[int]) -> list[int]:
    """Best first, second best last, third second, fourth second to last, ...

    ``ranking`` lists passage indices best first; the result is a prompt order.
    """
    k = len(ranking)
    order: list[int] = [0] * k
    lo, hi = 0, k - 1
    for r, p in enumerate(ranking):
        if r % 2 == 0:
            order[lo] = int(p)
            lo += 1
        else:
            order[hi] = int(p)
            hi -= 1
    return order


def vote(answers: Sequence[str]) -> str:
    """Majority answer over normalised forms (ties: first seen); ``""`` when all are empty."""
    from ragkit.debias.outcomes import majority_answer

    tied, _ = majority_answer(answers)
    return tied[0] if tied else ""


def answer_support(answer: str, passages: Sequence[Passage]) -> np.ndarray:
    """Fraction of the answer's normalised tokens found in each passage (0 for an empty answer)."""
    from ragkit.text import normalize_answer

    toks = normalize_answer(answer).split()
    out = np.zeros(len(passages))
    if not toks:
        return out
    for i, p in enumerate(passages):
        words = set(normalize_answer(p.contents).split())
        out[i] = sum(t in words for t in toks) / len(toks)
    return out


def per_ordering_rankings(
    answers: Sequence[str], passages: Sequence[Passage], orderings: Sequence[Sequence[int]]
) -> list[list[int]]:
    """One ranking (passage indices, best first) per ordering, from that ordering's answer.

    Passages sort by answer support (descending), ties by their slot in the ordering.
    """
    slots = slots_of(orderings)
    out = []
    for m, a in enumerate(answers):
        sup = answer_support(a, passages)
        out.append(sorted(range(len(passages)), key=lambda p: (-sup[p], slots[m, p])))
    return out


def _ranks(rankings: Sequence[Sequence[int]], k: int) -> np.ndarray:
    r = np.empty((len(rankings), k), dtype=np.int64)
    for m, rk in enumerate(rankings):
        if sorted(rk) != list(range(k)):
            raise ValueError(f"ranking {m} {list(rk)} is not a permutation of 0..{k - 1}")
        r[m, np.asarray(rk)] = np.arange(k)
    return r


def borda(rankings: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """Borda count ``B(p) = Σ_m (k − 1 − r_m(p))`` (``r_m`` 0-based rank of ``p`` in ranking ``m``)."""
    return (k - 1 - _ranks(rankings, k)).sum(axis=0).astype(np.float64)


def rrf(rankings: Sequence[Sequence[int]], k: int, c: float = 60.0) -> np.ndarray:
    """Reciprocal rank fusion ``RRF(p) = Σ_m 1 / (c + r_m(p) + 1)``."""
    return (1.0 / (c + _ranks(rankings, k) + 1.0)).sum(axis=0)
