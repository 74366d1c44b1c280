"""RAGPipeline on a real BM25 index and the tiny random LM."""

from __future__ import annotations

import pytest

from ragkit import BM25Retriever, Generator, MoIReranker, Passage, RAGPipeline
from ragkit.debias import SingleAnswerer

# BM25 returns only passages sharing a word with the question: both test questions match
# every passage they ask k of ("first"/"magazine"; "capital"/"France")
CORPUS = [
    Passage("arthur", "Arthur's Magazine was an American literary periodical first published in 1844, "
            "when Philadelphia was the capital of American magazines.", "Arthur's Magazine"),
    Passage("women", "First for Women is a woman's magazine published by Bauer Media Group since 1989, "
            "also sold in France.", "First for Women"),
    Passage("fox", "The quick brown fox jumps over the lazy dog: the first line of a capital-letters typing drill.",
            "Fox"),
    Passage("paris", "Paris is the capital of France.", "Paris"),
]


@pytest.fixture(scope="module")
def parts(tiny_lm_dir):
    return BM25Retriever().index(CORPUS), Generator(str(tiny_lm_dir), device="cpu")


def test_pipeline_with_moi_batches_questions(parts) -> None:
    retriever, gen = parts
    rag = RAGPipeline(retriever, MoIReranker(gen, design="prior", budget=2), "bias_aware",
                      SingleAnswerer(gen, max_new_tokens=4), k=3)
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
    rag = RAGPipeline(retriever, None, "none", SingleAnswerer(gen, max_new_tokens=4), k=2)
    q = "What is the capital of France?"
    res = rag.ask(q)
    (hits,) = retriever.search([q], k=2)
    assert res.answer == gen.answer([q], [hits.passages()], max_new_tokens=4)[0]
    assert res.ranking.ids() == hits.ids() and res.generator_calls == 1


def test_pipeline_rejects_bad_input(parts) -> None:
    retriever, gen = parts
    with pytest.raises(ValueError, match="k must be"):
        RAGPipeline(retriever, generator=gen, k=0)
    other = Generator.from_components(gen.model, gen.tokenizer)
    with pytest.raises(ValueError, match="different Generator"):
        RAGPipeline(retriever, MoIReranker(other), "bias_aware", SingleAnswerer(gen))
    with pytest.raises(ValueError, match="empty"):
        RAGPipeline(retriever, generator=gen).ask("  ")
    with pytest.raises(ValueError, match="unknown placement"):
        RAGPipeline(retriever, generator=gen, placement="middle")
    with pytest.raises(ValueError, match="unknown reranker"):
        RAGPipeline(retriever, "moi_typo", generator=gen)
    with pytest.raises(ValueError, match="needs a position profile"):
        RAGPipeline(retriever, None, "bias_aware", generator=gen)


def test_pipeline_composes_any_reranker_placement_and_answerer(parts) -> None:
    """A named reranker, both-ends placement and voting: the prompt order is the placed ranking."""
    retriever, gen = parts
    rag = RAGPipeline(retriever, "random", "both_ends", "voting", k=4, generator=gen, max_new_tokens=3)
    q = "What is the capital of France?"
    res = rag.ask(q)
    (hits,) = retriever.search([q], k=4)
    perm = rag.reranker.permutation(q, hits.passages())
    assert res.ranking.ids() == [hits.passages()[i].id for i in perm]
    best_first = res.ranking.ids()
    assert [p.id for p in res.prompt_order] == [best_first[0], best_first[2], best_first[3], best_first[1]]
    assert res.generator_calls == 4  # one answer per cyclic rotation, no reranking cost
    assert rag.moi is None


def test_pipeline_async_and_default_kwargs(parts) -> None:
    import asyncio

    retriever, gen = parts
    rag = RAGPipeline(retriever, MoIReranker(gen, design="prior", budget=2, max_new_tokens=2), "bias_aware",
                      SingleAnswerer(gen, max_new_tokens=3), k=3)
    q = "Which magazine was started first, Arthur's Magazine or First for Women?"
    a, b = rag.ask(q), asyncio.run(rag.aask(q))
    assert a.to_dict() == b.to_dict() and rag.moi is rag.reranker.moi
    # the bias-aware prompt order is MoI's own placement of its ranking
    assert [p.id for p in a.prompt_order] == [a.retrieved[j].passage.id for j in a.ranking.info.details["order"]]
