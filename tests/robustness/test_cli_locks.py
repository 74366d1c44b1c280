"""Two runs writing the same output: the second ``ragkit`` command stops at once naming the first's PID."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

_HOLDER = """
import sys, time
from ragkit.io import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""

_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _hold(target: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(target)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def _ragkit(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragkit.cli", *argv], cwd=cwd, env=_ENV, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.parametrize("argv,target", [
    (["eval", "--out", "r.json", "--limit", "1"], "r.json"),
    (["eval", "--limit", "1"], "ragkit-eval-report.json"),  # the default report is locked too
    (["eval", "sweep", "--data-file", "nq.jsonl", "--out", "s.json"], "s.json"),
    (["eval", "consistency", "--out", "c.json", "--limit", "1"], "c.json"),
    (["index", "--out", "idx"], "idx"),
    (["distill", "labels", "--data-file", "d.jsonl", "--out", "labels.jsonl"], "labels.jsonl"),
    (["distill", "--labels", "labels.jsonl", "--out", "student"], "student"),
    (["train", "cord", "--output_dir", "run", "--data_file", "d.jsonl"], "run"),
    (["bias-profile", "--data-file", "d.jsonl", "--out", "p.json"], "p.json"),
])
def test_second_run_on_the_same_output_stops_at_once(tmp_path: Path, argv: list[str], target: str) -> None:
    holder = _hold(tmp_path / target)
    try:
        t0 = time.perf_counter()
        r = _ragkit(*argv, cwd=tmp_path)
        took = time.perf_counter() - t0
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stderr
    assert f"in use by PID {holder.pid}" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert took < 60  # refused before any model loads or any question is answered
    assert not (tmp_path / target).exists()  # nothing written by the refused run


def test_lock_is_released_after_a_run(tmp_path: Path) -> None:
    r = _ragkit("index", "--out", "idx", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "idx" / "manifest.json").exists()
    assert not (tmp_path / "idx.lock").exists()
    r = _ragkit("index", "--out", "idx", "--quiet", cwd=tmp_path)  # a second, sequential run is fine
    assert r.returncode == 0, r.stderr
