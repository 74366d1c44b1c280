"""The LlamaIndex node postprocessor with the real llama-index-core in a retrieve -> rerank chain."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="llama-index-core is not installed: pip install 'ragkit[llamaindex]'")
bm25_mod = pytest.importorskip("llama_index.retrievers.bm25",
                               reason="llama-index-retrievers-bm25 (LlamaIndex's BM25) is not installed")

from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import NodeWithScore, TextNode  # noqa: E402

from ragkit.debias.placement import both_ends_order  # noqa: E402
from ragkit.integrations.llamaindex import RagkitNodePostprocessor  # noqa: E402
from ragkit.types import Passage  # noqa: E402

Q = "who wrote Hamlet Shakespeare"


def _retriever(corpus: list[Passage], k: int):  # LlamaIndex's own in-memory BM25 over TextNodes
    nodes = [TextNode(text=p.text, id_=p.id) for p in corpus]
    return bm25_mod.BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=k)


def test_bm25_then_ragkit_reranker(corpus, recording) -> None:
    retriever = _retriever(corpus, k=4)
    hits = retriever.retrieve(Q)
    assert len(hits) == 4 and all(h.score is not None for h in hits)
    post = RagkitNodePostprocessor(reranker=recording, top_n=3)
    assert isinstance(post, BaseNodePostprocessor)
    out = post.postprocess_nodes(hits, query_str=Q)
    # the retriever's scores are the reranker's prior; output equals the in-process ranking
    assert recording.seen_scores == [[h.score for h in hits]]
    expected = recording.inner.rank(Q, [h.node.get_content() for h in hits])
    assert [n.node.get_content() for n in out] == [h.passage.text for h in expected][:3]
    assert [n.score for n in out] == pytest.approx(expected.scores()[:3], abs=1e-5)
    again = asyncio.run(post.apostprocess_nodes(hits, query_str=Q))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in out]


def test_placement_and_errors(corpus, tiny_student) -> None:
    hits = _retriever(corpus, k=5).retrieve(Q)
    best = RagkitNodePostprocessor(reranker=tiny_student, top_n=4).postprocess_nodes(hits, query_str=Q)
    ends = RagkitNodePostprocessor(reranker=tiny_student, top_n=4, placement="both_ends").postprocess_nodes(
        hits, query_str=Q)
    assert [n.node.node_id for n in ends] == [best[j].node.node_id for j in both_ends_order(range(4))]
    nos = RagkitNodePostprocessor(reranker=tiny_student, use_retriever_scores=False)
    assert len(nos.postprocess_nodes([NodeWithScore(node=TextNode(text="x"), score=None)], query_str=Q)) == 1
    assert nos.postprocess_nodes([], query_str=Q) == []
    with pytest.raises(ValueError, match="query"):
        nos.postprocess_nodes(hits)
    with pytest.raises(ValueError, match="top_n"):
        RagkitNodePostprocessor(reranker=tiny_student, top_n=0)
    with pytest.raises(TypeError, match="ragkit reranker"):
        RagkitNodePostprocessor(reranker=object())
