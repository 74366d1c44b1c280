"""RAGPipeline on a real BM25 index and the tiny random LM."""

from __future__ import annotations

import pytest

from ragkit import BM25Retriever, Generator, MoI, Passage, RAGPipeline

CORPUS = [
    Passage("arthur", "Arthur's Magazine was an American literary periodical first published in 1844.",
            "Arthur's Magazine"),
    Passage("women", "First for Women is a woman's magazine published by Bauer Media Group since 1989.",
            "First for Women"),
    Passage("fox", "The quick brown fox jumps over the lazy dog.", "Fox"),
    Passage("paris", "Paris is the capital of France.", "Paris"),
]


@pytest.fixture(scope="module")
def parts(tiny_lm_dir):
    return BM25Retriever().index(CORPUS), Generator(str(tiny_lm_dir), device="cpu")


def test_pipeline_with_moi_batches_questions(parts) -> None:
    retriever, gen = parts
    rag = RAGPipeline(retriever, gen, MoI(gen, design="prior", budget=2), k=3, max_new_tokens=4)
    qs = ["Which magazine was started first, Arthur's Magazine or First for Women?", "What is the capital of France?"]
    out = rag.ask_many(qs)
    assert [o.question for o in out] == qs
    for o in out:
        assert len(o.retrieved) == 3 and sorted(o.ranking.ids()) == sorted(o.retrieved.ids())
        assert sorted(p.id for p in o.prompt_order) == sorted(o.retrieved.ids())
        assert o.generator_calls > 1 and isinstance(o.answer, str)
    assert out[1].retrieved.ids()[0] == "paris"
    d = out[0].to_dict()
    assert {r["retriever_rank"] for r in d["passages"]} == {1, 2, 3}


def test_pipeline_without_moi_equals_generator_answer(parts) -> None:
    retriever, gen = parts
    rag = RAGPipeline(retriever, gen, None, k=2, max_new_tokens=4)
    q = "What is the capital of France?"
    res = rag.ask(q)
    (hits,) = retriever.search([q], k=2)
    assert res.answer == gen.answer([q], [hits.passages()], max_new_tokens=4)[0]
    assert res.ranking.ids() == hits.ids() and res.generator_calls == 1


def test_pipeline_rejects_bad_input(parts) -> None:
    retriever, gen = parts
    with pytest.raises(ValueError, match="k must be"):
        RAGPipeline(retriever, gen, k=0)
    other = Generator.from_components(gen.model, gen.tokenizer)
    with pytest.raises(ValueError, match="different Generator"):
        RAGPipeline(retriever, gen, MoI(other))
    with pytest.raises(ValueError, match="empty"):
        RAGPipeline(retriever, gen).ask("  ")
