"""Baselines beside Mixture-of-Intervention: retriever-order and chance-level rerankers, answer
voting, permutation self-consistency.

- :class:`IdentityReranker`: the retriever order as the ranking (scores: the retriever's, else
  ``k - i``).
- :class:`RandomReranker`: a uniformly random permutation per query (chance level), seeded by
  ``(seed, query, passage ids)`` so a query gets the same order however queries are batched.
- :func:`vote`: answer voting over orderings: the majority of normalised answers (ties: the
  answer seen first, i.e. from the earliest ordering; the retriever order comes first in every
  design). Lee et al. (arXiv 2412.10684) report it as the strongest simple alternative to MoI.
- Permutation self-consistency (Tang et al., "Found in the Middle: Permutation Self-Consistency
  Improves Listwise Ranking in Large Language Models", NAACL 2024): rank under each of several
  orderings, then aggregate the rankings with Borda count, ``B(p) = Σ_m (k − 1 − r_m(p))``, or
  reciprocal rank fusion, ``RRF(p) = Σ_m 1 / (c + r_m(p) + 1)`` (Cormack et al., SIGIR 2009).

Placements (reverse, both ends, bias-aware) live in :mod:`ragkit.debias.placement`; the answerers
that use :func:`vote` and the aggregations live in :mod:`ragkit.debias.answerers`.

Choice for the per-ordering ranking (a small generator cannot produce reliable listwise
rankings, and passage-level attributions are not available from one ordering): each
ordering's greedy answer ranks the passages by answer support, the fraction of the answer's
normalised tokens that occur in the passage (title + text), ties broken by the passage's slot
in that ordering (earlier first, the order the model read them). The rankings therefore change
with the ordering exactly as the answers do; with a cyclic design the slot tie-break averages
out and the final ties fall back to the retriever order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from ragkit.debias.designs import slots_of
from ragkit.debias.outcomes import majority_answer
from ragkit.reranking import Reranker
from ragkit.text import normalize_answer
from ragkit.types import Hit, Passage, Query, RankedList

__all__ = [
    "IdentityReranker",
    "RandomReranker",
    "vote",
    "answer_support",
    "per_ordering_rankings",
    "borda",
    "rrf",
]


class IdentityReranker(Reranker):
    """The retriever order as the ranking: no model, no cost.

    Scores are the retriever's when given (then the input order must already be best first),
    otherwise ``k - i``; the ranking is always the input order.
    """

    name = "none"

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        out = []
        for q, ps, sc in zip(queries, passages, scores):
            k = len(ps)
            s = [float(k - i) for i in range(k)] if sc is None else sc
            out.append(RankedList(tuple(Hit(p, float(x), i) for i, (p, x) in enumerate(zip(ps, s))), q))
        return out


class RandomReranker(Reranker):
    """A uniformly random ranking per query (the chance-level baseline).

    The permutation of query ``q`` over passages ``p_1..p_k`` is drawn from
    ``numpy.random.default_rng([seed, h])`` with ``h`` a SHA-256 digest of the query text and the
    passage ids, so it does not depend on batching or on the other queries. Scores: ``k - rank``.

    Parameters
    ----------
    seed
        Seed of the permutations.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def permutation(self, query: str, passages: Sequence[Passage]) -> list[int]:
        """The random ranking (passage indices, best first) of one query."""
        key = "\x1f".join([query, *(p.id for p in passages)]).encode("utf-8")
        h = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
        return np.random.default_rng([self.seed, h]).permutation(len(passages)).tolist()

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        out = []
        for q, ps in zip(queries, passages):
            k = len(ps)
            perm = self.permutation(q.text, ps)
            out.append(RankedList(tuple(Hit(ps[i], float(k - r), r) for r, i in enumerate(perm)), q))
        return out


def vote(answers: Sequence[str]) -> str:
    """Majority answer over normalised forms (ties: first seen); ``""`` when all are empty."""
    tied, _ = majority_answer(answers)
    return tied[0] if tied else ""


def answer_support(answer: str, passages: Sequence[Passage]) -> np.ndarray:
    """Fraction of the answer's normalised tokens found in each passage (0 for an empty answer)."""
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
