"""One prefill per ordering: the local ``run_orderings`` and the MoI outcomes built on it equal the
generic implementation (``run_orderings_by_parts``: generate, then score), the test oracle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragkit.debias.moi import MoI
from ragkit.debias.outcomes import (
    confidence_outcomes,
    consensus_outcomes,
    full_answer_outcomes,
    generate_per_ordering,
    reusable_answer,
)
from ragkit.generation import Generator, PromptTemplate
from ragkit.generation.layout import run_orderings_by_parts
from ragkit.types import Passage

Q1 = "Which magazine was started first?"
Q2 = "Who founded it in Philadelphia, and when?"


@pytest.fixture(scope="module")
def gen(tiny_lm_dir: Path) -> Generator:
    # no newline stop: the random model's answers are then rarely empty
    import torch

    from ragkit.text import normalize_answer

    tmpl = PromptTemplate(name="test", instruction="Answer the question using the passages.", stop=("Question:",))
    g = Generator(str(tiny_lm_dir), device="cpu", template=tmpl, batch_size=3, show_progress=False)
    # zero the (tied) embedding rows of punctuation-only tokens so that greedy answers hold words
    tok = g.tokenizer
    idx = [i for i in range(len(tok)) if not normalize_answer(tok.decode([i])) or "\ufffd" in tok.decode([i])]
    with torch.no_grad():
        g.model.get_input_embeddings().weight[idx] = 0.0
    return g


class ByParts(Generator):
    """The same generator with the generic ``run_orderings`` (generate, then score): the oracle."""

    def run_orderings(self, *args, **kwargs):  # type: ignore[override]
        return run_orderings_by_parts(self, *args, **kwargs)


@pytest.fixture(scope="module")
def oracle(gen: Generator) -> ByParts:
    """``gen``'s model and settings behind the generic implementation (no copy of the model)."""
    o = ByParts.__new__(ByParts)
    o.__dict__.update(gen.__dict__)
    return o


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [Passage(str(i), f"passage {i} about the fox and the magazine " * (i % 3 + 1), title=f"T{i}")
            for i in range(4)]


def _clean_generate(gen: Generator, prompts: list[str], max_new_tokens: int) -> list[str]:
    return [gen.clean_answer(o) for o in gen.generate(prompts, max_new_tokens=max_new_tokens,
                                                      stop=list(gen.template.stop))]


def test_run_orderings_equals_generate_then_score(gen: Generator, passages: list[Passage]) -> None:
    ods1 = [[0, 1, 2, 3], [1, 2, 3, 0], [3, 2, 1, 0], [2, 0, 3, 1]]
    ods2 = [[0, 1], [1], [], [1, 0]]  # subsets, and no passage at all
    rounds = {0: ["Arthur's Magazine", None], 1: ["1844", None]}

    def cands(q: int, answers: list[str]) -> list:
        # round 0: one answer for every ordering; round 1: each ordering's own answer (free log-probs)
        return [rounds[q][0], [a if a.strip() else "" for a in answers]]

    runs = gen.run_orderings([Q1, Q2], [passages, passages[:2]], [ods1, ods2], cands, max_new_tokens=5)
    for q, (question, ps, ods) in enumerate([(Q1, passages, ods1), (Q2, passages[:2], ods2)]):
        prompts = [gen.build_prompt(question, [ps[i] for i in o]) for o in ods]
        assert runs[q].answers == _clean_generate(gen, prompts, 5)
        ref0 = gen.score_orderings([question], [ps], [ods], [rounds[q][0]])[0]
        np.testing.assert_allclose(runs[q].scores[0].sum, ref0.sum, atol=1e-4)
        own = runs[q].answers
        live = [m for m, a in enumerate(own) if a.strip()]
        assert live, "the tiny model should produce some non-empty answers"
        ref1 = gen.score([prompts[m] for m in live], [own[m] for m in live])
        np.testing.assert_allclose(runs[q].scores[1].sum[live], ref1.sum, atol=1e-4)
        dead = [m for m in range(len(ods)) if m not in live]
        assert all(runs[q].scores[1].num_tokens[m] == 0 for m in dead)


@pytest.mark.parametrize("decode_batch_size", [None, 12])
def test_decoding_batches_several_prefill_batches(gen: Generator, passages: list[Passage],
                                                  decode_batch_size: int | None) -> None:
    """Rows prefilled ``batch_size`` (3) at a time are decoded ``decode_batch_size`` at a time: with 12,
    every decoding step serves all 12 orderings of the two queries; by default, 3. The answers stay greedy's."""
    ods1 = [[int(i) for i in np.random.default_rng(s).permutation(4)] for s in range(8)]
    ods2 = [[0, 1], [1], [], [1, 0]]
    shapes: list[tuple[int, int]] = []
    hook = gen.model.register_forward_pre_hook(
        lambda _m, _args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    gen.decode_batch_size = decode_batch_size
    try:
        runs = gen.run_orderings([Q1, Q2], [passages, passages[:2]], [ods1, ods2], max_new_tokens=5)
    finally:
        hook.remove()
        gen.decode_batch_size = None
    steps = [s for s in shapes if s[1] == 1]
    if decode_batch_size:
        assert steps and all(rows == 12 for rows, _ in steps) and len(steps) <= 4, shapes
    else:
        assert steps and max(rows for rows, _ in steps) <= 3, shapes
    assert max(rows for rows, width in shapes if width > 1) <= 3  # prefills stay within batch_size
    for run, question, ps, ods in ((runs[0], Q1, passages, ods1), (runs[1], Q2, passages[:2], ods2)):
        prompts = [gen.build_prompt(question, [ps[i] for i in o]) for o in ods]
        assert run.answers == _clean_generate(gen, prompts, 5)


def test_cached_outcomes_equal_the_generic_oracle(gen: Generator, oracle: ByParts, passages: list[Passage]) -> None:
    qs, ps = [Q1, Q2], [passages, passages[:3]]
    ods = [[[0, 1, 2, 3], [1, 2, 3, 0], [2, 3, 0, 1], [3, 0, 1, 2]], [[0, 1, 2], [2, 0, 1], [1, 2, 0]]]
    gen.reset_counters()
    new = consensus_outcomes(gen, qs, ps, ods, max_new_tokens=5)
    cached_tokens = gen.reset_counters()["prefill_tokens"]
    old = consensus_outcomes(oracle, qs, ps, ods, max_new_tokens=5)
    old_tokens = gen.reset_counters()["prefill_tokens"]
    for a, b in zip(new, old):
        assert a.answers == b.answers and a.target == b.target
        np.testing.assert_allclose(a.values, b.values, atol=1e-4)
        assert a.generator_calls == b.generator_calls
    assert any(o.target for o in new), "the tiny model should produce a consensus answer"
    assert cached_tokens < 0.7 * old_tokens, (cached_tokens, old_tokens)
    for a, b in zip(confidence_outcomes(gen, qs, ps, ods, max_new_tokens=5),
                    confidence_outcomes(oracle, qs, ps, ods, max_new_tokens=5)):
        assert a.answers == b.answers
        np.testing.assert_allclose(a.values, b.values, atol=1e-4)
    assert generate_per_ordering(gen, qs, ps, ods, 5) == generate_per_ordering(oracle, qs, ps, ods, 5)


def test_full_answer_outcome_scores_the_full_answer_under_subsets(gen: Generator, passages: list[Passage]) -> None:
    loo = [[0, 1, 2, 3], [1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2], []]
    res = full_answer_outcomes(gen, [Q1], [passages], [loo], max_new_tokens=5)[0]
    full = gen.answer([Q1], [passages], max_new_tokens=5)[0]
    assert res.target == full and res.generator_calls == 1 + len(loo)
    ref = gen.score([gen.build_prompt(Q1, [passages[i] for i in o]) for o in loo], [full] * len(loo))
    np.testing.assert_allclose(res.values, ref.mean, atol=1e-4)


def test_moi_cached_and_generic_give_same_rankings_and_answers(gen: Generator, oracle: ByParts,
                                                                passages: list[Passage]) -> None:
    qs = [Q1, Q2]
    ps = [passages, passages[:3]]
    n_reused = 0
    for design, budget in (("cyclic", None), ("prior", 3)):
        kw = dict(design=design, budget=budget, outcome="consensus", max_new_tokens=5, profile=None,
                  placement="ranked")
        new = MoI.from_settings(gen, **kw).run_batch(qs, ps)
        old = MoI.from_settings(oracle, **kw).run_batch(qs, ps)
        for a, b in zip(new, old):
            assert [h.passage.id for h in a.ranking] == [h.passage.id for h in b.ranking]
            np.testing.assert_allclose(a.utilities, b.utilities, atol=1e-4)
            assert a.order == b.order and a.answer == b.answer and a.ordering_answers == b.ordering_answers
            assert a.generator_calls == b.generator_calls
            n_reused += reusable_answer(a.orderings, a.ordering_answers, a.order) is not None
    assert n_reused > 0, "some final order should be one of the orderings run"


def test_reusable_answer() -> None:
    ods = [[0, 1, 2], [2, 1, 0]]
    assert reusable_answer(ods, ["Paris", "London"], [2, 1, 0]) == "London"
    assert reusable_answer(ods, ["Paris", "  "], [2, 1, 0]) is None
    assert reusable_answer(ods, ["Paris", "London"], [1, 2, 0]) is None


@pytest.mark.slow
def test_answer_with_drafts_equals_greedy() -> None:
    """On the embedded SmolLM2 (real answers that end at a stop string): right drafts are confirmed
    in one forward without decoding, wrong ones fall back to decoding, and the answers never change."""
    g = Generator(device="cpu", show_progress=False)
    ps = [Passage("1", "Arthur's Magazine (1844-1846) was an American literary periodical published in Philadelphia.",
                  title="Arthur's Magazine"),
          Passage("2", "First for Women is a woman's magazine published by Bauer Media Group in the USA.",
                  title="First for Women")]
    qs = ["Which magazine was started first, Arthur's Magazine or First for Women?",
          "Where was Arthur's Magazine published?"]
    pss = [ps, ps[::-1]]
    plain = g.answer(qs, pss, max_new_tokens=16)
    g.reset_counters()
    assert g.answer(qs, pss, max_new_tokens=16, drafts=plain) == plain
    assert g.reset_counters()["decode_tokens"] == 0
    assert g.answer(qs, pss, max_new_tokens=16, drafts=["certainly not this", None]) == plain
    assert g.reset_counters()["decode_tokens"] > 0


def test_min_new_tokens_keeps_eos_from_ending_an_answer_before_its_first_token(
        gen: Generator, passages: list[Passage]) -> None:
    """``min_new_tokens=1`` gives ``run_orderings`` the answers of ``answer`` (EOS never first), in the
    cached implementation and the generic one; without it an EOS-first ordering answers ``""``."""
    import dataclasses

    import torch

    from ragkit.generation.fitting import encode_prompts

    ods = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3]]
    ctxs = [[passages[i] for i in o] for o in ods]
    ids = encode_prompts(gen.tokenizer, [gen.build_prompt(Q1, ctxs[0])])[0]
    with torch.no_grad():
        first = int(gen.model(torch.tensor([ids])).logits[0, -1].argmax())
    eos_first = ByParts.__new__(ByParts)  # the same model, with that first greedy token as its EOS
    eos_first.__dict__.update(gen.__dict__)
    eos_first.handle = dataclasses.replace(gen.handle, eos_ids=(first,))
    local = Generator.run_orderings
    assert local(eos_first, [Q1], [passages], [ods], max_new_tokens=4)[0].answers[0] == ""
    want = eos_first.answer([Q1] * len(ods), ctxs, max_new_tokens=4)
    assert want[0].strip()
    assert local(eos_first, [Q1], [passages], [ods], max_new_tokens=4, min_new_tokens=1)[0].answers == want
    assert eos_first.run_orderings([Q1], [passages], [ods], max_new_tokens=4, min_new_tokens=1)[0].answers == want
