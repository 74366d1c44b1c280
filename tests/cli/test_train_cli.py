"""``ragkit train``: generated from CORDConfig / PSGRPOConfig, --config files, old spellings, a real run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from ragkit.cli import build_parser, main


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_train_alone_lists_its_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train"]) == 2
    out = capsys.readouterr().out
    assert "cord" in out and "psgrpo" in out and "usage: ragkit train" in out


@pytest.mark.parametrize("method,module,name", [("cord", "ragkit.training.cord", "CORDConfig"),
                                                ("psgrpo", "ragkit.training.psgrpo", "PSGRPOConfig")])
def test_help_lists_every_config_field_with_its_help(method: str, module: str, name: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert main(["train", method, "--help"]) == 0
    out = capsys.readouterr().out
    flat = _squash(out)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert len(fields) > 100  # the method's knobs and every inherited TrainingArguments field
    for f in fields:
        assert re.search(rf"--{re.escape(f.name)}\b", out), f.name
        assert _squash(f.metadata["help"].replace("%%", "%")) in flat, f.name
    for hidden in ("--lr", "--batch-size", "--generations", "--no-merge"):
        assert not re.search(rf"(^|[\s,\[]){re.escape(hidden)}(?=[\s,\]]|$)", out), hidden  # kept, but hidden


def test_config_file_and_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--config sets fields (YAML and JSON); the command line wins; old spellings still parse."""
    from ragkit.cli.train import _config_from_args
    from ragkit.training.cord import CORDConfig

    y = tmp_path / "run.yaml"
    y.write_text(f"data_file: train.jsonl\noutput_dir: {tmp_path / 'run'}\nloss: score_aware\nlora: true\n"
                 "learning_rate: 5.0e-4\nmax_steps: 7\nwarmup_ratio: 0.3\n")
    args = build_parser().parse_args(["train", "cord", "--config", str(y), "--max_steps", "10", "--lr", "1e-3"])
    cfg = _config_from_args(CORDConfig, args)
    assert (cfg.loss, cfg.lora, cfg.max_steps, cfg.learning_rate) == ("score_aware", True, 10, 1e-3)
    assert cfg.get_warmup_steps(cfg.max_steps) == 3 and cfg.data_file == "train.jsonl"
    j = tmp_path / "run.json"
    j.write_text(json.dumps({"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 3,
                             "merge_lora": False}))
    args = build_parser().parse_args(["train", "cord", "--config", str(j), "--resume"])
    cfg = _config_from_args(CORDConfig, args)
    assert (cfg.per_device_train_batch_size, cfg.merge_lora, cfg.resume_from_checkpoint) == (3, False, "last")
    args = build_parser().parse_args(["train", "cord", "--output-dir", "o", "--batch-size", "4", "--no-merge",
                                      "--grad-accum", "2", "--passage-tokens", "9"])
    cfg = _config_from_args(CORDConfig, args)
    assert (cfg.per_device_train_batch_size, cfg.merge_lora, cfg.gradient_accumulation_steps,
            cfg.passage_max_tokens) == (4, False, 2, 9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: o\nlerning_rate: 1e-3\n")
    assert main(["train", "cord", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "lerning_rate" in err and "learning_rate" in err
    assert main(["train", "cord", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["train", "cord", "--data_file", "x.jsonl"]) == 1  # no output_dir: one line, no traceback
    assert "output_dir is required" in capsys.readouterr().err


def test_cli_lora_run_from_a_config_file_loads_back(tiny_lm_dir: Path, hotpot_dev_records: list[dict],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ragkit.generation import Generator

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hotpot_dev_records[:4]), encoding="utf-8")
    out = tmp_path / "cord-lora"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data_file: {data}\nmodel: {tiny_lm_dir}\nloss: cord\nlora: true\nlora_r: 4\n"
                   f"output_dir: {out}\nmax_steps: 5\nsave_steps: 1\npassage_max_tokens: 8\n")
    rc = main(["--quiet", "train", "cord", "--config", str(cfg), "--max-steps", "2", "--batch-size", "1",
               "--out", str(tmp_path / "s.json"), "--json"])
    assert rc == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert json.loads(capsys.readouterr().out)["global_step"] == 2  # stdout holds only the JSON (Trainer logs: stderr)
    assert summary["global_step"] == 2 and summary["settings"]["lora"] is True
    assert (out / "checkpoint-2" / "adapter_model.safetensors").exists()
    assert not (out / "final" / "adapter_config.json").exists()  # merged: a plain HF folder
    gen = Generator(model=str(out / "final"), device="cpu", show_progress=False)
    res = gen.score([gen.build_prompt("Who?", ["Arthur's Magazine"])], ["Arthur"])
    assert np.isfinite(res.sum).all()
    # resume with nothing left to do keeps the step count and the summary
    rc = main(["--quiet", "train", "cord", "--config", str(cfg), "--max-steps", "2", "--batch-size", "1",
               "--resume", "--out", str(tmp_path / "s2.json")])
    s2 = json.loads((tmp_path / "s2.json").read_text())
    assert rc == 0 and s2["resumed_from"] is None and s2["global_step"] == 2  # the saved summary, unchanged
    assert s2["train_loss"] == summary["train_loss"]
    # a resume with other settings is refused with one line naming them
    rc = main(["--quiet", "train", "cord", "--config", str(cfg), "--max-steps", "2", "--batch-size", "1",
               "--loss", "ce", "--resume"])
    assert rc == 1


@pytest.mark.slow
def test_accelerate_launch_runs_the_same_config(tiny_lm_dir: Path, hotpot_dev_records: list[dict],
                                                tmp_path: Path) -> None:
    """``accelerate launch -m ragkit.cli train cord --config run.yaml`` (one CPU process) trains and saves."""
    import os
    import shutil
    import subprocess

    if shutil.which("accelerate") is None:
        pytest.skip("accelerate's launcher is not installed (pip install accelerate)")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hotpot_dev_records[:2]), encoding="utf-8")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data_file: {data}\nmodel: {tiny_lm_dir}\noutput_dir: {tmp_path / 'run'}\nmax_steps: 1\n"
                   "per_device_train_batch_size: 1\npassage_max_tokens: 8\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(Path.cwd())}
    cmd = ["accelerate", "launch", "--cpu", "--num_processes", "1", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "-m", "ragkit.cli", "--quiet", "train", "cord", "--config", str(cfg),
           "--out", str(tmp_path / "s.json")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "s.json").read_text())["global_step"] == 1
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
