"""Every benchmark's ``--help`` says how to reproduce its table on a GPU with a hub model (issue 16).

Each script in ``benchmarks/`` runs as ``python3 benchmarks/NAME.py --help`` in a subprocess (argparse
exits before any model loads, well under a second each). The help must exit 0, mention ``cuda`` or
``GPU``, and either show a GPU command line (``python3 benchmarks/NAME.py ... cuda ...``, from
``_harness.gpu_epilog``) whose every ``--flag`` is one of the script's own options, or say why the
table has no GPU run ("not applicable").
"""

from __future__ import annotations

import functools
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
PENDING: set[str] = set()

_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


def _help(script: str) -> str:
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"{script} --help exited {res.returncode}: {res.stderr[-2000:]}"
    return res.stdout


def _option_flags(text: str) -> set[str]:
    """Every option string argparse lists (``-k K, --k K  help`` lines; aliases included, nothing from the epilog)."""
    flags: set[str] = set()
    for line in text.splitlines():
        if re.match(r"^ {2,6}-", line):
            flags.update(_FLAG.findall(re.split(r"\s{2,}", line.strip())[0]))
    return flags


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
    own = _option_flags(text)
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


# ----------------------------------------------------------------------------- benchmarks/README.md
INDEX = BENCH / "README.md"
RESULTS = BENCH / "results"
# results still being produced when the index row was written; remove a name once its file is committed
PENDING_RESULTS: set[str] = set()


@functools.cache
def _flags_of(command: tuple[str, ...]) -> frozenset[str]:
    """Option strings of ``("benchmarks/x.py",)`` or a ``ragkit`` sub-command such as ``("eval", "sweep")``."""
    if command[0].startswith("benchmarks/"):
        return frozenset(_option_flags(_help(command[0].split("/", 1)[1])))
    res = subprocess.run([sys.executable, "-m", "ragkit.cli", *command, "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, f"ragkit {' '.join(command)} --help exited {res.returncode}: {res.stderr[-2000:]}"
    return frozenset(_option_flags(res.stdout))


def _index_rows() -> list[list[str]]:
    rows = []
    for line in INDEX.read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert rows and rows[0][:3] == ["README table (## Results)", "command", "JSON (`benchmarks/results/`)"]
    return rows[1:]


def _command_of(span: str) -> tuple[str, ...] | None:
    tokens = span.split()
    if tokens[:2] and tokens[0] == "python3" and tokens[1].startswith("benchmarks/"):
        assert (ROOT / tokens[1]).is_file(), f"benchmarks/README.md names a missing script: {tokens[1]}"
        return (tokens[1],)
    if tokens and tokens[0] == "ragkit":
        subs = []
        for t in tokens[1:]:
            if t.startswith("-"):
                break
            subs.append(t)
        return tuple(subs)
    return None


def test_index_commands_use_real_flags() -> None:
    """Every command in the index uses only options its script (or ``ragkit`` sub-command) has."""
    last: tuple[str, ...] | None = None
    for row in _index_rows():
        cell = row[1]
        for span in re.findall(r"`([^`]+)`", cell):
            cmd = _command_of(span)
            if cmd is not None:
                last = cmd
            assert last is not None, f"benchmarks/README.md row {row[0]!r}: flags before any command"
            flags = {f for f in _FLAG.findall(span.split(">")[0])}
            unknown = sorted(flags - _flags_of(last))
            assert not unknown, f"benchmarks/README.md row {row[0]!r}: {' '.join(last)} has no {unknown}"


def test_index_names_every_result_file() -> None:
    """Each JSON the index names exists (or is pending), and every JSON in results/ is in the index."""
    text = INDEX.read_text()
    named = set()
    for row in _index_rows():
        for name in re.findall(r"`([^`*]+\.json)`", row[2]):
            named.add(name)
            assert (RESULTS / name).is_file() or name in PENDING_RESULTS, f"benchmarks/README.md: no results/{name}"
        for name in re.findall(r"`([^`]+\.json)`", row[4]):
            assert name.endswith("-gpu.json"), f"benchmarks/README.md GPU column: {name} is not a *-gpu.json"
    assert named, "no JSON named in benchmarks/README.md"
    missing = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in text)
    assert not missing, f"results without a row in benchmarks/README.md: {missing}"
