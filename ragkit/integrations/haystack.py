"""A Haystack 2 ranker component for any ragkit reranker (optional extra ``haystack``).

>>> from ragkit.integrations.haystack import RagkitRanker                  # doctest: +SKIP
>>> pipe.add_component("ranker", RagkitRanker(get_reranker("student:DIR"), top_k=3))  # doctest: +SKIP
>>> pipe.connect("retriever.documents", "ranker.documents")               # doctest: +SKIP

``run(query, documents, top_k=None)`` returns ``{"documents": [...]}``: copies of the input
documents with ``score`` set to the reranker's score, best first or in the chosen ``placement``.
The retriever's scores (``Document.score``) are the reranker's prior.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ragkit.integrations._common import DocumentReranker, require

require("haystack", "ragkit.integrations.haystack", "haystack", "haystack-ai")
from haystack import Document, component  # noqa: E402

__all__ = ["RagkitRanker"]


@component
class RagkitRanker:
    """Rerank Haystack documents with a ragkit reranker (MoI, the distilled student, a cross-encoder).

    Parameters
    ----------
    reranker
        Any ragkit reranker (``rank(query, passages, scores)``).
    top_k
        Keep the ``top_k`` best documents (``None``: all); ``run(top_k=...)`` overrides it.
    placement
        ``"none"`` (best first), ``"reverse"``, ``"both_ends"`` or ``"bias_aware"``.
    profile
        Position profile for ``bias_aware``.
    use_retriever_scores
        Pass ``Document.score`` to the reranker as its prior (when every document has one).
    title_field
        ``meta`` key holding a document title shown to the reranker (``None``: none).
    """

    def __init__(self, reranker: Any, top_k: int | None = None, placement: str = "none", profile: Any = None,
                 use_retriever_scores: bool = True, title_field: str | None = "title") -> None:
        self.placement = DocumentReranker(reranker, top_k, placement, profile).placement  # checks the options
        self.reranker = reranker
        self.top_k = top_k
        self.profile = profile
        self.use_retriever_scores = use_retriever_scores
        self.title_field = title_field

    def _core(self, top_k: int | None) -> DocumentReranker:
        return DocumentReranker(self.reranker, top_k if top_k is not None else self.top_k, self.placement,
                                self.profile)

    def _inputs(self, documents: list[Document]) -> tuple[list[str], list[str], list[Any] | None]:
        missing = [i for i, d in enumerate(documents) if not isinstance(d.content, str)]
        if missing:
            raise ValueError(f"documents {missing[:5]} have no text content; RagkitRanker reranks text documents")
        return ([d.content for d in documents],
                [str((d.meta or {}).get(self.title_field) or "") if self.title_field else "" for d in documents],
                [d.score for d in documents] if self.use_retriever_scores else None)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        """Rerank ``documents`` for ``query``."""
        docs = list(documents)
        picked = self._core(top_k).rerank(query, *self._inputs(docs))
        return {"documents": [dataclasses.replace(docs[i], score=s) for i, s in picked]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, documents: list[Document],
                        top_k: int | None = None) -> dict[str, list[Document]]:
        """:meth:`run` through the reranker's ``arank`` (for Haystack's ``AsyncPipeline``)."""
        docs = list(documents)
        picked = await self._core(top_k).arerank(query, *self._inputs(docs))
        return {"documents": [dataclasses.replace(docs[i], score=s) for i, s in picked]}
