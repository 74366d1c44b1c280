"""Tests of ragkit.generation on a tiny random Llama (fast) and the embedded SmolLM2 (slow)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from ragkit.generation import Generator, PromptTemplate, ScoreResult
from ragkit.types import Passage

QUESTION = "Which magazine was started first?"


@pytest.fixture(scope="module")
def gen(tiny_lm_dir: Path) -> Generator:
    return Generator(str(tiny_lm_dir), device="cpu", template="short", batch_size=3, show_progress=False)


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [Passage(str(i), f"passage {i} about the fox and the magazine " * (i % 3 + 1), title=f"T{i}")
            for i in range(5)]


def _orders() -> list[list[int]]:
    return [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]]


def test_prefix_identical_across_orderings(gen: Generator, passages: list[Passage]) -> None:
    splits = [gen.split_prompt(QUESTION, [passages[i] for i in o]) for o in _orders()]
    assert len({p for p, _ in splits}) == 1
    assert len({s for _, s in splits}) == len(splits)
    prefix, suffix = splits[0]
    assert prefix + suffix == gen.build_prompt(QUESTION, passages)
    assert QUESTION in prefix and "T0:" not in prefix
    assert suffix.startswith("[1] T0:") and suffix.endswith("Answer:")


def test_chat_template_prefix(tiny_lm_dir: Path, passages: list[Passage]) -> None:
    g = Generator(str(tiny_lm_dir), device="cpu", template="chat", show_progress=False)
    p1, s1 = g.split_prompt(QUESTION, passages)
    p2, s2 = g.split_prompt(QUESTION, passages[::-1])
    assert p1 == p2 and p1.startswith("<|im_start|>user")
    assert s1.endswith("<|im_start|>assistant\n") and s1 != s2


def test_auto_template_follows_tokenizer(tiny_lm_dir: Path, gen: Generator) -> None:
    from ragkit.generation.prompts import get_template

    auto = Generator(str(tiny_lm_dir), device="cpu", show_progress=False)
    assert auto.tokenizer.chat_template and auto.template.name == "chat"
    tok = gen.tokenizer
    saved = tok.chat_template
    try:
        tok.chat_template = None
        assert get_template("auto", tok).name == "short"
    finally:
        tok.chat_template = saved
    assert get_template("auto").name == "short"


def test_batched_score_equals_one_by_one(gen: Generator, passages: list[Passage]) -> None:
    prompts = [gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in _orders()] + ["Short prompt."]
    answers = ["the fox", "1844", "yes it was", "no", "First for Women"]
    batched = gen.score(prompts, answers)
    assert isinstance(batched, ScoreResult) and len(batched) == 5
    single = np.array([gen.score([p], [a]).sum[0] for p, a in zip(prompts, answers)])
    np.testing.assert_allclose(batched.sum, single, atol=1e-4)
    np.testing.assert_allclose(batched.mean, batched.sum / batched.num_tokens)
    assert all(len(t) == n for t, n in zip(batched.token_logprobs, batched.num_tokens))
    assert np.all(batched.sum < 0)


def test_answer_logits_equal_full_logits_reference(gen: Generator, passages: list[Passage]) -> None:
    prompt = gen.build_prompt(QUESTION, passages)
    answer = "Arthur's Magazine"
    got = gen.score([prompt], [answer]).token_logprobs[0]
    p = gen.tokenizer(prompt)["input_ids"]
    a = gen.tokenizer(" " + answer, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = gen.model(input_ids=torch.tensor([p + a])).logits[0]
    ref = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(p) - 1, len(p) + len(a) - 1), torch.tensor(a)]
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-4)


def test_score_orderings_equals_uncached_score(gen: Generator, passages: list[Passage]) -> None:
    q2 = "Who founded it in Philadelphia, and when?"
    orders1 = _orders()
    orders2 = [[0, 1, 2], [2, 1, 0]]
    answers1 = ["the fox", "1844", "yes", "no"]
    res = gen.score_orderings([QUESTION, q2], [passages, passages[:3]], [orders1, orders2], [answers1, "1844"])
    assert [len(r) for r in res] == [4, 2]
    ref1 = gen.score([gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in orders1], answers1)
    ref2 = gen.score([gen.build_prompt(q2, [passages[i] for i in o]) for o in orders2], ["1844"] * 2)
    np.testing.assert_allclose(res[0].sum, ref1.sum, atol=1e-4)
    np.testing.assert_allclose(res[1].sum, ref2.sum, atol=1e-4)
    # a larger batch (several questions share one forward) gives the same numbers
    big = Generator.from_components(gen.model, gen.tokenizer, template=gen.template, batch_size=16, show_progress=False)
    res_big = big.score_orderings([QUESTION, q2], [passages, passages[:3]], [orders1, orders2], [answers1, "1844"])
    np.testing.assert_allclose(res_big[0].sum, ref1.sum, atol=1e-4)
    np.testing.assert_allclose(res_big[1].sum, ref2.sum, atol=1e-4)


def test_greedy_batched_generate_equals_one_by_one(gen: Generator, passages: list[Passage]) -> None:
    prompts = [gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in _orders()] + ["Paris is"]
    batched = gen.generate(prompts, max_new_tokens=6)
    single = [gen.generate([p], max_new_tokens=6)[0] for p in prompts]
    assert batched == single
    assert all(isinstance(t, str) for t in batched)


def test_greedy_decoding_batches_several_prefill_batches_and_sampling_does_not(gen: Generator,
                                                                               passages: list[Passage]) -> None:
    """With ``batch_size`` 3 and ``decode_batch_size`` 12 every greedy decoding step serves all the prompts
    while each prefill stays within 3 rows, and the answers are those of one prompt at a time; sampling
    decodes each prefill batch alone, so that a seed's draws do not depend on how many rows decode together."""
    prompts = [gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in _orders()] + ["Paris is"]
    shapes: list[tuple[int, int]] = []
    hook = gen.model.register_forward_pre_hook(
        lambda _m, _args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    gen.decode_batch_size = 12
    try:
        answers = gen.generate(prompts, max_new_tokens=4, min_new_tokens=4)
        greedy = list(shapes)
        shapes.clear()
        gen.generate(prompts, max_new_tokens=4, min_new_tokens=4, temperature=1.0, seed=0)
    finally:
        hook.remove()
        gen.decode_batch_size = None
    assert answers == [gen.generate([p], max_new_tokens=4, min_new_tokens=4)[0] for p in prompts]
    assert len(prompts) > 3
    assert [rows for rows, width in greedy if width == 1] == [len(prompts)] * 3, greedy
    assert max(rows for rows, width in greedy if width > 1) <= 3
    assert max(rows for rows, _ in shapes) <= 3, shapes


def test_greedy_decoding_uses_the_cache_under_its_current_name(gen: Generator) -> None:
    """Greedy decoding with the KV cache equals re-running the full sequence at every step, and
    passes the cache under the name the installed transformers takes (no deprecation warning)."""
    import warnings

    from transformers import AutoTokenizer

    prompt = "Paris is the capital of"
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = gen.generate([prompt], max_new_tokens=5)[0]
    tok = AutoTokenizer.from_pretrained(gen.model.name_or_path)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        for _ in range(5):
            nxt = gen.model(input_ids=ids).logits[0, -1].argmax()
            if int(nxt) in gen.handle.eos_ids:
                break
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    n = len(tok(prompt).input_ids)
    assert out.strip() == tok.decode(ids[0, n:], skip_special_tokens=True).strip()


def test_sampling_is_seeded_and_returns_n(gen: Generator) -> None:
    prompts = ["The quick brown fox", "Paris is the capital"]
    a = gen.generate(prompts, max_new_tokens=8, temperature=1.0, n=3, seed=7)
    b = gen.generate(prompts, max_new_tokens=8, temperature=1.0, n=3, seed=7)
    c = gen.generate(prompts, max_new_tokens=8, temperature=1.0, n=3, seed=8)
    assert a == b
    assert len(a) == 2 and all(len(x) == 3 for x in a)
    assert a != c
    assert len(set(a[0])) > 1  # samples differ from one another


def test_stop_strings_trimmed(gen: Generator) -> None:
    full = gen.generate(["The quick brown fox"], max_new_tokens=12)[0]
    body = full.lstrip()
    assert len(body) >= 2, "the tiny model should produce some text"
    stop = body[1]
    cut = gen.generate(["The quick brown fox"], max_new_tokens=12, stop=[stop])[0]
    assert stop not in cut.lstrip() and full.startswith(cut)


def test_answer_returns_clean_strings(gen: Generator, passages: list[Passage]) -> None:
    out = gen.answer([QUESTION, "Who?"], [passages, passages[:2]], max_new_tokens=5)
    assert len(out) == 2 and all(isinstance(o, str) and "\n" not in o for o in out)
    assert Generator.clean_answer("The answer is: [2] Arthur's Magazine\nmore") == "Arthur's Magazine"


def test_long_passages_truncated_with_warning(tiny_lm_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    g = Generator(str(tiny_lm_dir), device="cpu", max_length=512, show_progress=False)
    long = [Passage(str(i), "the fox jumps over the lazy dog " * (40 * (i + 1)), title=f"L{i}") for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="ragkit.generation.generator"):
        prompt = g.build_prompt(QUESTION, long)
    assert any("truncated" in r.message for r in caplog.records)
    assert len(g.tokenizer(prompt)["input_ids"]) <= 512 - g.answer_reserve
    res = g.score([prompt], ["the fox"])
    assert np.isfinite(res.sum[0])
    assert g.split_prompt(QUESTION, long)[0] == g.split_prompt(QUESTION, long[::-1])[0]


@pytest.mark.parametrize(("n_passages", "max_length"), [(20, 1280), (40, 1792), (60, 2048), (60, 3072)])
def test_fitted_prompt_fits_when_cut_bodies_retokenise_longer(gen: Generator, n_passages: int,
                                                              max_length: int) -> None:
    """A body cut between the bytes of one character decodes to U+FFFD, which re-tokenises to more
    tokens than were cut: the first water-filling cap leaves the prompt a few tokens over, and the
    cap must keep going down until the measured prompt fits (four fixed retries did not)."""
    from ragkit.generation.fitting import encode_prompts, fit_passages
    from ragkit.generation.prompts import question_template

    tok, tmpl = gen.tokenizer, question_template(gen.template)
    ps = [Passage(str(i), "東京 " * (30 + i % 7), title=f"T{i}") for i in range(n_passages)]
    bodies = fit_passages(tok, tmpl, "who?", ps, max_length=max_length, answer_reserve=32, passage_max_tokens=None)
    assert len(encode_prompts(tok, [tmpl.build("who?", ps, tok, bodies)])[0]) <= max_length - 32
    assert all(b for b in bodies)  # cut, not emptied
    assert any(b != p.text for b, p in zip(bodies, ps))


def test_passage_max_tokens(tiny_lm_dir: Path, passages: list[Passage]) -> None:
    g = Generator(str(tiny_lm_dir), device="cpu", passage_max_tokens=4, show_progress=False)
    short = g.build_prompt(QUESTION, passages)
    assert len(short) < len(Generator.from_components(g.model, g.tokenizer).build_prompt(QUESTION, passages))


def test_bad_input_raises(gen: Generator, passages: list[Passage]) -> None:
    with pytest.raises(ValueError, match="decode_batch_size"):
        gen.decode_batch_size = 0
    with pytest.raises(ValueError, match="answers"):
        gen.score(["a", "b"], ["x"])
    with pytest.raises(ValueError, match="empty"):
        gen.score(["a prompt"], ["  "])
    with pytest.raises(ValueError, match="one of each"):
        gen.score_orderings([QUESTION], [passages], [], ["x"])
    with pytest.raises(ValueError, match="distinct"):
        gen.score_orderings([QUESTION], [passages], [[[0, 0, 1]]], ["x"])
    with pytest.raises(ValueError, match="one answer per ordering"):
        gen.score_orderings([QUESTION], [passages], [[[0, 1], [1, 0]]], [["x"]])
    with pytest.raises(ValueError, match="passage lists"):
        gen.answer([QUESTION, QUESTION], [passages])
    with pytest.raises(ValueError, match="template"):
        Generator.from_components(gen.model, gen.tokenizer, template="nope")
    with pytest.raises(ValueError, match="question"):
        PromptTemplate(name="x", instruction="i").split("  ", passages)


@pytest.mark.slow
def test_smollm2_answers_arthurs_magazine() -> None:
    from ragkit.datasets import sample_corpus

    q = "Which magazine was started first, Arthur's Magazine or First for Women?"
    corpus = {p.id: p for p in sample_corpus()}
    gold = [corpus[t] for t in ("Arthur's Magazine", "First for Women") if t in corpus]
    if len(gold) < 2:
        gold = [Passage("a", "Arthur's Magazine (1844-1846) was an American literary periodical published in "
                             "Philadelphia in the 19th century.", title="Arthur's Magazine"),
                Passage("b", "First for Women is a woman's magazine published by Bauer Media Group in the USA. "
                             "The magazine was started in 1989.", title="First for Women")]
    g = Generator(show_progress=False, passage_max_tokens=60)
    ans = g.answer([q], [gold])[0]
    assert isinstance(ans, str) and ans.strip()
    # Checked on SmolLM2-135M: log p("Arthur's Magazine") is -3.68 under the gold passages and
    # -3.37 with no passages, so "gold passages raise the answer's log-prob" is NOT asserted.
    s = g.score([g.build_prompt(q, gold), g.build_prompt(q, [])], ["Arthur's Magazine"] * 2).sum
    assert np.all(np.isfinite(s)) and np.all(s < 0)
