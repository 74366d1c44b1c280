"""UPR and ICR against a hand computation on a tiny real model; ``prune`` and ``abstain`` on hand-made utilities."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragkit.debias import get_method, get_reranker
from ragkit.debias.prune import prune
from ragkit.types import Passage

QUESTION = "Which river flows through Paris?"
PASSAGES = [
    Passage("a", "The Seine flows through Paris and into the English Channel.", title="Seine"),
    Passage("b", "Berlin lies on the Spree and the Havel.", title="Berlin"),
    Passage("c", "The Loire is the longest river in France.", title="Loire"),
]


@pytest.fixture(scope="module")
def tiny_gen(tiny_lm_dir: Path):
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def eager_model(tiny_lm_dir: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_lm_dir), attn_implementation="eager").eval()


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=True)["input_ids"])


def test_upr_scores_equal_hand_computed_question_likelihood(tiny_gen, eager_model) -> None:
    import torch

    from ragkit.generation.prompts import question_template

    tok = tiny_gen.tokenizer
    tmpl = question_template(tiny_gen.template)
    want = []
    for p in PASSAGES:
        prompt = tmpl.build(QUESTION, [p], tok)
        joint = prompt + ("" if prompt[-1].isspace() else " ") + QUESTION  # the question continues the prompt
        p_ids, full = _ids(tok, prompt), _ids(tok, joint)
        assert full[: len(p_ids)] == p_ids
        with torch.no_grad():
            lsm = torch.log_softmax(eager_model(torch.tensor([full])).logits[0].double(), -1)
        q = range(len(p_ids), len(full))
        want.append(float(np.mean([lsm[t - 1, full[t]].item() for t in q])))  # mean log p(q_t | q_<t, prompt)
    rr = get_reranker("upr", tiny_gen)
    ranked = rr.rank(QUESTION, PASSAGES)
    got = {h.passage.id: h.score for h in ranked}
    assert [got[p.id] for p in PASSAGES] == pytest.approx(want, abs=1e-4)
    assert ranked.ids() == [PASSAGES[i].id for i in np.argsort(-np.asarray(want), kind="stable")]
    assert ranked.info.generator_calls == 3 and ranked.info.tokens_prefilled > 0


def _hand_icr(tok, model, prompt: str, lines: list[str], query: str, null: str = "N/A") -> np.ndarray:
    import torch

    p_ids = _ids(tok, prompt)
    offs = tok(prompt, add_special_tokens=True, return_offsets_mapping=True)["offset_mapping"]
    spans = []
    for line in lines:
        lo = prompt.index(line)
        spans.append([t for t, (s, e) in enumerate(offs) if e > s and lo <= s < lo + len(line)])
    att = []
    for x in (query, null):
        full = _ids(tok, prompt + " " + x)
        assert full[: len(p_ids)] == p_ids
        with torch.no_grad():
            out = model(torch.tensor([full]), output_attentions=True)
        # Σ_layers Σ_heads mean over the query's positions of the attention to each prompt token
        a = sum(layer[0, :, len(p_ids):, : len(p_ids)].double().mean(1).sum(0) for layer in out.attentions)
        att.append(a.numpy())
    c = att[0] - att[1]
    scores = []
    for toks in spans:
        ci = c[toks]
        keep = ci > ci.mean() - 2 * ci.std(ddof=1)
        scores.append(float(ci[keep].sum()))
    return np.asarray(scores)


def test_icr_scores_equal_hand_computed_calibrated_attention(tiny_gen, eager_model) -> None:
    rr = get_reranker("icr", tiny_gen)
    prompt, _ = rr.layout(QUESTION, PASSAGES)
    assert prompt.endswith("Query:") and QUESTION not in prompt  # the query is only what follows the prompt
    lines = [rr.template.format_passage(i, p) for i, p in enumerate(PASSAGES)]
    want = _hand_icr(tiny_gen.tokenizer, eager_model, prompt, lines, QUESTION)
    before = dict(tiny_gen.counters)
    ranked = rr.rank(QUESTION, PASSAGES)
    got = {h.passage.id: h.score for h in ranked}
    assert [got[p.id] for p in PASSAGES] == pytest.approx(want.tolist(), abs=1e-5)
    assert ranked.info.generator_calls == 2 and ranked.info.forward_passes == 2
    # the ledger: the prompt once, then the two query rows (no second prefill of the passages)
    n_prompt = len(_ids(tiny_gen.tokenizer, prompt))
    assert tiny_gen.counters["prefill_tokens"] - before["prefill_tokens"] < 1.2 * n_prompt + 40


def test_icr_restores_attention_implementation(tiny_gen) -> None:
    prev = tiny_gen.model.config._attn_implementation
    get_reranker("icr", tiny_gen).rank(QUESTION, PASSAGES)
    assert tiny_gen.model.config._attn_implementation == prev


def test_upr_and_icr_are_methods(tiny_gen) -> None:
    for name in ("upr", "icr"):
        out = get_method(name, tiny_gen, max_new_tokens=2).run_many([QUESTION], [PASSAGES])[0]
        assert sorted(out.order) == [0, 1, 2] and out.answer is not None
        assert out.generator_calls == (3 if name == "upr" else 2) + 1


def test_prune_keeps_top_k_helpful_passages() -> None:
    # ranking 3, 0, 4, 1, 2; passages 0 and 2 hurt
    r = prune([3, 0, 4, 1, 2], [-0.5, 0.2, -0.1, 0.0, 0.7], k=2)
    assert r.selected == (3, 4) and not r.abstain
    assert r.harmful == (0, 2) and r.harmful_share == pytest.approx(0.4)


def test_prune_keeps_fewer_when_fewer_help() -> None:
    r = prune([0, 1, 2, 3], [0.3, -1.0, -2.0, -0.1], k=3)
    assert r.selected == (0,) and not r.abstain and r.harmful_share == pytest.approx(0.75)


def test_prune_abstains_when_nothing_helps_but_never_returns_none() -> None:
    r = prune([2, 0, 1], [-0.1, -0.3, -0.2], k=3)
    assert r.abstain and r.selected == (2,) and r.harmful_share == 1.0
    assert prune([0, 1], [float("nan"), 0.5], k=2).selected == (1,)  # an undefined utility never helps


def test_prune_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="k must be"):
        prune([0], [0.1], k=0)
    with pytest.raises(ValueError, match="each of the 2 passages"):
        prune([0, 0], [0.1, 0.2], k=1)


def test_masked_loo_equals_hand_computed_masked_attention(tiny_gen, eager_model) -> None:
    """One forward of prompt + question whose question rows cannot see the hidden passage (a 4D additive mask)."""
    import torch

    from ragkit.debias.icr import encode_with_spans, passage_layout
    from ragkit.debias.masked_loo import masked_scores
    from ragkit.generation.prompts import question_template

    prompt, char_spans = passage_layout(tiny_gen, question_template(tiny_gen.template), QUESTION, PASSAGES)
    p_ids, (q_ids,), spans = encode_with_spans(tiny_gen, prompt, char_spans, [QUESTION])
    block_end = max(spans[-1]) + 1
    ids = torch.tensor([p_ids + q_ids])
    n = ids.shape[1]
    want = []
    for hide in (None, 1, 0):
        allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
        if hide is not None:
            allowed[block_end:, spans[hide]] = False  # the cue and the question do not see passage `hide`
        mask = torch.zeros(n, n)
        mask[~allowed] = torch.finfo(torch.float32).min
        with torch.no_grad():
            lsm = torch.log_softmax(eager_model(ids, attention_mask=mask[None, None]).logits[0].double(), -1)
        want.append(float(np.mean([lsm[t - 1, ids[0, t]].item() for t in range(len(p_ids), n)])))
    got = masked_scores(tiny_gen, QUESTION, PASSAGES, [[0, 1, 2], [0, 2], [1, 2]])
    assert got.tolist() == pytest.approx(want, abs=1e-4)
    # nothing hidden: the exact question outcome of the full prompt
    exact = tiny_gen.score_orderings([QUESTION], [PASSAGES], [[[0, 1, 2]]], [QUESTION],
                                     template=question_template(tiny_gen.template))[0]
    assert got[0] == pytest.approx(float(exact.mean[0]), abs=1e-4)
    with pytest.raises(ValueError, match="increasing order"):
        masked_scores(tiny_gen, QUESTION, PASSAGES, [[2, 0]])


def test_icr_and_masked_loo_keep_room_for_a_question_longer_than_the_answer_reserve(tiny_lm_dir: Path) -> None:
    """The text scored after the passage block is the question: when it is longer than the generator's
    ``answer_reserve``, the passages are cut further instead of the prompt being refused."""
    from ragkit.debias.icr import ICRReranker
    from ragkit.debias.masked_loo import masked_scores
    from ragkit.generation import Generator

    g = Generator(model=str(tiny_lm_dir), device="cpu", max_length=384, show_progress=False)
    long_q = "Which of the rivers that flow through the capital cities of western Europe " * 4 + "is longest?"
    assert len(g.tokenizer(" " + long_q, add_special_tokens=False)["input_ids"]) > 2 * g.answer_reserve
    ps = [Passage(str(i), f"Passage {i} talks about rivers, bridges, towns and the year {1900 + i}. " * 6,
                  title=f"T{i}") for i in range(8)]
    ranked = ICRReranker(g).rank(long_q, ps)
    assert len(ranked) == 8 and all(np.isfinite(h.score) for h in ranked)
    assert np.isfinite(masked_scores(g, long_q, ps, [list(range(8)), list(range(1, 8))])).all()


def test_masked_moi_prefills_about_upr_tokens(tiny_gen) -> None:
    ps = [Passage(str(i), f"Passage number {i} talks about rivers, towns and the year {1900 + i}.", title=f"T{i}")
          for i in range(10)]
    cost = {}
    for name in ("upr", "moi", "moi_masked"):
        tiny_gen.reset_counters()
        get_reranker(name, tiny_gen).rank(QUESTION, ps)
        cost[name] = tiny_gen.counters["prefill_tokens"]
    assert cost["moi_masked"] < 1.3 * cost["upr"] < cost["moi"]


def test_masked_loo_and_icr_ledgers_count_each_forward_once(tiny_gen) -> None:
    """Forward passes and prefilled tokens on the generator's counters and on the caller's meter: masked
    leave-one-out prefills the block once, then ``cue + question`` per intervention in batches; ICR prefills
    the prompt once, then the query and calibration rows in one forward. Nothing is decoded."""
    from ragkit.debias.icr import ICRReranker, encode_with_spans, passage_layout
    from ragkit.debias.masked_loo import masked_scores
    from ragkit.generation.base import metered
    from ragkit.generation.prompts import question_template

    def ledger(fn):
        before = dict(tiny_gen.counters)
        with metered() as cost:
            fn()
        counters = {k: tiny_gen.counters[k] - before[k] for k in before}
        return counters, (cost.forward_passes, cost.tokens_prefilled, cost.tokens_generated)

    prompt, char_spans = passage_layout(tiny_gen, question_template(tiny_gen.template), QUESTION, PASSAGES)
    p_ids, (q_ids,), spans = encode_with_spans(tiny_gen, prompt, char_spans, [QUESTION])
    block_end = max(max(s) for s in spans if s) + 1
    row = len(p_ids) - block_end + len(q_ids)
    sets = [[0, 1, 2], [0, 2], [1, 2], [0, 1], [2]]
    old_bs = tiny_gen.batch_size
    tiny_gen.batch_size = 2
    try:
        counters, cost = ledger(lambda: masked_scores(tiny_gen, QUESTION, PASSAGES, sets))
    finally:
        tiny_gen.batch_size = old_bs
    want = block_end + len(sets) * row  # the block once, the cue + question per intervention
    assert counters == {"forwards": 1 + 3, "prefill_tokens": want, "decode_tokens": 0}  # 5 rows in batches of 2
    assert cost == (4, want, 0)

    icr = ICRReranker(tiny_gen)
    p_ids, q_ids, n_ids, _ = icr.encode(QUESTION, PASSAGES)
    want = len(p_ids) + len(q_ids) + len(n_ids)
    counters, cost = ledger(lambda: icr.scores_one(QUESTION, PASSAGES))
    assert counters == {"forwards": 2, "prefill_tokens": want, "decode_tokens": 0}
    assert cost == (2, want, 0)
    counters, cost = ledger(lambda: icr.token_attention(p_ids, [q_ids]))  # one query row, no calibration
    assert counters == {"forwards": 2, "prefill_tokens": len(p_ids) + len(q_ids), "decode_tokens": 0}
    assert cost == (2, len(p_ids) + len(q_ids), 0)
    # a one-token query row is still a prefill (its tokens are the query's, not decoded ones)
    counters, cost = ledger(lambda: icr.token_attention(p_ids, [q_ids[:1]]))
    assert counters == {"forwards": 2, "prefill_tokens": len(p_ids) + 1, "decode_tokens": 0}
    assert cost == (2, len(p_ids) + 1, 0)


def test_masked_loo_needs_a_local_generator(tiny_gen) -> None:
    from ragkit.debias.masked_loo import masked_scores

    class Remote:  # the prompt settings of a generator, no local model
        template = tiny_gen.template
        tokenizer = tiny_gen.tokenizer
        max_length = tiny_gen.max_length
        model = None

    with pytest.raises(ValueError, match="needs a local ragkit.generation.Generator"):
        masked_scores(Remote(), QUESTION, PASSAGES, [[0, 1, 2]])
