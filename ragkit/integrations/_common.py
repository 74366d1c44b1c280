"""What every framework adapter does: rerank a framework's documents, cut to ``top_n``, place them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ragkit.debias.placement import check_placement, place
from ragkit.types import Passage, RankedList

__all__ = ["arerank_documents", "check_options", "rerank_documents"]

logger = logging.getLogger(__name__)


def check_options(reranker: Any, top_n: int | None, placement: str) -> str:
    """Validate the adapter options; returns the canonical placement name."""
    if not callable(getattr(reranker, "rank", None)):
        raise TypeError(f"{type(reranker).__name__} is not a ragkit reranker (no rank(query, passages)); "
                        "pass e.g. ragkit.debias.get_reranker('student:DIR')")
    if top_n is not None and (not isinstance(top_n, int) or top_n < 1):
        raise ValueError(f"top_n must be an integer >= 1 or None, got {top_n!r}")
    return check_placement(placement)


def _passages(texts: Sequence[str], titles: Sequence[str] | None) -> list[Passage]:
    return [Passage(id=str(i), text=t, title=(titles[i] if titles else "") or "") for i, t in enumerate(texts)]


def _scores(scores: Sequence[float | None] | None) -> list[float] | None:
    """Retriever scores as the reranker's prior, only when every document has one."""
    if scores is None or any(s is None for s in scores):
        return None
    return [float(s) for s in scores]  # type: ignore[arg-type]


def _arrange(reranker: Any, ranked: RankedList, top_n: int | None, placement: str,
             profile: Any) -> list[tuple[int, float]]:
    hits = list(ranked)[:top_n] if top_n else list(ranked)
    if placement != "none" and len(hits) > 1:
        if placement == "bias_aware" and profile is None:
            if callable(getattr(reranker, "profile_for", None)):
                profile = reranker.profile_for(len(hits))  # MoI's calibrated profile of its generator
            else:
                from ragkit.debias.profile import PositionProfile

                profile = PositionProfile.recency(len(hits))
                logger.info("bias_aware placement without a profile: using the recency profile "
                            "(pass profile=PositionProfile.load(FILE) from `ragkit bias-profile`)")
        order = place(list(range(len(hits))), placement, profile)
        hits = [hits[j] for j in order]
    return [(int(h.passage.id), float(h.score)) for h in hits]


def rerank_documents(
    reranker: Any,
    query: str,
    texts: Sequence[str],
    *,
    titles: Sequence[str] | None = None,
    scores: Sequence[float | None] | None = None,
    top_n: int | None = None,
    placement: str = "none",
    profile: Any = None,
) -> list[tuple[int, float]]:
    """Rerank ``texts`` for ``query``; ``(input index, reranker score)`` in output order.

    The reranker sees the retriever ``scores`` (its prior, e.g. MoI's ridge prior) when every
    document has one. The ``top_n`` best are kept and laid out by ``placement``
    (:func:`ragkit.debias.placement.place`): ``"none"`` best first, ``"reverse"``, ``"both_ends"``
    ("lost in the middle", Liu et al., TACL 2024) or ``"bias_aware"`` (best passage into the
    slot the generator weights most; ``profile`` default: the MoI reranker's own calibrated
    profile, else the recency profile).
    """
    if not texts:
        return []
    ranked = reranker.rank(query, _passages(texts, titles), _scores(scores))
    return _arrange(reranker, ranked, top_n, placement, profile)


async def arerank_documents(
    reranker: Any,
    query: str,
    texts: Sequence[str],
    *,
    titles: Sequence[str] | None = None,
    scores: Sequence[float | None] | None = None,
    top_n: int | None = None,
    placement: str = "none",
    profile: Any = None,
) -> list[tuple[int, float]]:
    """:func:`rerank_documents` through the reranker's ``arank`` (off the event loop)."""
    if not texts:
        return []
    if callable(getattr(reranker, "arank", None)):
        ranked = await reranker.arank(query, _passages(texts, titles), _scores(scores))
    else:
        import asyncio

        ranked = await asyncio.to_thread(reranker.rank, query, _passages(texts, titles), _scores(scores))
    return _arrange(reranker, ranked, top_n, placement, profile)
