"""The LangChain adapter with the real langchain-core in a real retrieval chain."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is not installed: pip install 'ragkit[langchain]'")

from langchain_core.documents import BaseDocumentCompressor, Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402

from ragkit.debias.placement import both_ends_order  # noqa: E402
from ragkit.debias.profile import PositionProfile  # noqa: E402
from ragkit.integrations.langchain import as_compressor, as_retriever, document_to_passage  # noqa: E402
from ragkit.reranking import Reranker  # noqa: E402
from ragkit.retrievers import BM25Retriever  # noqa: E402
from ragkit.types import Passage, RankedList  # noqa: E402

Q = "who wrote Hamlet Shakespeare"


class LengthReranker(Reranker):
    """A real (if silly) reranker: shorter passages first."""

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        return [RankedList.from_scores(ps, [-float(len(p.text)) for p in ps], q) for q, ps in zip(queries, passages)]


def test_compressor_reranks_documents(corpus) -> None:
    comp = as_compressor(LengthReranker(), top_n=2)
    assert isinstance(comp, BaseDocumentCompressor)
    docs = [Document(page_content=p.text, metadata={"id": p.id}) for p in corpus[:4]]
    out = comp.compress_documents(docs, "who wrote hamlet?")
    assert [d.metadata["id"] for d in out] == ["b", "c"]
    assert out[0].metadata["rerank_score"] > out[1].metadata["rerank_score"]
    assert comp.compress_documents([], "q") == []
    assert [d.metadata["id"] for d in asyncio.run(comp.acompress_documents(docs, "q"))] == ["b", "c"]
    with pytest.raises(ValueError, match="top_n"):
        as_compressor(LengthReranker(), top_n=0)
    with pytest.raises(ValueError, match="placement"):
        as_compressor(LengthReranker(), placement="middle")
    assert document_to_passage(docs[0], 0).id == "a"


def test_retrieval_chain_with_bm25_and_reranker(corpus) -> None:
    bm25 = BM25Retriever().index(corpus)
    plain = as_retriever(bm25, k=3)
    assert isinstance(plain, BaseRetriever)
    got = plain.invoke(Q)
    assert len(got) == 3 and "retriever_score" in got[0].metadata
    chain = as_retriever(bm25, k=3, compressor=as_compressor(LengthReranker(), top_n=2)) | RunnableLambda(
        lambda docs: "\n".join(d.page_content for d in docs))
    text = chain.invoke(Q)
    assert text.splitlines()[0] == "Shakespeare wrote Hamlet."
    assert len(text.splitlines()) == 2


def test_retriever_scores_reach_the_reranker(recording, corpus) -> None:  # the prior was dropped before (zero prior)
    bm25 = BM25Retriever().index(corpus)
    plain = as_retriever(bm25, k=4).invoke(Q)
    docs = as_retriever(bm25, k=4, compressor=as_compressor(recording)).invoke(Q)
    assert recording.seen_scores == [[d.metadata["retriever_score"] for d in plain]]
    assert all(s > 0 for s in recording.seen_scores[0])
    expected = recording.inner.rank(Q, [Passage(str(i), d.page_content, d.metadata.get("title", ""))
                                        for i, d in enumerate(plain)])
    assert [d.page_content for d in docs] == [h.passage.text for h in expected]


def test_placements(tiny_student, corpus) -> None:
    bm25 = BM25Retriever().index(corpus)
    plain = as_retriever(bm25, k=5).invoke(Q)
    best = as_retriever(bm25, k=5, compressor=as_compressor(tiny_student, top_n=4)).invoke(Q)
    ends = as_retriever(bm25, k=5, compressor=as_compressor(tiny_student, top_n=4, placement="both_ends")).invoke(Q)
    assert [d.page_content for d in ends] == [best[j].page_content for j in both_ends_order(range(4))]
    assert ends[0].page_content == best[0].page_content and ends[-1].page_content == best[1].page_content
    prof = PositionProfile.recency(4)  # the last slot weighs most: best passage last, next to the question
    aware = as_retriever(bm25, k=5, compressor=as_compressor(tiny_student, top_n=4, placement="bias_aware",
                                                             profile=prof)).invoke(Q)
    assert aware[-1].page_content == best[0].page_content
    assert sorted(d.page_content for d in aware) == sorted(d.page_content for d in best)
    assert len(plain) == 4  # every passage but Paris's has a query word; BM25 returns only those


def test_moi_reranker_in_chain(tiny_lm_dir, corpus) -> None:
    from ragkit.debias import MoIReranker
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), max_length=1024, show_progress=False)
    rr = MoIReranker(gen, design="prior", budget=2, max_new_tokens=2)
    chain = as_retriever(BM25Retriever().index(corpus), k=3,
                         compressor=as_compressor(rr, placement="bias_aware"))
    docs = chain.invoke(Q)
    plain = as_retriever(BM25Retriever().index(corpus), k=3).invoke(Q)
    assert sorted(d.metadata["id"] for d in docs) == sorted(d.metadata["id"] for d in plain)
    assert all("rerank_score" in d.metadata for d in docs)
