"""Every benchmark's ``--help`` says how to reproduce its table on a GPU with a hub model (issue 16).

Each script in ``benchmarks/`` runs as ``python3 benchmarks/NAME.py --help`` in a subprocess (argparse
exits before any model loads, well under a second each). The help must exit 0, mention ``cuda`` or
``GPU``, and either show a GPU command line (``python3 benchmarks/NAME.py ... cuda ...``, from
``_harness.gpu_epilog``) whose every ``--flag`` is one of the script's own options, or say why the
table has no GPU run ("not applicable").
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))

# Scripts whose epilog the coordinator adds (other helpers own them while this lands); remove a
# name once its --help passes.
PENDING = {"cord_sweep.py", "distill.py", "generators.py", "moi.py", "moi_designs.py", "moi_pipeline.py",
           "moi_quality.py", "psgrpo_run.py", "serve.py"}

_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


def _help(script: str) -> str:
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"{script} --help exited {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout


def _usage_flags(text: str) -> set[str]:
    """The options argparse lists in the usage block (every non-suppressed option, nothing from the epilog)."""
    usage = text.split("\n\n", 1)[0]
    return set(_FLAG.findall(usage))


def _gpu_commands(text: str, script: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines()
            if ln.strip().startswith(f"python3 benchmarks/{script}") and "cuda" in ln]


@pytest.mark.parametrize("script", [
    pytest.param(s, marks=pytest.mark.xfail(strict=False, reason="epilog pending (coordinator)")) if s in PENDING
    else s for s in SCRIPTS])
def test_help_shows_the_gpu_run(script: str) -> None:
    text = _help(script)
    assert "cuda" in text or "GPU" in text, f"{script} --help says nothing about a GPU"
    commands = _gpu_commands(text, script)
    assert commands or "not applicable" in text, (
        f"{script} --help has no GPU command line (python3 benchmarks/{script} ... --device cuda) and does not say "
        "why; add epilog=_harness.gpu_epilog(...)")
    own = _usage_flags(text)
    for cmd in commands:
        unknown = sorted(set(f.split("=")[0] for f in _FLAG.findall(cmd)) - own)
        assert not unknown, f"{script}: the GPU command uses flags the script does not have: {unknown}"


def test_the_scripts_are_found() -> None:
    assert {"cord.py", "eval_suite.py", "model_zoo.py", "psgrpo.py", "retrieval.py"} <= set(SCRIPTS)


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ragkit_bench_harness", BENCH / "_harness.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_epilog(harness: ModuleType) -> None:
    text = harness.gpu_epilog("cord.py", "--model Qwen/Qwen2.5-7B-Instruct --device cuda --out x.json")
    assert "  python3 benchmarks/cord.py --model Qwen/Qwen2.5-7B-Instruct --device cuda --out x.json" in text
    assert harness.REFERENCE_GGUF_CMD in text and "HF_HUB_OFFLINE=1" in text
    no_gen = harness.gpu_epilog("retrieval.py", "--device cuda --out x.json", generator=False)
    assert harness.REFERENCE_GGUF_CMD not in no_gen and "HF_HUB_OFFLINE=1" in no_gen
    assert harness.gpu_epilog("model_zoo.py", None, note="GPU: not applicable.") == "GPU: not applicable."
    with pytest.raises(ValueError, match="no benchmarks/nope.py"):
        harness.gpu_epilog("nope.py", "--device cuda")
