"""Tests of CORD training: losses, teacher stop-gradient, stacked collator, Trainer, resume, CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ragkit.training.checkpoint import latest_checkpoint, resolve_resume
from ragkit.training.cord import (
    CORDCollator,
    CORDConfig,
    answer_logprobs,
    js_divergence,
    kl_divergence,
    load_model,
    make_trainer,
    pair_loss,
    token_ce,
    train_cord,
)
from ragkit.training.data import CORDDataset, Example, examples_from_records
from ragkit.types import Passage

B, T, V = 3, 4, 11


def _logits(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, V, generator=g)


def _targets() -> tuple[torch.Tensor, torch.Tensor]:
    tgt = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])
    mask = tgt > 0
    mask[0, 3] = False
    return tgt, mask


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    out = []
    for i in range(6):
        ps = tuple(Passage(id=f"p{j}", title=f"Title {j}", text=f"Arthur's Magazine was started in {1840 + j + i}.")
                   for j in range(4))
        out.append(Example(id=f"q{i}", question=f"Which magazine was started first, number {i}?", passages=ps,
                           answer="Arthur's Magazine", scores=(3.0, 2.9, 2.8, 1.0)))
    return out


# ------------------------------------------------------------------------------------- losses
def test_divergences_zero_for_identical_orderings_positive_otherwise() -> None:
    tgt, mask = _targets()
    a = torch.log_softmax(_logits(0), -1)
    b = torch.log_softmax(_logits(1), -1)
    assert torch.allclose(kl_divergence(a, a, mask), torch.zeros(B), atol=1e-6)
    assert torch.allclose(js_divergence(a, a, mask), torch.zeros(B), atol=1e-6)
    assert (kl_divergence(a, b, mask) > 1e-3).all()
    js = js_divergence(a, b, mask)
    assert (js > 1e-3).all() and (js <= np.log(2) + 1e-6).all()
    assert torch.allclose(js, js_divergence(b, a, mask), atol=1e-6)  # symmetric
    for loss in ("cord", "consistency"):
        out = pair_loss(a, a, tgt, mask, loss=loss, lam=1.0)
        assert torch.allclose(out.reg, torch.zeros(B), atol=1e-6)
        assert torch.allclose(out.loss, token_ce(a, tgt, mask).mean())
        assert float(pair_loss(a, b, tgt, mask, loss=loss).reg.mean()) > 1e-3


def test_token_ce_ignores_masked_tokens() -> None:
    tgt, mask = _targets()
    a = torch.log_softmax(_logits(0), -1)
    want = -(a[0, 0, 1] + a[0, 1, 2] + a[0, 2, 3]) / 3
    assert torch.allclose(token_ce(a, tgt, mask)[0], want)


def test_teacher_gets_no_gradient_student_does() -> None:
    tgt, mask = _targets()
    la = _logits(0).requires_grad_(True)
    lb = _logits(1).clone()
    lb.scatter_(-1, tgt[..., None], 10.0)  # ordering b predicts y well: b is every example's teacher
    lb.requires_grad_(True)
    out = pair_loss(torch.log_softmax(la, -1), torch.log_softmax(lb, -1), tgt, mask, loss="cord", lam=1.0)
    assert not out.teacher_is_original.any()
    out.reg.sum().backward()
    assert lb.grad is None or torch.count_nonzero(lb.grad) == 0
    assert la.grad is not None and torch.count_nonzero(la.grad) > 0
    # the other way round: a is the teacher -> only b (student) gets the KL gradient
    la2 = la.detach().clone().requires_grad_(True)
    lb2 = lb.detach().clone().requires_grad_(True)
    out2 = pair_loss(torch.log_softmax(lb2, -1), torch.log_softmax(la2, -1), tgt, mask, loss="cord")
    assert out2.teacher_is_original.all()
    out2.reg.sum().backward()
    assert lb2.grad is None or torch.count_nonzero(lb2.grad) == 0
    assert torch.count_nonzero(la2.grad) > 0
    # consistency (JS, no teacher): both orderings get gradient
    la3 = la.detach().clone().requires_grad_(True)
    lb3 = lb.detach().clone().requires_grad_(True)
    pair_loss(torch.log_softmax(la3, -1), torch.log_softmax(lb3, -1), tgt, mask,
              loss="consistency").reg.sum().backward()
    assert torch.count_nonzero(la3.grad) > 0 and torch.count_nonzero(lb3.grad) > 0


def test_pair_loss_variants_and_errors() -> None:
    tgt, mask = _targets()
    a = torch.log_softmax(_logits(0), -1)
    b = torch.log_softmax(_logits(1), -1)
    assert torch.allclose(pair_loss(None, b, tgt, mask, loss="shuffle").loss, token_ce(b, tgt, mask).mean())
    assert torch.allclose(pair_loss(a, None, tgt, mask, loss="ce").loss, token_ce(a, tgt, mask).mean())
    both = pair_loss(a, b, tgt, mask, loss="cord", lam=0.0, ce_on="both").loss
    assert torch.allclose(both, 0.5 * (token_ce(a, tgt, mask) + token_ce(b, tgt, mask)).mean())
    with pytest.raises(ValueError, match="unknown loss"):
        pair_loss(a, b, tgt, mask, loss="nope")
    with pytest.raises(ValueError, match="both orderings"):
        pair_loss(a, None, tgt, mask, loss="cord")


def _one_token(*dists: list[float]) -> torch.Tensor:
    """``(B=len(dists), T=1, V)`` log-probabilities from hand-written distributions."""
    return torch.log(torch.tensor([[d] for d in dists], dtype=torch.float64))


def test_cord_kl_direction_is_teacher_to_student_hand_computed() -> None:
    """KL(teacher || student) = sum_v P_t(v) log(P_t(v) / P_s(v)), computed by hand on 3 tokens."""
    tgt = torch.tensor([[0], [0]])
    mask = torch.ones(2, 1, dtype=torch.bool)
    p = [0.8, 0.15, 0.05]  # predicts y = token 0 well (lower CE: the teacher)
    q = [0.3, 0.3, 0.4]  # worse on y (the student)
    lo, lp = _one_token(p, q), _one_token(q, p)  # example 0: original is the teacher; example 1: perturbed is
    out = pair_loss(lo, lp, tgt, mask, loss="cord", lam=0.5)
    assert out.teacher_is_original.tolist() == [True, False]
    kl_pq = 0.8 * math.log(0.8 / 0.3) + 0.15 * math.log(0.15 / 0.3) + 0.05 * math.log(0.05 / 0.4)  # 0.5767
    kl_qp = 0.3 * math.log(0.3 / 0.8) + 0.3 * math.log(0.3 / 0.15) + 0.4 * math.log(0.4 / 0.05)  # 0.7455
    assert abs(kl_pq - kl_qp) > 0.1  # the two directions differ clearly on this example
    # both examples: teacher = p (lower CE), student = q -> KL(p || q), never KL(q || p)
    np.testing.assert_allclose(out.reg.numpy(), [kl_pq, kl_pq], rtol=1e-9)
    np.testing.assert_allclose(out.ce_original.numpy(), [-math.log(0.8), -math.log(0.3)], rtol=1e-9)
    want = np.mean([-math.log(0.8) + 0.5 * kl_pq, -math.log(0.3) + 0.5 * kl_pq])
    assert float(out.loss) == pytest.approx(want, rel=1e-9)
    # ce_on="both" averages both orderings' CE: (-log .8 - log .3) / 2 for each example
    both = pair_loss(lo, lp, tgt, mask, loss="cord", lam=0.5, ce_on="both")
    assert float(both.loss) == pytest.approx(0.5 * (-math.log(0.8) - math.log(0.3)) + 0.5 * kl_pq, rel=1e-9)


def test_divergences_average_over_real_answer_tokens_only() -> None:
    """A padded answer position (mask False) holds arbitrary distributions; it must not count."""
    p, q = [0.8, 0.15, 0.05], [0.3, 0.3, 0.4]
    kl_pq = sum(a * math.log(a / b) for a, b in zip(p, q))
    lo = torch.log(torch.tensor([[p, [0.98, 0.01, 0.01]]], dtype=torch.float64))  # (B=1, T=2, V=3)
    lp = torch.log(torch.tensor([[q, [0.01, 0.01, 0.98]]], dtype=torch.float64))
    tgt, mask = torch.tensor([[0, 0]]), torch.tensor([[True, False]])
    assert float(kl_divergence(lo, lp, mask)[0]) == pytest.approx(kl_pq, rel=1e-9)
    assert float(pair_loss(lo, lp, tgt, mask, loss="cord").reg[0]) == pytest.approx(kl_pq, rel=1e-9)
    assert float(token_ce(lo, tgt, mask)[0]) == pytest.approx(-math.log(0.8), rel=1e-9)


def test_consistency_js_hand_computed() -> None:
    tgt = torch.tensor([[0]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    p, q = [0.7, 0.2, 0.1], [0.4, 0.4, 0.2]
    m = [(a + b) / 2 for a, b in zip(p, q)]
    js = 0.5 * sum(a * math.log(a / c) for a, c in zip(p, m)) + 0.5 * sum(b * math.log(b / c) for b, c in zip(q, m))
    out = pair_loss(_one_token(p), _one_token(q), tgt, mask, loss="consistency", lam=2.0)
    assert float(out.reg[0]) == pytest.approx(js, rel=1e-9)
    assert float(out.loss) == pytest.approx(-math.log(0.7) + 2.0 * js, rel=1e-9)
    for name in ("shuffle", "score_aware"):  # CE on the perturbed ordering only
        assert float(pair_loss(None, _one_token(q), tgt, mask, loss=name).loss) == pytest.approx(-math.log(0.4))


# ------------------------------------------------------------------------------------- collator
def test_collator_stacks_two_orderings_with_aligned_answers(tiny_lm_dir: Path, examples: list[Example]) -> None:
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=12, show_progress=False)
    coll = CORDCollator(gen, loss="cord", seed=0)
    from ragkit.training.perturb import OrderPerturbation

    coll.perturbation = OrderPerturbation(alpha=1.0)  # full shuffle so the two rows differ
    batch = coll(examples[:3])
    b = 3
    ids, pos, ans, amask = batch["input_ids"], batch["answer_pos"], batch["answer_ids"], batch["answer_mask"]
    assert ids.shape[0] == 2 * b and ans.shape[0] == b and pos.shape[0] == 2 * b
    for r in range(2 * b):
        n = int(amask[r % b].sum())
        assert ids[r, pos[r, :n] + 1].tolist() == ans[r % b, :n].tolist()  # answer tokens follow their predictors
        assert int(batch["attention_mask"][r].sum()) == int(pos[r, n - 1]) + 2
    assert not torch.equal(ids[:b], ids[b:])
    # the perturbation is a function of (seed, epoch, example id): same batch -> same rows
    assert torch.equal(coll(examples[:3])["input_ids"], ids)
    coll.epoch = 1
    assert not torch.equal(coll(examples[:3])["input_ids"][b:], ids[b:])

    # gathered answer log-probs equal the Generator's own teacher-forced scores, for both orderings
    gen.model.eval()
    with torch.no_grad():
        logp = answer_logprobs(gen.model, ids, batch["attention_mask"], pos)
    tok_lp = logp.gather(-1, torch.cat([ans, ans])[..., None])[..., 0]
    sums = (tok_lp * torch.cat([amask, amask])).sum(-1)
    coll.epoch = 0
    orders, _ = coll.orders(examples[:3])
    prompts = [gen.build_prompt(e.question, list(e.passages)) for e in examples[:3]]
    prompts += [gen.build_prompt(e.question, [e.passages[i] for i in o]) for e, o in zip(examples[:3], orders)]
    ref = gen.score(prompts, [e.answer for e in examples[:3]] * 2).sum
    np.testing.assert_allclose(sums.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_single_ordering_losses_build_one_row_per_example(tiny_lm_dir: Path, examples: list[Example]) -> None:
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    for loss in ("shuffle", "ce"):
        assert CORDCollator(gen, loss=loss)(examples[:2])["input_ids"].shape[0] == 2
    with pytest.raises(ValueError, match="unknown loss"):
        CORDCollator(gen, loss="bad")


def test_shuffle_is_uniform_and_score_aware_is_its_own_variant(tiny_lm_dir: Path) -> None:
    """``shuffle`` = uniform permutation (alpha = 1) even when one passage dominates the scores;
    ``score_aware`` keeps the mild score-aware perturbation."""
    from scipy.stats import chisquare

    from ragkit.generation import Generator
    from ragkit.training.cord import perturbation_for
    from ragkit.training.perturb import OrderPerturbation

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    ps = tuple(Passage(id=f"p{j}", text=f"passage {j}") for j in range(4))
    exs = [Example(id=f"q{i}", question="Who?", passages=ps, answer="Bob", scores=(10.0, 1.0, 0.9, 0.8))
           for i in range(400)]
    top_slot = {}
    for loss in ("shuffle", "score_aware"):
        coll = CORDCollator(gen, loss=loss, seed=0)
        orders, alphas = coll.orders(exs)
        counts = np.bincount([int(np.flatnonzero(o == 0)[0]) for o in orders], minlength=4)
        top_slot[loss] = counts
        if loss == "shuffle":
            assert set(alphas) == {1.0}
            assert chisquare(counts).pvalue > 1e-3, counts  # the dominant passage lands in every slot alike
        else:
            assert max(alphas) < 0.2  # alpha_max = 1 - tanh(margin / std) is small for a dominant passage
    assert top_slot["score_aware"][0] > 350 and top_slot["shuffle"][0] < 150
    assert perturbation_for("shuffle") == OrderPerturbation(alpha=1.0)
    with pytest.raises(ValueError, match="uniform"):
        CORDCollator(gen, loss="shuffle", perturbation=OrderPerturbation(gamma=1.0))
    with pytest.raises(ValueError, match="score_aware"):
        perturbation_for("shuffle", alpha=0.3)


def test_trainer_loss_reads_the_right_rows(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    """compute_loss's CE of each ordering equals the Generator's own teacher-forced CE of that
    ordering's prompts (rows 0..B-1 = retriever order, B..2B-1 = perturbed)."""
    from ragkit.generation import Generator

    cfg = _config(tmp_path / "rows", tiny_lm_dir, loss="cord", alpha=1.0, lam=0.7)
    m, tok, _ = load_model(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # sharper than the near-uniform random init, so the two orderings score apart
        for prm in m.parameters():
            prm.add_(torch.randn(prm.shape, generator=g) * 0.5)
    tr = make_trainer(m, tok, examples[:3], cfg)
    coll = tr.data_collator
    batch = coll(examples[:3])
    m.eval()
    with torch.no_grad():
        loss, parts = tr.compute_loss(m, batch, return_outputs=True)
    parts = parts["parts"]
    gen = Generator.from_components(m, tok, template=cfg.template, passage_max_tokens=12, show_progress=False)
    orders, _ = coll.orders(examples[:3])
    orig = [gen.build_prompt(e.question, list(e.passages)) for e in examples[:3]]
    pert = [gen.build_prompt(e.question, [e.passages[i] for i in o]) for e, o in zip(examples[:3], orders)]
    for prompts, got in ((orig, parts.ce_original), (pert, parts.ce_perturbed)):
        res = gen.score(prompts, [e.answer for e in examples[:3]])
        ce = -res.mean
        np.testing.assert_allclose(got.numpy(), ce, rtol=1e-4, atol=1e-4)
    assert float((parts.ce_original - parts.ce_perturbed).abs().max()) > 0.1  # rows that can be told apart
    assert float(loss) == pytest.approx(float((parts.ce_original + 0.7 * parts.reg).mean()), rel=1e-6)


# ------------------------------------------------------------------------------------- training
def _config(out: Path, model: Path | None = None, **kw) -> CORDConfig:
    base = dict(loss="cord", max_steps=6, save_steps=3, logging_steps=1, learning_rate=5e-3,
                per_device_train_batch_size=2, passage_max_tokens=12, seed=0)
    base.update(kw)
    return CORDConfig(output_dir=str(out), model=None if model is None else str(model), **base)


def test_loss_decreases_over_20_steps(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    cfg = _config(tmp_path / "run", tiny_lm_dir, max_steps=20, save_steps=100, learning_rate=1e-2, logging_steps=5)
    summary = train_cord(examples[:4], cfg)
    losses = [h["loss"] for h in summary["log_history"] if "loss" in h]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], losses
    assert "reg" in summary["log_history"][0] and "teacher_is_original" in summary["log_history"][0]
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    assert not list((tmp_path / "run" / "final").glob("*.bin")) and not list((tmp_path / "run").glob("*.bin"))


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_stop_and_resume_gives_the_same_weights(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    from transformers import TrainerCallback

    full_dir, half_dir = tmp_path / "full", tmp_path / "half"
    m, tok, _ = load_model(_config(full_dir, tiny_lm_dir))
    init = _weights(m)
    tr = make_trainer(m, tok, examples, _config(full_dir, tiny_lm_dir))
    tr.train()
    full = _weights(tr.model)
    assert any(not torch.allclose(init[k], full[k]) for k in full)  # training moved the weights

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= 3:
                control.should_training_stop = True

    m, tok, _ = load_model(_config(half_dir, tiny_lm_dir))
    tr = make_trainer(m, tok, examples, _config(half_dir, tiny_lm_dir))
    tr.add_callback(StopAt())
    tr.train()
    assert tr.state.global_step == 3
    ckpt = resolve_resume("last", half_dir)
    assert ckpt is not None and ckpt.endswith("checkpoint-3") and latest_checkpoint(half_dir) == ckpt
    assert json.loads((Path(ckpt) / "ragkit_settings.json").read_text())["loss"] == "cord"
    m, tok, _ = load_model(_config(half_dir, tiny_lm_dir))
    tr = make_trainer(m, tok, examples, _config(half_dir, tiny_lm_dir))
    tr.train(resume_from_checkpoint=ckpt)
    assert tr.state.global_step == 6
    resumed = _weights(tr.model)
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], rtol=1e-5, atol=1e-6)
    assert resolve_resume(None, half_dir) is None
    assert resolve_resume("last", tmp_path / "empty") is None
    with pytest.raises(FileNotFoundError):
        resolve_resume(str(tmp_path / "missing"), half_dir)


def test_examples_from_hotpotqa_are_bm25_ranked(hotpot_dev_records: list[dict]) -> None:
    from ragkit.datasets import hotpotqa_record

    recs = [hotpotqa_record(r) for r in hotpot_dev_records[:3]]
    exs = examples_from_records(recs)
    assert len(exs) == 3
    for ex, rec in zip(exs, recs):
        assert sorted(p.id for p in ex.passages) == sorted(p.id for p in rec.passages)
        assert ex.scores is not None and list(ex.scores) == sorted(ex.scores, reverse=True)
        assert ex.answer == rec.answers[0] and set(ex.gold_ids) == set(rec.gold_ids)
    top3 = examples_from_records(recs, k=3)
    assert all(len(e.passages) == 3 and len(e.scores) == 3 for e in top3)
    assert len(CORDDataset(exs)) == 3
    with pytest.raises(ValueError, match="empty answer"):
        Example(id="x", question="q?", passages=exs[0].passages, answer=" ")
