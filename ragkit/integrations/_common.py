"""What every framework adapter does: rerank a framework's documents, cut to ``top_n``, place them."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from typing import Any

from ragkit.debias.placement import check_placement, place
from ragkit.types import Passage, RankedList

__all__ = ["DocumentReranker", "require"]

logger = logging.getLogger(__name__)


def require(module: str, adapter: str, extra: str, package: str) -> Any:
    """Import an adapter's framework ``module``; a missing one raises an ``ImportError`` naming the install.

    Parameters
    ----------
    module
        The module to import (``"haystack"``).
    adapter
        The ragkit module that needs it (named in the error).
    extra, package
        The ragkit extra and the PyPI package that provide it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{adapter} needs {package}; install it with `pip install 'ragkit[{extra}]'` or `pip install {package}`"
        ) from e


class DocumentReranker:
    """A ragkit reranker with an adapter's options: reranks texts, keeps the ``top_n`` best, places them.

    The reranker sees the retriever ``scores`` (its prior, e.g. MoI's ridge prior) when every
    document has one. The ``top_n`` best are kept and laid out by ``placement``
    (:func:`ragkit.debias.placement.place`): ``"none"`` best first, ``"reverse"``, ``"both_ends"``
    ("lost in the middle", Liu et al., TACL 2024) or ``"bias_aware"`` (best passage into the
    slot the generator weights most; ``profile`` default: the MoI reranker's own calibrated
    profile, else the recency profile).

    Parameters
    ----------
    reranker
        Any ragkit reranker (``rank(query, passages, scores)``, optionally ``arank``).
    top_n
        Keep the ``top_n`` best documents (``None``: all).
    placement
        ``"none"``, ``"reverse"``, ``"both_ends"`` or ``"bias_aware"`` (stored canonical).
    profile
        A :class:`~ragkit.debias.profile.PositionProfile` for ``bias_aware``.
    """

    def __init__(self, reranker: Any, top_n: int | None = None, placement: str = "none",
                 profile: Any = None) -> None:
        if not callable(getattr(reranker, "rank", None)):
            raise TypeError(f"{type(reranker).__name__} is not a ragkit reranker (no rank(query, passages)); "
                            "pass e.g. ragkit.debias.get_reranker('student:DIR')")
        if top_n is not None and (not isinstance(top_n, int) or top_n < 1):
            raise ValueError(f"top_n must be an integer >= 1 or None, got {top_n!r}")
        self.reranker = reranker
        self.top_n = top_n
        self.placement = check_placement(placement)
        self.profile = profile

    @staticmethod
    def _inputs(texts: Sequence[str], titles: Sequence[str] | None,
                scores: Sequence[float | None] | None) -> tuple[list[Passage], list[float] | None]:
        """The reranker's passages (id: input index) and prior (only when every document has a score)."""
        passages = [Passage(id=str(i), text=t, title=(titles[i] if titles else "") or "") for i, t in enumerate(texts)]
        if scores is None or any(s is None for s in scores):
            return passages, None
        return passages, [float(s) for s in scores]  # type: ignore[arg-type]

    def _arrange(self, ranked: RankedList) -> list[tuple[int, float]]:
        hits = list(ranked)[:self.top_n] if self.top_n else list(ranked)
        if self.placement != "none" and len(hits) > 1:
            profile = self.profile
            if self.placement == "bias_aware" and profile is None:
                if callable(getattr(self.reranker, "profile_for", None)):
                    profile = self.reranker.profile_for(len(hits))  # MoI's calibrated profile of its generator
                else:
                    from ragkit.debias.profile import PositionProfile

                    profile = PositionProfile.recency(len(hits))
                    logger.info("bias_aware placement without a profile: using the recency profile "
                                "(pass profile=PositionProfile.load(FILE) from `ragkit bias-profile`)")
            order = place(list(range(len(hits))), self.placement, profile)
            hits = [hits[j] for j in order]
        return [(int(h.passage.id), float(h.score)) for h in hits]

    def rerank(self, query: str, texts: Sequence[str], titles: Sequence[str] | None = None,
               scores: Sequence[float | None] | None = None) -> list[tuple[int, float]]:
        """Rerank ``texts`` for ``query``; ``(input index, reranker score)`` in output order."""
        if not texts:
            return []
        return self._arrange(self.reranker.rank(query, *self._inputs(texts, titles, scores)))

    async def arerank(self, query: str, texts: Sequence[str], titles: Sequence[str] | None = None,
                      scores: Sequence[float | None] | None = None) -> list[tuple[int, float]]:
        """:meth:`rerank` through the reranker's ``arank`` (else its ``rank`` off the event loop)."""
        if not texts:
            return []
        if callable(getattr(self.reranker, "arank", None)):
            ranked = await self.reranker.arank(query, *self._inputs(texts, titles, scores))
        else:
            import asyncio

            ranked = await asyncio.to_thread(self.reranker.rank, query, *self._inputs(texts, titles, scores))
        return self._arrange(ranked)
