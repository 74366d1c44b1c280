"""LangChain adapters (optional extra ``langchain``: needs ``langchain-core``).

:func:`as_compressor` turns any :class:`ragkit.reranking.Reranker` (``MoIReranker``, the
distilled student, a cross-encoder, ...) into a LangChain ``BaseDocumentCompressor``;
:func:`as_retriever` turns a ragkit :class:`~ragkit.retrievers.Retriever` into a LangChain
``BaseRetriever``, optionally followed by a compressor, so ``retriever.invoke(question)``
retrieves and reranks. The compressor hands the retriever's scores (``metadata["retriever_score"]``,
set by :func:`as_retriever`) to the reranker as its prior, and lays the kept documents out best
first or in a bias-aware prompt order (``placement``).

>>> from ragkit.integrations.langchain import as_compressor, as_retriever     # doctest: +SKIP
>>> comp = as_compressor(MoIReranker(gen), top_n=3, placement="bias_aware")  # doctest: +SKIP
>>> as_retriever(bm25, k=10, compressor=comp).invoke("Who wrote Hamlet?")     # doctest: +SKIP

``langchain_core`` is imported lazily, so importing ragkit never requires it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from ragkit.integrations._common import DocumentReranker, require
from ragkit.types import Passage

__all__ = ["as_compressor", "as_retriever", "document_to_passage", "passage_to_document"]


def _lc() -> Any:
    return require("langchain_core", "ragkit.integrations.langchain", "langchain", "langchain-core")


def document_to_passage(doc: Any, i: int) -> Passage:
    """A LangChain ``Document`` as a :class:`Passage` (id: ``metadata['id']``, else ``doc.id``, else ``i``)."""
    md = dict(doc.metadata or {})
    pid = md.get("id") or getattr(doc, "id", None) or str(i)
    return Passage(id=str(pid), text=doc.page_content, title=str(md.get("title") or ""), metadata=md)


def passage_to_document(p: Passage, **extra: Any) -> Any:
    """A :class:`Passage` as a LangChain ``Document`` (``metadata`` gets ``id``, ``title`` and ``extra``)."""
    _lc()
    from langchain_core.documents import Document

    md = {**dict(p.metadata), "id": p.id, **({"title": p.title} if p.title else {}), **extra}
    return Document(page_content=p.text, metadata=md)


@cache
def _classes() -> tuple[type, type]:
    """``(RagkitCompressor, RagkitRetriever)``, defined on first use (LangChain is imported then)."""
    _lc()
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import BaseDocumentCompressor, Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict

    class RagkitCompressor(BaseDocumentCompressor):
        """Rerank LangChain documents with a ragkit reranker; keep the ``top_n`` best, placed."""

        model_config = ConfigDict(arbitrary_types_allowed=True)
        reranker: Any
        top_n: int | None = None
        score_key: str = "rerank_score"
        prior_key: str = "retriever_score"
        placement: str = "none"
        profile: Any = None

        def _core(self) -> DocumentReranker:
            return DocumentReranker(self.reranker, self.top_n, self.placement, self.profile)

        def _inputs(self, docs: list[Document]) -> tuple[list[str], list[str], list[Any]]:
            mds = [d.metadata or {} for d in docs]
            return ([d.page_content for d in docs], [str(m.get("title") or "") for m in mds],
                    [m.get(self.prior_key) for m in mds])

        def _out(self, docs: list[Document], picked: list[tuple[int, float]]) -> list[Document]:
            return [Document(page_content=docs[i].page_content, id=getattr(docs[i], "id", None),
                             metadata={**dict(docs[i].metadata or {}), self.score_key: s}) for i, s in picked]

        def compress_documents(self, documents: Sequence[Document], query: str,
                               callbacks: Any = None) -> Sequence[Document]:
            docs = list(documents)
            return self._out(docs, self._core().rerank(query, *self._inputs(docs)))

        async def acompress_documents(self, documents: Sequence[Document], query: str,
                                      callbacks: Any = None) -> Sequence[Document]:
            docs = list(documents)
            return self._out(docs, await self._core().arerank(query, *self._inputs(docs)))

    class RagkitRetriever(BaseRetriever):
        """A ragkit retriever as a LangChain retriever, optionally followed by a document compressor."""

        model_config = ConfigDict(arbitrary_types_allowed=True)
        retriever: Any
        k: int = 10
        compressor: Any = None

        def _get_relevant_documents(self, query: str, *,
                                    run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
            (ranked,) = self.retriever.search([query], k=self.k)
            docs = [passage_to_document(h.passage, retriever_score=float(h.score)) for h in ranked]
            if self.compressor is not None:
                docs = list(self.compressor.compress_documents(docs, query))
            return docs

    return RagkitCompressor, RagkitRetriever


def as_compressor(
    reranker: Any,
    top_n: int | None = None,
    score_key: str = "rerank_score",
    placement: str = "none",
    profile: Any = None,
    prior_key: str = "retriever_score",
) -> Any:
    """Wrap a ragkit reranker as a LangChain ``BaseDocumentCompressor``.

    Parameters
    ----------
    reranker
        Any ragkit reranker (``rank(query, passages, scores)``).
    top_n
        Keep the ``top_n`` best documents (``None``: all).
    score_key
        Metadata key that receives each document's reranker score.
    placement
        Order of the kept documents: ``"none"`` (best first), ``"reverse"``, ``"both_ends"``
        ("lost in the middle") or ``"bias_aware"`` (the generator's calibrated position profile:
        ``profile``, else the MoI reranker's own, else the recency profile).
    profile
        A :class:`~ragkit.debias.profile.PositionProfile` for ``bias_aware``.
    prior_key
        Metadata key holding the retriever's score; passed to the reranker as its prior when
        every document has it (:func:`as_retriever` sets ``retriever_score``).
    """
    placement = DocumentReranker(reranker, top_n, placement, profile).placement  # checks the options
    return _classes()[0](reranker=reranker, top_n=top_n, score_key=score_key, placement=placement,
                         profile=profile, prior_key=prior_key)


def as_retriever(retriever: Any, k: int = 10, compressor: Any = None) -> Any:
    """Wrap a ragkit ``Retriever`` (``search(queries, k)``) as a LangChain ``BaseRetriever``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _classes()[1](retriever=retriever, k=k, compressor=compressor)
