"""The Haystack 2 ranker component with the real haystack-ai in an in-memory BM25 -> rerank pipeline."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("haystack", reason="haystack-ai is not installed: pip install 'ragkit[haystack]'")

from haystack import Document, Pipeline  # noqa: E402
from haystack.components.retrievers.in_memory import InMemoryBM25Retriever  # noqa: E402
from haystack.document_stores.in_memory import InMemoryDocumentStore  # noqa: E402

from ragkit.debias.profile import PositionProfile  # noqa: E402
from ragkit.integrations.haystack import RagkitRanker  # noqa: E402
from ragkit.types import Passage  # noqa: E402

Q = "who wrote Hamlet Shakespeare"


def _pipeline(corpus: list[Passage], ranker: RagkitRanker) -> Pipeline:
    store = InMemoryDocumentStore()
    store.write_documents([Document(id=p.id, content=p.text, meta={"title": p.title}) for p in corpus])
    pipe = Pipeline()
    pipe.add_component("retriever", InMemoryBM25Retriever(store, top_k=4))
    pipe.add_component("ranker", ranker)
    pipe.connect("retriever.documents", "ranker.documents")
    return pipe


def test_bm25_pipeline_then_ragkit_ranker(corpus, recording) -> None:
    pipe = _pipeline(corpus, RagkitRanker(recording, top_k=3))
    res = pipe.run({"retriever": {"query": Q}, "ranker": {"query": Q}}, include_outputs_from={"retriever"})
    retrieved = res["retriever"]["documents"]
    ranked = res["ranker"]["documents"]
    assert recording.seen_scores == [[d.score for d in retrieved]]  # the BM25 scores are the prior
    expected = recording.inner.rank(Q, [Passage(str(i), d.content, d.meta["title"]) for i, d in enumerate(retrieved)])
    assert [d.content for d in ranked] == [h.passage.text for h in expected][:3]
    assert [d.score for d in ranked] == pytest.approx(expected.scores()[:3], abs=1e-5)
    assert ranked[0].id in {d.id for d in retrieved} and ranked[0].meta["title"]


def test_run_options_async_and_errors(corpus, tiny_student) -> None:
    docs = [Document(id=p.id, content=p.text, score=1.0 / (i + 1)) for i, p in enumerate(corpus)]
    ranker = RagkitRanker(tiny_student, placement="bias_aware", profile=PositionProfile.recency(2, last=0.9))
    best = RagkitRanker(tiny_student).run(Q, docs, top_k=2)["documents"]
    aware = ranker.run(Q, docs, top_k=2)["documents"]
    assert [d.id for d in aware] == [best[1].id, best[0].id]  # recency: the best passage goes last
    assert [d.id for d in asyncio.run(ranker.run_async(Q, docs, top_k=2))["documents"]] == [d.id for d in aware]
    assert RagkitRanker(tiny_student).run(Q, [])["documents"] == []
    with pytest.raises(ValueError, match="top_n"):
        RagkitRanker(tiny_student).run(Q, docs, top_k=0)
    with pytest.raises(ValueError, match="no text content"):
        RagkitRanker(tiny_student).run(Q, [Document(id="x", content=None)])
