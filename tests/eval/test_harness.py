"""ragkit.eval.harness: a study's settings come from its defaults, a config file and the flags, in that order."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from ragkit.datasets import data_dir
from ragkit.eval.harness import (
    model_record,
    plan_commit,
    pre_registered,
    pre_registered_parser,
    rel,
    resolve_recorded,
    same_model,
    study_config,
    study_main,
)
from ragkit.models import gguf_cache_folder


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", required=True)
    return ap


def test_flags_override_the_config_which_overrides_the_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"_command": "notes are ignored", "limit": 3, "data": "$RAGKIT_DATA/x.jsonl",
                               "out": "o.json"}))
    got = study_main(_parser(), lambda c: c, ["--config", str(cfg)])
    assert (got["limit"], got["data"], got["out"]) == (3, str(data_dir() / "x.jsonl"), "o.json")
    got = study_main(_parser(), lambda c: c, ["--config", str(cfg), "--limit", "5"])
    assert got["limit"] == 5 and got["_argv"] == ["--config", str(cfg), "--limit", "5"]


def test_a_bad_config_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"limt": 3}))
    with pytest.raises(SystemExit):
        study_main(_parser(), lambda c: c, ["--config", str(cfg), "--out", "o"])
    with pytest.raises(SystemExit):
        study_main(_parser(), lambda c: c, ["--config", str(tmp_path / "missing.json"), "--out", "o"])


def test_run_config_takes_defaults_and_refuses_unknown_settings() -> None:
    ns = study_config(_parser(), {"out": "o.json"})
    assert (ns.limit, ns.data, ns.out, ns._argv) == (10, None, "o.json", ["--out", "o.json"])
    with pytest.raises(ValueError, match="unknown setting"):
        study_config(_parser(), {"limt": 1})


def test_rel_and_resolve_recorded_are_inverse() -> None:
    p = data_dir() / "hotpotqa" / "dev.jsonl"
    assert rel(p) == "$RAGKIT_DATA/hotpotqa/dev.jsonl"
    assert resolve_recorded(rel(p)) == str(p)
    assert resolve_recorded("/tmp/x.json") == "/tmp/x.json"


def test_pre_registered_names_the_plan_commit_and_refuses_a_moved_plan(tmp_path: Path) -> None:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    plan = root / "experiments" / "psgrpo" / "plan.json"
    last = subprocess.run(["git", "log", "-1", "--format=%H", "--", "plan.json"], cwd=plan.parent,
                          capture_output=True, text=True).stdout.strip()
    assert plan_commit(plan) == (last or None)
    untracked = tmp_path / "plan.json"
    untracked.write_text(json.dumps({"arms": {}}))
    with pytest.raises(SystemExit, match="commit the plan"):
        pre_registered(untracked, tmp_path / "out.json")
    spec, result = pre_registered(untracked, tmp_path / "out.json", allow_uncommitted=True)
    assert spec == {"arms": {}} and result == {"plan": {"path": str(untracked), "commit": None}}
    (tmp_path / "out.json").write_text(json.dumps({"plan": {"commit": "0" * 40}, "arms": {"a": 1}}))
    with pytest.raises(SystemExit, match="another commit of the plan .*amend the plan openly"):
        pre_registered(untracked, tmp_path / "out.json", allow_uncommitted=True)
    # an amendment that names the results' commit lets the study go on, recording the commit it amends
    untracked.write_text(json.dumps({"arms": {}, "amendments": [{"amends": "1234567", "what": "x", "why": "y"}]}))
    with pytest.raises(SystemExit, match="another commit of the plan"):  # names another commit: still refused
        pre_registered(untracked, tmp_path / "out.json", allow_uncommitted=True)
    (tmp_path / "out.json").write_text(json.dumps({"plan": {"commit": "1234567" + "0" * 33}, "arms": {"a": 1}}))
    spec, result = pre_registered(untracked, tmp_path / "out.json", allow_uncommitted=True)
    assert result == {"plan": {"path": str(untracked), "commit": None, "earlier_commits": ["1234567" + "0" * 33]},
                      "arms": {"a": 1}}
    untracked.write_text(json.dumps({"arms": {}, "amendments": [{"amends": "123", "what": "x"}]}))  # too short
    with pytest.raises(SystemExit, match="another commit of the plan"):
        pre_registered(untracked, tmp_path / "out.json", allow_uncommitted=True)


def test_pre_registered_parser_has_the_shared_options_and_takes_the_study_s_own(tmp_path: Path) -> None:
    ap = pre_registered_parser("A confirmation.", tmp_path, script="experiments/x/confirm.py",
                               gpu_args="--device cuda --workdir /tmp/x", workdir="/w/confirm",
                               workdir_help="trained models", device_help="cpu or cuda", passage_max_tokens=48)
    ap.add_argument("--stage", default="report")  # a study's own option beside the shared ones
    ns = study_config(ap, {})
    assert vars(ns) == {"out": str(tmp_path / "results" / "confirm-qwen-cpu.json"), "plan": str(tmp_path / "plan.json"),
                        "model": None, "device": "cpu", "workdir": "/w/confirm", "train_file": None,
                        "passage_max_tokens": 48, "n_boot": 2000, "max_steps": None, "allow_uncommitted_plan": False,
                        "stage": "report", "_argv": []}
    args = ap.parse_args(["--max-steps", "2", "--n-boot", "50", "--allow-uncommitted-plan", "--stage", "train"])
    assert (args.max_steps, args.n_boot, args.allow_uncommitted_plan, args.stage) == (2, 50, True, "train")
    text = ap.format_help()
    assert text.startswith("usage:") and "A confirmation." in text
    assert "\n  python3 experiments/x/confirm.py --device cuda --workdir /tmp/x\n" in text  # the epilog as written
    assert "another --model is another study: pass another --out" in text
    assert "trained models" in text and "cpu or cuda" in text


def test_same_model_survives_a_reassembled_gguf_and_catches_another_file(tmp_path: Path) -> None:
    gguf = tmp_path / "qwen.gguf"
    gguf.write_bytes(b"GGUF weights")
    first = model_record(str(gguf), str(gguf_cache_folder(gguf)))
    os.utime(gguf, ns=(1, 1))  # the same bytes written again: a new mtime, so a new cache folder
    again = model_record(str(gguf), str(gguf_cache_folder(gguf)))
    assert first["model"] != again["model"] and first["model_sha256"] == again["model_sha256"]
    assert same_model(first, again)
    assert same_model({"model": first["model"]}, again)  # a result recorded before checksums: the name decides
    assert same_model({}, again)  # nothing recorded yet
    gguf.write_bytes(b"other weights")
    assert not same_model(first, model_record(str(gguf), str(gguf_cache_folder(gguf))))
    other = tmp_path / "llama.gguf"
    other.write_bytes(b"GGUF weights")
    assert not same_model({"model": first["model"]}, model_record(str(other), str(gguf_cache_folder(other))))
    hub = model_record("org/model", "org/model")
    assert hub == {"model": "org/model", "model_sha256": None} and not same_model(hub, first)
