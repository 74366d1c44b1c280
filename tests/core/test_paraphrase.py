"""Paraphrasers and paraphrase sets (PS-GRPO / Con-RAG)."""

from __future__ import annotations

import pytest

from ragkit.datasets import sample_records
from ragkit.paraphrase import (
    LLMParaphraser,
    ParaphraseSet,
    RuleParaphraser,
    build_paraphrase_sets,
    clean_paraphrase,
    paraphrase_key,
)

QUESTIONS = [
    "What is the capital of France?",
    "Which magazine was started first, Arthur's Magazine or First for Women?",
    "Are Tinted Windows and Blur both bands?",
    "The band who released the album had their first performance in what city?",
    "In what year was the film released?",
]


@pytest.mark.parametrize("n", [1, 4, 8])
def test_rule_paraphraser_distinct_and_deterministic(n: int) -> None:
    a = RuleParaphraser(seed=3).paraphrase(QUESTIONS, n)
    b = RuleParaphraser(seed=3).paraphrase(list(reversed(QUESTIONS)), n)[::-1]
    assert a == b  # deterministic and independent of batch composition
    for q, ps in zip(QUESTIONS, a):
        assert len(ps) == n
        keys = {paraphrase_key(p) for p in ps}
        assert len(keys) == n
        assert paraphrase_key(q) not in keys


def test_rule_paraphraser_seed_changes_choice_and_rules_apply() -> None:
    outs = {tuple(RuleParaphraser(seed=s).paraphrase(QUESTIONS[:1], 4)[0]) for s in range(5)}
    assert len(outs) > 1
    cands = RuleParaphraser(shuffle=False).candidates("What is the capital of France?")
    assert "The capital of France is what?" in cands
    assert "Tell me what the capital of France is." in cands
    assert "What's the capital of France?" in cands
    assert any(c.startswith("Do you know") for c in cands)
    assert any(c.startswith("I want to know") for c in cands)


def test_rule_paraphraser_errors() -> None:
    with pytest.raises(ValueError, match="single string"):
        RuleParaphraser().paraphrase("What?", 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lower n"):
        RuleParaphraser().paraphrase(["Who won?"], 200)
    assert RuleParaphraser().paraphrase(["Who won?"], 0) == [[]]


def test_clean_paraphrase() -> None:
    q = "What is the capital of France?"
    assert (clean_paraphrase(' Rewrite: "Which city is France\'s capital?"\nmore', q)
            == "Which city is France's capital?")
    assert clean_paraphrase("what is the capital of france", q) is None
    assert clean_paraphrase("Paris", q) is None


def test_llm_paraphraser_with_tiny_model_fills_up(tiny_lm_dir) -> None:
    gen_mod = pytest.importorskip("ragkit.generation")
    if not hasattr(gen_mod, "Generator"):
        pytest.skip("ragkit.generation.Generator has not landed")
    gen = gen_mod.Generator(model=str(tiny_lm_dir), device="cpu", batch_size=4)
    p = LLMParaphraser(gen, seed=0, temperature=1.0, max_new_tokens=6)
    out = p.paraphrase(QUESTIONS[:2], 3)
    assert p.paraphrase(QUESTIONS[:2], 3) == out  # seeded
    for q, ps in zip(QUESTIONS, out):
        assert len({paraphrase_key(x) for x in ps}) == 3
        assert paraphrase_key(q) not in {paraphrase_key(x) for x in ps}


def test_build_sets_generator_level_and_roundtrip() -> None:
    recs = sample_records(3)
    sets = build_paraphrase_sets(recs, RuleParaphraser(seed=0), n=3)
    assert [s.set_id for s in sets] == [r.id for r in recs]
    for s, r in zip(sets, recs):
        assert len(s) == 4 and s.questions[0] == r.question
        assert all(ps == r.passages for ps in s.passages) and s.shared_passages
        assert ParaphraseSet.from_dict(s.to_dict()) == s
    no_orig = build_paraphrase_sets(recs, RuleParaphraser(seed=0), n=3, include_original=False)
    assert len(no_orig[0]) == 3 and recs[0].question not in no_orig[0].questions


def test_build_sets_end_to_end_with_retriever() -> None:
    ret = pytest.importorskip("ragkit.retrievers")
    if not hasattr(ret, "BM25Retriever"):
        pytest.skip("ragkit.retrievers.BM25Retriever has not landed")
    from ragkit.datasets import sample_corpus

    r = ret.BM25Retriever().index(sample_corpus())
    recs = sample_records(2)
    sets = build_paraphrase_sets(recs, RuleParaphraser(seed=0), n=2, retriever=r, k=3)
    assert not sets[0].shared_passages
    assert len(sets[0].passages) == 3 and all(len(p) == 3 for p in sets[0].passages)


def test_paraphrase_set_validates_lengths() -> None:
    with pytest.raises(ValueError, match="one list per member"):
        ParaphraseSet(set_id="x", original="q?", paraphrases=("a b c?",), passages=((),))
