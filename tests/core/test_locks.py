"""Two runs writing the same output: the second stops at once naming the first one's PID."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ragkit.io import LockedError, exclusive_lock

_HOLDER = """
import sys, time
from ragkit.io import exclusive_lock
with exclusive_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def _hold(target: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(target)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_second_writer_is_refused_with_the_pid(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    holder = _hold(target)
    try:
        with pytest.raises(LockedError, match=f"in use by PID {holder.pid}"):
            with exclusive_lock(target):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_killed_process_is_stale(tmp_path: Path) -> None:
    target = tmp_path / "idx"
    holder = _hold(target)
    holder.kill()  # SIGKILL: no cleanup ran, the lock file is still there
    holder.wait()
    assert (tmp_path / "idx.lock").exists()
    with exclusive_lock(target):
        pass
    assert not (tmp_path / "idx.lock").exists()


def test_lock_is_reentrant_across_sequential_runs(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    for _ in range(3):
        with exclusive_lock(target):
            assert (tmp_path / "a.json.lock").read_text().strip().isdigit()
