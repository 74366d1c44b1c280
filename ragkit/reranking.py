"""The reranker interface shared by MoI, the distilled student and any other reranker.

Modelled on AnswerDotAI's ``rerankers``: one tiny base class whose ``rank(query, passages)``
returns a :class:`~ragkit.types.RankedList` (with ``top_k()``); ``rank_many`` is the batched
form that subclasses implement.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ragkit.types import Passage, Query, RankedList, as_passages, as_query

__all__ = ["Reranker"]

PassageLike = Passage | str | Mapping[str, Any]


class Reranker(ABC):
    """Base class: implement :meth:`_rank_many` on validated inputs."""

    def rank(
        self,
        query: Query | str,
        passages: Sequence[PassageLike],
        scores: Sequence[float] | None = None,
    ) -> RankedList:
        """Rerank ``passages`` (given in retriever order, best first) for one query.

        Parameters
        ----------
        query
            The question.
        passages
            Candidate passages in retriever order.
        scores
            Optional retriever scores, aligned with ``passages`` (used as a prior by some
            rerankers).
        """
        return self.rank_many([query], [passages], None if scores is None else [scores])[0]

    def rank_many(
        self,
        queries: Sequence[Query | str],
        passages: Sequence[Sequence[PassageLike]],
        scores: Sequence[Sequence[float] | None] | None = None,
    ) -> list[RankedList]:
        """Rerank several queries' candidates in batched model calls."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        if scores is not None and len(scores) != len(queries):
            raise ValueError(f"{len(queries)} queries but {len(scores)} score lists")
        qs = [as_query(q) for q in queries]
        ps = [as_passages(p) for p in passages]
        for q, p in zip(qs, ps):
            if not p:
                raise ValueError(f"no passages to rerank for query {q.text!r}; pass at least one")
        sc = [None] * len(qs) if scores is None else [None if s is None else list(map(float, s)) for s in scores]
        for p, s in zip(ps, sc):
            if s is not None and len(s) != len(p):
                raise ValueError(f"{len(p)} passages but {len(s)} scores")
        return self._rank_many(qs, ps, sc)

    @abstractmethod
    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        """Rank validated inputs; one ``RankedList`` per query."""
