"""The LangChain adapter with the real langchain-core in a real retrieval chain."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import BaseDocumentCompressor, Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402

from ragkit.langchain import as_compressor, as_retriever, document_to_passage  # noqa: E402
from ragkit.reranking import Reranker  # noqa: E402
from ragkit.retrievers import BM25Retriever  # noqa: E402
from ragkit.types import Passage, RankedList  # noqa: E402


class LengthReranker(Reranker):
    """A real (if silly) reranker: shorter passages first."""

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        return [RankedList.from_scores(ps, [-float(len(p.text)) for p in ps], q) for q, ps in zip(queries, passages)]


CORPUS = [
    Passage("a", "Hamlet is a tragedy written by William Shakespeare around 1600, set in Denmark.", "Hamlet"),
    Passage("b", "Shakespeare wrote Hamlet.", "Short"),
    Passage("c", "Paris is the capital of France.", "Paris"),
    Passage("d", "William Shakespeare was an English playwright, poet and actor born in Stratford.", "WS"),
]


def test_compressor_reranks_documents() -> None:
    comp = as_compressor(LengthReranker(), top_n=2)
    assert isinstance(comp, BaseDocumentCompressor)
    docs = [Document(page_content=p.text, metadata={"id": p.id}) for p in CORPUS]
    out = comp.compress_documents(docs, "who wrote hamlet?")
    assert [d.metadata["id"] for d in out] == ["b", "c"]
    assert out[0].metadata["rerank_score"] > out[1].metadata["rerank_score"]
    assert comp.compress_documents([], "q") == []
    with pytest.raises(ValueError, match="top_n"):
        as_compressor(LengthReranker(), top_n=0)
    assert document_to_passage(docs[0], 0).id == "a"


def test_retrieval_chain_with_bm25_and_reranker() -> None:
    bm25 = BM25Retriever().index(CORPUS)
    plain = as_retriever(bm25, k=3)
    assert isinstance(plain, BaseRetriever)
    got = plain.invoke("who wrote Hamlet Shakespeare")
    assert len(got) == 3 and "retriever_score" in got[0].metadata
    chain = as_retriever(bm25, k=3, compressor=as_compressor(LengthReranker(), top_n=2)) | RunnableLambda(
        lambda docs: "\n".join(d.page_content for d in docs))
    text = chain.invoke("who wrote Hamlet Shakespeare")
    assert text.splitlines()[0] == "Shakespeare wrote Hamlet."
    assert len(text.splitlines()) == 2


def test_moi_reranker_in_chain(tiny_lm_dir) -> None:
    from ragkit.debias import MoIReranker
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), max_length=1024, show_progress=False)
    chain = as_retriever(BM25Retriever().index(CORPUS), k=3,
                         compressor=as_compressor(MoIReranker(gen, design="prior", budget=2, max_new_tokens=2)))
    docs = chain.invoke("who wrote Hamlet Shakespeare")
    plain = as_retriever(BM25Retriever().index(CORPUS), k=3).invoke("who wrote Hamlet Shakespeare")
    assert sorted(d.metadata["id"] for d in docs) == sorted(d.metadata["id"] for d in plain)
    assert all("rerank_score" in d.metadata for d in docs)
