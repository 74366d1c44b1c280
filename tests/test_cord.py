"""Tests of CORD training: losses, teacher stop-gradient, stacked collator, Trainer, resume, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ragkit.training.cord import (
    CORDCollator,
    CORDSettings,
    answer_logprobs,
    js_divergence,
    kl_divergence,
    load_model_for_training,
    make_trainer,
    pair_loss,
    token_ce,
    train_cord,
)
from ragkit.training.checkpoint import latest_checkpoint, resolve_resume
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
    pair_loss(torch.log_softmax(la3, -1), torch.log_softmax(lb3, -1), tgt, mask, loss="consistency").reg.sum().backward()
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


# ------------------------------------------------------------------------------------- training
def _settings(**kw) -> CORDSettings:
    base = dict(loss="cord", max_steps=6, save_steps=3, logging_steps=1, lr=5e-3, batch_size=2,
                passage_max_tokens=12, seed=0)
    base.update(kw)
    return CORDSettings(**base)


def test_loss_decreases_over_20_steps(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    st = _settings(max_steps=20, save_steps=100, lr=1e-2, logging_steps=5)
    summary = train_cord(examples[:4], str(tiny_lm_dir), tmp_path / "run", st)
    losses = [h["loss"] for h in summary["log_history"] if "loss" in h]
    assert len(losses) == 4 and losses[-1] < 0.7 * losses[0], losses
    assert "reg" in summary["log_history"][0] and "teacher_is_original" in summary["log_history"][0]
    assert (tmp_path / "run" / "model.safetensors").exists()
    assert not list((tmp_path / "run").glob("*.bin"))


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_stop_and_resume_gives_the_same_weights(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    from transformers import TrainerCallback

    st = _settings(max_steps=6, save_steps=3, loss="cord")
    full_dir, half_dir = tmp_path / "full", tmp_path / "half"
    m, tok = load_model_for_training(str(tiny_lm_dir), st)
    init = _weights(m)
    tr = make_trainer(m, tok, examples, full_dir, st)
    tr.train()
    full = _weights(tr.model)
    assert any(not torch.allclose(init[k], full[k]) for k in full)  # training moved the weights

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= 3:
                control.should_training_stop = True

    m, tok = load_model_for_training(str(tiny_lm_dir), st)
    tr = make_trainer(m, tok, examples, half_dir, st)
    tr.add_callback(StopAt())
    tr.train()
    assert tr.state.global_step == 3
    ckpt = resolve_resume("last", half_dir)
    assert ckpt is not None and ckpt.endswith("checkpoint-3") and latest_checkpoint(half_dir) == ckpt
    m, tok = load_model_for_training(str(tiny_lm_dir), st)
    tr = make_trainer(m, tok, examples, half_dir, st)
    tr.train(resume_from_checkpoint=ckpt)
    assert tr.state.global_step == 6
    resumed = _weights(tr.model)
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], rtol=1e-5, atol=1e-6)
    assert resolve_resume(None, half_dir) is None
    assert resolve_resume("last", tmp_path / "empty") is None
    with pytest.raises(FileNotFoundError):
        resolve_resume(str(tmp_path / "missing"), half_dir)


def test_cli_lora_merged_model_loads_back(tiny_lm_dir: Path, hotpot_dev_records: list[dict], tmp_path: Path) -> None:
    from ragkit.cli import main
    from ragkit.generation import Generator

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hotpot_dev_records[:4]), encoding="utf-8")
    out = tmp_path / "cord-lora"
    rc = main(["--quiet", "train", "cord", "--data-file", str(data), "--model", str(tiny_lm_dir), "--loss", "cord",
               "--lora", "--lora-r", "4", "--output-dir", str(out), "--max-steps", "2", "--save-steps", "1",
               "--passage-max-tokens", "8", "--batch-size", "1", "--json", str(tmp_path / "s.json")])
    assert rc == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["global_step"] == 2 and summary["settings"]["lora"] is True
    assert (out / "checkpoint-2" / "adapter_model.safetensors").exists()
    assert not (out / "adapter_config.json").exists()  # merged: a plain HF folder
    gen = Generator(model=str(out), device="cpu", show_progress=False)
    res = gen.score([gen.build_prompt("Who?", ["Arthur's Magazine"])], ["Arthur"])
    assert np.isfinite(res.sum).all()
    # resume with nothing left to do keeps the step count
    rc = main(["--quiet", "train", "cord", "--data-file", str(data), "--model", str(tiny_lm_dir), "--lora",
               "--lora-r", "4", "--output-dir", str(out), "--max-steps", "2", "--resume",
               "--passage-max-tokens", "8", "--batch-size", "1", "--json", str(tmp_path / "s2.json")])
    assert rc == 0 and json.loads((tmp_path / "s2.json").read_text())["resumed_from"].endswith("checkpoint-2")


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
