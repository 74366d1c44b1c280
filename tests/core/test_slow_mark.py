"""The collection hook of ``tests/conftest.py`` marks slow the tests that start processes or load an
embedded default model, directly or through a helper of their module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SOURCE = '''
import subprocess
import sys
from ragkit.generation import Generator
from ragkit.retrievers import DenseRetriever


def _run(args):
    return subprocess.run([sys.executable, "-m", "ragkit.cli", *args])


def _helper():
    return _run(["--version"])


def test_direct():
    subprocess.Popen(["true"])


def test_through_two_helpers():
    _helper()


def test_default_generator():
    Generator()


def test_default_embedder():
    DenseRetriever(None, device="cpu")


def test_tiny_model(tiny_lm_dir):
    Generator(str(tiny_lm_dir))


def test_pure():
    assert sorted([2, 1]) == [1, 2]
'''


def test_the_hook_sees_processes_and_default_models(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("ragkit_tests_conftest", Path(__file__).parents[1] / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    path = tmp_path / "test_sample.py"
    path.write_text(SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("ragkit_slow_mark_sample", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    slow = {name for name in dir(mod) if name.startswith("test_") and conftest.starts_processes(getattr(mod, name))}
    assert slow == {"test_direct", "test_through_two_helpers", "test_default_generator", "test_default_embedder"}
