"""Training runs: configs (unknown keys, warm-up ratio), run folders, stale temps, resume checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from ragkit.io import ARTIFACT_MARKER
from ragkit.training.checkpoint import CheckpointError, check_checkpoint
from ragkit.training.config import config_from_mapping
from ragkit.training.cord import CORDConfig, load_model, make_trainer, train_cord
from ragkit.training.data import Example
from ragkit.types import Passage


@pytest.fixture(scope="module")
def examples() -> list[Example]:
    ps = tuple(Passage(id=f"p{j}", title=f"Title {j}", text=f"Arthur's Magazine was started in {1840 + j}.")
               for j in range(3))
    return [Example(id=f"q{i}", question=f"Which magazine was started first, number {i}?", passages=ps,
                    answer="Arthur's Magazine", scores=(3.0, 2.9, 1.0)) for i in range(4)]


def _config(out: Path, model: Path, **kw) -> CORDConfig:
    base = dict(loss="cord", max_steps=2, save_steps=1, logging_steps=1, learning_rate=5e-3,
                per_device_train_batch_size=2, passage_max_tokens=8, seed=0)
    base.update(kw)
    return CORDConfig(output_dir=str(out), model=str(model), **base)


# ------------------------------------------------------------------------------ settings reach the trainer
def test_misspelled_or_unknown_settings_are_errors_naming_them(tmp_path: Path) -> None:
    from ragkit.training.psgrpo import PSGRPOConfig

    with pytest.raises(ValueError, match=r"'lerning_rate' \(did you mean learning_rate"):
        config_from_mapping(CORDConfig, {"output_dir": str(tmp_path), "lerning_rate": 1e-3}, "run.yaml")
    with pytest.raises(ValueError, match="'bogus'"):
        config_from_mapping(PSGRPOConfig, {"output_dir": str(tmp_path), "bogus": 1})
    with pytest.raises(TypeError, match="lerning_rate"):
        CORDConfig(output_dir=str(tmp_path), lerning_rate=1e-3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="output_dir is required"):
        CORDConfig()
    with pytest.raises(ValueError, match="not both"):
        CORDConfig(output_dir=str(tmp_path), warmup_ratio=0.1, warmup_steps=3)
    with pytest.raises(ValueError, match="limit must be >= 1"):
        CORDConfig(output_dir=str(tmp_path), limit=-1)  # not "all but the last record"
    with pytest.raises(ValueError, match="limit must be >= 1"):
        PSGRPOConfig(output_dir=str(tmp_path), limit=-1)


def test_warmup_ratio_reaches_the_lr_schedule(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    """transformers 5 has no ``warmup_ratio``; ragkit maps it to ``warmup_steps`` instead of dropping it."""
    from ragkit.training.psgrpo import PSGRPOConfig

    cfg = _config(tmp_path / "run", tiny_lm_dir, max_steps=20, warmup_ratio=0.25, learning_rate=1e-3)
    assert cfg.get_warmup_steps(cfg.max_steps) == 5 and cfg.warmup_steps == 0  # the field is not rewritten
    m, tok, _ = load_model(cfg)
    tr = make_trainer(m, tok, examples, cfg)
    tr.create_optimizer_and_scheduler(num_training_steps=cfg.max_steps)
    lrs = []
    for _ in range(7):
        lrs.append(tr.lr_scheduler.get_last_lr()[0])
        tr.optimizer.step()
        tr.lr_scheduler.step()
    assert lrs[0] == 0.0 and all(a < b for a, b in zip(lrs[:5], lrs[1:6])), lrs
    assert lrs[5] == pytest.approx(1e-3) and lrs[6] < lrs[5]  # then the linear decay
    assert PSGRPOConfig(output_dir=str(tmp_path), max_steps=10, warmup_ratio=0.3).get_warmup_steps(10) == 3
    epochs = CORDConfig(output_dir=str(tmp_path), max_steps=-1, num_train_epochs=2, warmup_ratio=0.1)
    assert epochs.get_warmup_steps(37) == 4  # epoch-based runs: a ratio of whatever the step count is
    assert CORDConfig(output_dir=str(tmp_path), warmup_steps=3).get_warmup_steps(20) == 3
    rebuilt = dataclasses.replace(cfg, max_steps=40)  # a config rebuilt from its fields keeps the ratio
    assert rebuilt.get_warmup_steps(40) == 10


# ------------------------------------------------------------------------------ run folder
def test_run_folder_of_user_files_is_refused_before_any_work(tiny_lm_dir: Path, examples: list[Example],
                                                             tmp_path: Path) -> None:
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "corpus.jsonl").write_text("mine\n")
    with pytest.raises(FileExistsError, match="did not write"):
        train_cord(examples, _config(proj, tiny_lm_dir))
    assert sorted(p.name for p in proj.iterdir()) == ["corpus.jsonl"]
    with pytest.raises(FileExistsError, match="is a file"):
        train_cord(examples, _config(proj / "corpus.jsonl", tiny_lm_dir))
    assert (proj / "corpus.jsonl").read_text() == "mine\n"
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        train_cord(examples, _config(run, tiny_lm_dir))
    assert (run / "final" / "notes.txt").read_text() == "mine"


# ------------------------------------------------------------------------------ resume
def test_resume_refuses_other_settings_keeps_summary_and_cleans_stale_temps(
        tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = train_cord(examples, _config(out, tiny_lm_dir))
    assert first["global_step"] == 2 and first["train_loss"] > 0
    assert json.loads((out / ARTIFACT_MARKER).read_text())["kind"] == "cord-run"
    assert json.loads((out / "final" / ARTIFACT_MARKER).read_text())["kind"] == "model"
    # what killed saves leave behind (ragkit's own names), and a file of the user's
    (out / "final.tmp-k2j3h4").mkdir()
    (out / "final.tmp-k2j3h4" / "model.safetensors").write_bytes(b"\0" * 1000)
    (out / "final.old-k2j3h4").mkdir()
    (out / ".final-abcd").mkdir()
    (out / "cord_summary.json.x1y2z3.tmp").write_text("{")
    (out / "notes.txt").write_text("mine")

    with pytest.raises(CheckpointError, match=r"loss: 'cord' \(checkpoint\) vs 'ce' \(now\)") as e:
        train_cord(examples, _config(out, tiny_lm_dir, loss="ce", lam=0.5, resume_from_checkpoint="last"))
    assert "lam: 1.0 (checkpoint) vs 0.5 (now)" in str(e.value) and "checkpoint-2" in str(e.value)
    assert json.loads((out / "cord_settings.json").read_text())["loss"] == "cord"  # not overwritten
    left = sorted(p.name for p in out.iterdir())
    assert not [n for n in left if ".tmp" in n or n.startswith((".final-", "final.old-"))], left
    assert (out / "notes.txt").read_text() == "mine"

    # resuming the finished run keeps its real summary (no train_loss 0.0)
    again = train_cord(examples, _config(out, tiny_lm_dir, resume_from_checkpoint="last"))
    assert again["train_loss"] == first["train_loss"] and again["global_step"] == 2
    assert json.loads((out / "cord_summary.json").read_text())["train_loss"] == first["train_loss"]
    # the summary was lost (killed after the last checkpoint): the loss comes from the log history
    (out / "cord_summary.json").unlink()
    third = train_cord(examples, _config(out, tiny_lm_dir, resume_from_checkpoint="last"))
    assert third["steps_this_run"] == 0 and third["train_loss"] == pytest.approx(first["train_loss"], rel=1e-3)
    # settings that do not change what is trained may differ (more steps, logging, saving)
    more = train_cord(examples, _config(out, tiny_lm_dir, max_steps=3, logging_steps=2, resume_from_checkpoint="last"))
    assert more["global_step"] == 3 and more["steps_this_run"] == 1 and more["train_loss"] > 0


def test_damaged_checkpoint_is_named(tiny_lm_dir: Path, examples: list[Example], tmp_path: Path) -> None:
    out = tmp_path / "run"
    train_cord(examples, _config(out, tiny_lm_dir))
    w = out / "checkpoint-2" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-64])  # a torn write
    with pytest.raises(CheckpointError, match=r"checkpoint-2 is damaged: model.safetensors"):
        train_cord(examples, _config(out, tiny_lm_dir, max_steps=3, resume_from_checkpoint="last"))
    opt = out / "checkpoint-1" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"checkpoint-1 is damaged: optimizer.pt"):
        train_cord(examples, _config(out, tiny_lm_dir, max_steps=3,
                                     resume_from_checkpoint=str(out / "checkpoint-1")))
    (out / "checkpoint-1" / "trainer_state.json").write_text("{\"global_st")
    with pytest.raises(CheckpointError, match="trainer_state.json is unreadable"):
        check_checkpoint(out / "checkpoint-1")


def test_damaged_adapter_is_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ck = tmp_path / "checkpoint-4"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    save_file({"a": torch.zeros(3, 2)}, str(ck / "adapter_model.safetensors"))
    (ck / "adapter_config.json").write_text(json.dumps({"r": 4}))
    assert check_checkpoint(ck) == 4
    (ck / "adapter_config.json").write_text("{\"r\": ")
    with pytest.raises(CheckpointError, match=r"checkpoint-4 is damaged: adapter_config.json"):
        check_checkpoint(ck)
    (ck / "adapter_config.json").unlink()
    with pytest.raises(CheckpointError, match="adapter_config.json is missing"):
        check_checkpoint(ck)
    (ck / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model weights"):
        check_checkpoint(ck)


def test_settings_without_effect_are_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A setting that cannot reach the objective (a LoRA rank without LoRA, a KL weight for the CE
    baseline) is named in a warning instead of being dropped without a word."""
    from ragkit.training.psgrpo import PSGRPOConfig

    with caplog.at_level("WARNING", logger="ragkit.training.config"):
        CORDConfig(output_dir=str(tmp_path), loss="ce", lam=0.3, lora_r=8)
        PSGRPOConfig(output_dir=str(tmp_path), lora_alpha=32, kappa=0, s=2)
    text = caplog.text
    for name in ("lam=0.3", "lora_r=8", "lora_alpha=32", "s=2"):
        assert name in text, name
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragkit.training.config"):
        CORDConfig(output_dir=str(tmp_path), loss="cord", lam=0.3, lora=True, lora_r=8)
        PSGRPOConfig(output_dir=str(tmp_path), consistency_weight=1.0, reward="rougel", kappa=2)
    assert "no effect" not in caplog.text
    with caplog.at_level("WARNING", logger="ragkit.training.config"):
        PSGRPOConfig(output_dir=str(tmp_path), reward="rougel")  # the default reward has no similarity term
    assert "reward='rougel' has no effect" in caplog.text
