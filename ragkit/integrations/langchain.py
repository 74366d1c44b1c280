"""LangChain adapters (optional extra ``langchain``: needs ``langchain-core``).

:func:`as_compressor` turns any :class:`ragkit.reranking.Reranker` (``MoIReranker``, the
distilled student, ...) into a LangChain ``BaseDocumentCompressor``; :func:`as_retriever` turns a
ragkit :class:`~ragkit.retrievers.Retriever` into a LangChain ``BaseRetriever``, optionally
followed by a compressor, so ``retriever.invoke(question)`` retrieves and reranks.

>>> from ragkit.langchain import as_compressor, as_retriever         # doctest: +SKIP
>>> chain = as_retriever(bm25, k=10, compressor=as_compressor(MoIReranker(gen), top_n=3))  # doctest: +SKIP
>>> chain.invoke("Who wrote Hamlet?")                                # doctest: +SKIP

``langchain_core`` is imported lazily, so importing ragkit never requires it.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from ragkit.types import Passage

__all__ = ["as_compressor", "as_retriever", "document_to_passage", "passage_to_document"]


def _lc() -> Any:
    try:
        import langchain_core  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "ragkit.langchain needs langchain-core; install it with `pip install 'ragkit[langchain]'` "
            "or `pip install langchain-core`"
        ) from e
    return langchain_core


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
def _compressor_cls() -> type:
    _lc()
    from langchain_core.documents import BaseDocumentCompressor, Document
    from pydantic import ConfigDict

    class RagkitCompressor(BaseDocumentCompressor):
        """Rerank LangChain documents with a ragkit ``Reranker``; keep the ``top_n`` best."""

        model_config = ConfigDict(arbitrary_types_allowed=True)
        reranker: Any
        top_n: int | None = None
        score_key: str = "rerank_score"

        def compress_documents(self, documents: Sequence[Document], query: str,
                               callbacks: Any = None) -> Sequence[Document]:
            docs = list(documents)
            if not docs:
                return []
            passages = [Passage(id=str(i), text=d.page_content,
                                title=str((d.metadata or {}).get("title") or "")) for i, d in enumerate(docs)]
            ranked = self.reranker.rank(query, passages)
            hits = list(ranked)[: self.top_n] if self.top_n else list(ranked)
            out = []
            for h in hits:
                d = docs[int(h.passage.id)]
                out.append(Document(page_content=d.page_content, id=getattr(d, "id", None),
                                    metadata={**dict(d.metadata or {}), self.score_key: float(h.score)}))
            return out

    return RagkitCompressor


@cache
def _retriever_cls() -> type:
    _lc()
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict

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

    return RagkitRetriever


def as_compressor(reranker: Any, top_n: int | None = None, score_key: str = "rerank_score") -> Any:
    """Wrap a ragkit ``Reranker`` as a LangChain ``BaseDocumentCompressor``.

    The documents come back best first (at most ``top_n``), each with its reranker score in
    ``metadata[score_key]``.
    """
    if top_n is not None and top_n < 1:
        raise ValueError(f"top_n must be >= 1 or None, got {top_n}")
    return _compressor_cls()(reranker=reranker, top_n=top_n, score_key=score_key)


def as_retriever(retriever: Any, k: int = 10, compressor: Any = None) -> Any:
    """Wrap a ragkit ``Retriever`` (``search(queries, k)``) as a LangChain ``BaseRetriever``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _retriever_cls()(retriever=retriever, k=k, compressor=compressor)
