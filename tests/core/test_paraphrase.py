"""Paraphrasers and paraphrase sets (PS-GRPO / Con-RAG)."""

from __future__ import annotations

import pytest

from ragkit.datasets import sample_records
from ragkit.paraphrase import (
    LLMParaphraser,
    ParaphraseSet,
    RewriteFilter,
    RuleParaphraser,
    build_paraphrase_sets,
    clean_paraphrase,
    keeps_question_form,
    key_terms,
    paraphrase_key,
    set_diversity,
    token_jaccard,
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


def test_rule_swaps_keep_the_case_of_the_text_and_names_match_as_written() -> None:
    cands = RuleParaphraser(shuffle=False).candidates("What role was played by the actor who is replaced by him?")
    assert any("the actor who's replaced" in c for c in cands)
    assert not any("Who's" in c for c in cands)  # a mid-sentence contraction stays lower-case
    cands = RuleParaphraser(shuffle=False).candidates("Who is the US band that played for us?")
    assert "Who's the US band that played for us?" in cands
    assert "Who is the American band that played for us?" in cands
    assert not any("for American" in c or "for US" in c for c in cands)  # the pronoun is not the name


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
    # a small model runs on with questions of its own: the rewrite ends at its first question mark
    assert (clean_paraphrase("What is France's capital? Is it big? Is it old? Is", q)
            == "What is France's capital?")
    assert clean_paraphrase("Is it big? What is France's capital?", q) == "Is it big?"
    # a statement keeps its text: only the rewrite of a question is cut there
    assert clean_paraphrase("Name France's capital? Or not.", "Name the capital of France.") == (
        "Name France's capital? Or not.")


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
    rep = p.paraphrase_with_report(QUESTIONS[:2], 3)
    assert rep.paraphrases == out and len(rep.fallback) == 2 and rep.fallback_count == sum(rep.fallback)
    assert not hasattr(p, "last_fallback_count")  # how rewrites were made is returned, not left on the object


def test_rewrite_filter_terms_and_diversity() -> None:
    q = "Which magazine was started first, Arthur's Magazine or First for Women in 1844?"
    assert key_terms(q) == {"arthur", "magazine", "first", "women", "1844"}  # the opening "Which" is no name
    f = RewriteFilter(max_jaccard=0.8)
    assert f.reject(q, "Tell me: " + q) == "copy"
    assert token_jaccard(q, "Tell me: " + q) >= 0.8
    assert f.reject(q, "Of Arthur's Magazine and First for Women, which began earlier?") == "off_topic"  # 1844
    good = "Of Arthur's Magazine and First for Women, which one began earlier in 1844?"
    assert f.reject(q, good) is None
    assert f.reject(q, good, answers=["1844"]) is None  # the original holds it too
    assert f.reject(q, good.replace("?", ", Arthur's?"), answers=["Arthur's Magazine"]) is None
    leak = "Was Arthur's Magazine (the answer) or First for Women, of 1844, started first? Arthur's Magazine"
    assert f.reject("Which came first, Arthur's Magazine or First for Women in 1844?", leak,
                    answers=["the answer"]) == "leaks_answer"
    d = set_diversity(["What is it?", "what is it", "Tell me what it is."])
    assert d["identical_share"] == pytest.approx(1 / 3) and 0 < d["mean_jaccard"] < 1
    assert set_diversity(["one"]) == {"mean_jaccard": 0.0, "identical_share": 0.0}


@pytest.mark.parametrize(("original", "rewrite", "keeps"), [
    ("Which is bigger, A or B?", "Which is larger, A or B?", True),
    ("Which is bigger, A or B?", "A is bigger than B.", False),  # a statement that answers
    ("Which is bigger, A or B?", "A is bigger than B?", False),  # a wh-question turned yes/no
    ("Which is bigger, A or B?", "Is A bigger than B?", False),
    ("Which is bigger, A or B?", "Can you tell me which is bigger, A or B?", True),  # a frame, not a yes/no
    ("Which is bigger, A or B?", "Do you know: A or B, which is bigger?", True),
    ("Which is bigger, A or B?", "Tell me which is bigger, A or B.", True),  # a request
    ("Which is bigger, A or B? ", "Which is bigger, A or B? Please answer briefly.", True),
    ("Were both X and Y actors?", "Were X and Y both actors?", True),
    ("Were both X and Y actors?", "X and Y were both actors of which film?", False),  # yes/no turned wh
    ("Were both X and Y actors?", "Could you tell me: were X and Y both actors?", True),
    ("Name a member of the band.", "Who is a member of the band?", True),  # no "?" in the original
])
def test_keeps_question_form(original: str, rewrite: str, keeps: bool) -> None:
    assert keeps_question_form(original, rewrite) is keeps
    reason = RewriteFilter(max_jaccard=1.01, keep_terms=False).reject(original, rewrite)
    assert reason == (None if keeps else "not_a_question")
    assert RewriteFilter(max_jaccard=1.01, keep_terms=False, question_form=False).reject(original, rewrite) is None


def test_rule_rewrites_keep_the_question_form() -> None:
    qs = ["Which magazine was started first, Arthur's Magazine or First for Women?", "Are both X and Y actors?",
          "What is the capital of France?", "The band formed in what city?", "Who is older, A or B?"]
    for q in qs:
        for c in RuleParaphraser(shuffle=False).candidates(q):
            assert keeps_question_form(q, c), (q, c)


class ScriptedGenerator:
    """A text generator that answers every sampling round from a script (round = ``seed``)."""

    def __init__(self, rounds: list[list[str]]) -> None:
        self.rounds = rounds
        self.calls: list[int] = []

    def generate(self, prompts, max_new_tokens=48, stop=None, temperature=0.8, n=1, seed=0, top_p=0.95):
        self.calls.append(len(prompts))
        return [list(self.rounds[seed]) for _ in prompts]


def test_consistency_llm_paraphrases_are_screened() -> None:
    from ragkit.eval.consistency import paraphrase_sets
    from ragkit.types import QARecord

    rec = QARecord(id="q", question="Which is bigger, Paris or Lyon?", answers=("Paris",))
    gen = ScriptedGenerator([["Paris is bigger than Lyon.", "Of Paris and Lyon, which one is larger in size?"]])
    sets = paraphrase_sets([rec], n=2, source="llm", generator=gen)
    assert sets[0][1] == "Of Paris and Lyon, which one is larger in size?"
    assert "Paris is bigger than Lyon." not in sets[0]  # a statement, not the question: the rules fill in
    assert len(sets[0]) == 3


def test_llm_paraphraser_filters_and_retries() -> None:
    q = "What is the capital of France?"
    gen = ScriptedGenerator([
        ["What is the capital of France, please?", "Name the capital of Spain.", "Paris is France's capital city?"],
        ["Which city serves as France's seat of government?", "What is the capital of France please"],
        ["France has which city as its capital?"],
    ])
    p = LLMParaphraser(gen, seed=0, tries=3, rewrite_filter=RewriteFilter())
    rep = p.paraphrase_with_report([q], 3, answers=[["Paris"]])
    assert rep.paraphrases[0][:2] == ["Which city serves as France's seat of government?",
                                      "France has which city as its capital?"]
    assert rep.tries == [3] and rep.fallback == [1] and gen.calls == [1, 1, 1]
    assert RewriteFilter().reject(q, rep.paraphrases[0][2], ["Paris"]) is None  # a rule rewrite that passes, first
    assert rep.rejected[0] == {"copy": 2, "off_topic": 1, "leaks_answer": 1}
    # without a filter one round suffices and nothing is rejected but duplicates
    plain = LLMParaphraser(ScriptedGenerator(gen.rounds), seed=0, tries=3).paraphrase_with_report([q], 3)
    assert plain.tries == [1] and plain.fallback == [0]
    with pytest.raises(ValueError, match="tries"):
        LLMParaphraser(gen, tries=0)
    with pytest.raises(ValueError, match="one list per question"):
        p.paraphrase_with_report([q], 2, answers=[])


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
