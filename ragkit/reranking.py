"""The reranker contract shared by every reranker in ragkit.

Modelled on AnswerDotAI's ``rerankers``: one small base class whose ``rank(query, passages)``
returns a :class:`~ragkit.types.RankedList` (with ``top_k()``); ``rank_many`` is the batched form
(one model call for all queries) and ``arank`` / ``arank_many`` are their ``asyncio`` forms, so
every reranker works in a web server or an async chain without blocking the event loop.

Backends (one file each under :mod:`ragkit.debias`): ``MoIReranker``, ``DistilledReranker``,
``CrossEncoderReranker``, ``IdentityReranker`` and ``RandomReranker``; build any of them from a
string with :func:`ragkit.debias.get_reranker`. A new backend implements :meth:`Reranker._rank_many`
on validated inputs, and sets :attr:`needs_answers` when it reads reference answers.

A reranker returns everything it knows on the rankings themselves: each ``RankedList`` carries a
frozen :class:`~ragkit.types.RankInfo` (generator calls, forward passes, tokens, seconds, whether
it fell back to the input order and why, backend diagnostics). Nothing is kept on the reranker,
so concurrent calls on one reranker (``arank_many`` from several tasks) cannot read each other's
results.
"""

from __future__ import annotations

import asyncio
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ragkit.types import Passage, Query, RankedList, as_passages, as_query

__all__ = ["Reranker", "PassageLike"]

PassageLike = Passage | str | Mapping[str, Any]


class Reranker(ABC):
    """Base class: implement :meth:`_rank_many`; inputs arrive validated.

    Attributes
    ----------
    name
        Short name used in reports (``"moi"``, ``"student"``, ...).
    needs_answers
        ``True`` when the reranker reads the reference answers carried by the :class:`Query`
        (an oracle such as MoI with the ``gold`` outcome); evaluation passes the gold answers
        only to such rerankers.
    """

    name: str = "reranker"
    needs_answers: bool = False

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
            The question (a :class:`Query` may carry reference answers for oracle rerankers).
        passages
            Candidate passages in retriever order.
        scores
            Optional retriever scores, aligned with ``passages`` (used as a prior by some
            rerankers).

        Returns
        -------
        RankedList
            The passages best first; ``score`` is the reranker's own score; ``info`` its cost and
            diagnostics (:class:`~ragkit.types.RankInfo`).
        """
        return self.rank_many([query], [passages], None if scores is None else [scores])[0]

    def rank_many(
        self,
        queries: Sequence[Query | str],
        passages: Sequence[Sequence[PassageLike]],
        scores: Sequence[Sequence[float] | None] | None = None,
    ) -> list[RankedList]:
        """Rerank several queries' candidates in batched model calls (one ``RankedList`` each).

        Each list's ``info`` holds the backend's per-query diagnostics, the wall-clock ``seconds``
        of this call and ``batch_queries = len(queries)`` (the call's cost is shared by them).
        """
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
            bad = [] if s is None else [(x.id, v) for x, v in zip(p, s) if not math.isfinite(v)]
            if bad:  # a NaN would silently scramble every prior built from the scores
                raise ValueError(f"retriever score {bad[0][1]} of passage {bad[0][0]!r} is not a finite number"
                                 f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; give every passage "
                                 "a finite score, or none at all")
        t0 = time.perf_counter()
        out = self._rank_many(qs, ps, sc)
        seconds = time.perf_counter() - t0
        if len(out) != len(qs):  # a backend bug, not a user error
            raise RuntimeError(f"{type(self).__name__} returned {len(out)} rankings for {len(qs)} queries")
        return [rk.with_(info=rk.info.with_(seconds=seconds, batch_queries=len(qs))) for rk in out]

    async def arank(
        self,
        query: Query | str,
        passages: Sequence[PassageLike],
        scores: Sequence[float] | None = None,
    ) -> RankedList:
        """:meth:`rank` in a worker thread (``asyncio.to_thread``), for async applications."""
        return await asyncio.to_thread(self.rank, query, passages, scores)

    async def arank_many(
        self,
        queries: Sequence[Query | str],
        passages: Sequence[Sequence[PassageLike]],
        scores: Sequence[Sequence[float] | None] | None = None,
    ) -> list[RankedList]:
        """:meth:`rank_many` in a worker thread (``asyncio.to_thread``), for async applications."""
        return await asyncio.to_thread(self.rank_many, queries, passages, scores)

    @abstractmethod
    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        """Rank validated inputs; one ``RankedList`` per query, its ``info`` filled with what the
        backend knows (generator cost, fallback); ``seconds`` and ``batch_queries`` are set by
        :meth:`rank_many`."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
