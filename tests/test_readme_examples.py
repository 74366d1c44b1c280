"""Every ``ragkit`` command in README.md runs as written, at a small limit, in a fresh folder.

The convention (``docs/first-hour.md`` repeats it for whoever writes the README):

* An **example** is a line of a fenced ``bash`` block that starts with ``ragkit `` (a line ending
  in ``\\`` continues on the next; a trailing ``# comment`` is dropped). Other lines (``pip``,
  ``python3``, ``accelerate launch``) are not run.
* Examples run **in README order**, each **chain** in its own fresh temporary folder
  (``<tmp>/work``, beside a ``<tmp>/shared`` link to the data, so ``../shared/data/...`` resolves
  as it does from a clone), offline, with a ``RAGKIT_CACHE`` that starts empty in each test process
  (the first example there that loads a default model builds it from the pip package, as on a fresh
  machine). A chain is an example together with the later ones that read what it wrote
  (``ragkit distill --labels labels.jsonl`` after ``ragkit distill labels ... --out labels.jsonl``;
  :func:`readme_chains`); each chain is one test, so independent examples run in parallel under
  xdist and fail one by one. The files a reader brings are written first: :data:`FIXTURES`
  (``corpus.jsonl``, ``passages.jsonl``). An absolute ``/tmp/...`` path is moved into the folder;
  ``> FILE`` writes the command's stdout to ``FILE``; no other shell syntax is understood.
* Each example runs **small**: ``--limit`` becomes 1 (2 for the commands in :data:`NEEDS_TWO`, and
  it is added where the command takes it), ``--max-steps`` becomes 1, ``--epochs`` 1; everything
  else is as written.
* ``ragkit serve`` examples are started, pass when ``/health`` answers, and are stopped (on a free
  port).
* Not run: a block whose fence is preceded by the line ``<!-- examples: skip REASON -->``; a line
  ending in ``# examples: skip REASON``; ``--device cuda`` without CUDA; and the lines matching
  :data:`KNOWN_SKIPS` (each with its reason).

A failing example fails the test with its command, exit status and the tail of its output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHARED = (ROOT / ".." / "shared").resolve()

SMALL_LIMIT = "1"
SMALL = {"--limit": SMALL_LIMIT, "--max-steps": "1", "--max_steps": "1", "--epochs": "1"}
"""Flags whose value is replaced so that each example runs in seconds to a few minutes."""

NEEDS_TWO: dict[str, str] = {
    "bias-profile": "each question's distractors are drawn from the other questions",
    "distill labels": "the student's trainer holds out part of the labelled questions",
}
"""(command, reason): commands that refuse a single question, run at ``--limit 2``."""

WRITE_FLAGS = ("--out", "--output-dir", ">")
"""The flags (and shell redirection) whose value is a path an example writes."""

EXAMPLE_TIMEOUT_S = 900

FIXTURES: dict[str, str] = {
    "corpus.jsonl": "".join(json.dumps(r) + "\n" for r in [
        {"id": "1", "title": "Arthur's Magazine", "text": "Arthur's Magazine (1844-1846) was an American literary "
                                                         "periodical published in Philadelphia."},
        {"id": "2", "title": "First for Women", "text": "First for Women is a woman's magazine published by "
                                                       "Bauer Media Group in the USA."},
        {"id": "3", "title": "Red Herring", "text": "Red Herring is a magazine founded in 1993 by Christopher "
                                                   "Alden, covering technology business."},
        {"id": "4", "title": "GameFan", "text": "GameFan was a video game magazine published by Metropolis "
                                               "Publications from 1992 to 2000."},
        {"id": "5", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."},
    ]),
    "passages.jsonl": "".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "title": "Red Herring", "text": "Red Herring was founded in 1993 by Christopher Alden.",
         "score": 3.0},
        {"id": "b", "title": "GameFan", "text": "GameFan was published by Metropolis Publications.", "score": 2.0},
        {"id": "c", "title": "Paris", "text": "Paris is the capital of France.", "score": 1.0},
    ]),
}
"""Input files a README reader is expected to bring, written into the folder before the examples."""

KNOWN_SKIPS: tuple[tuple[str, str], ...] = (
    (r"^ragkit serve --reranker student:students/", "serves a student folder the README trains elsewhere"),
    (r"^ragkit serve --reranker cross-encoder:", "downloads a hub cross-encoder"),
    (r"^ragkit serve --reranker moi --model http", "needs an LLM server"),
)
"""(regex over the example, reason): examples this test cannot run; prefer a skip marker in the README."""


@dataclass
class Example:
    line: int
    command: str
    skip: str | None = None


def readme_examples(text: str) -> list[Example]:
    """The examples of a README text, with the reason each one is skipped (``None``: run it)."""
    out: list[Example] = []
    lines = text.splitlines()
    i = 0
    block_skip: str | None = None
    while i < len(lines):
        stripped = lines[i].strip()
        m = re.match(r"<!--\s*examples:\s*skip\b\s*(.*?)\s*-->", stripped)
        if m:
            block_skip = m.group(1) or "marked skip"
            i += 1
            continue
        if stripped.startswith("```"):
            lang = stripped[3:].strip()
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                start = i
                cmd = lines[i].rstrip()
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1] + " " + lines[i].strip()
                i += 1
                if lang not in ("bash", "sh", "shell") or not cmd.strip().startswith("ragkit "):
                    continue
                line_skip = re.search(r"#\s*examples:\s*skip\b\s*(.*)$", cmd)
                cmd_text = _strip_comment(cmd.strip())
                skip = block_skip or (line_skip and (line_skip.group(1).strip() or "marked skip"))
                if not skip:
                    skip = next((why for pat, why in KNOWN_SKIPS if re.search(pat, cmd_text)), None)
                out.append(Example(start + 1, cmd_text, skip or None))
            block_skip = None
        elif stripped:
            block_skip = block_skip if stripped.startswith("<!--") else None
        i += 1
    return out


def _strip_comment(cmd: str) -> str:
    """Drop a trailing ``# comment`` (outside quotes)."""
    lexer = shlex.shlex(cmd, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return shlex.join(list(lexer))


def _accepted_flags(argv: list[str]) -> set[str]:
    """Option strings of the (sub-)command ``argv`` names."""
    import argparse

    from ragkit.cli import build_parser

    parser = build_parser()
    for tok in argv:
        if tok.startswith("-"):
            break
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or tok not in sub.choices:
            break
        parser = sub.choices[tok]
    if hasattr(parser, "config_class"):
        parser.config_class()
    return set(parser._option_string_actions)


def small(argv: list[str], folder: Path) -> list[str]:
    """``argv`` at the small limit, with ``/tmp/...`` paths moved into ``folder``."""
    sizes = dict(SMALL)
    if any(" ".join(argv).startswith(command) for command in NEEDS_TWO):
        sizes["--limit"] = "2"
    out = [str(folder / a[len("/tmp/"):]) if a.startswith("/tmp/") else a for a in argv]
    for i, a in enumerate(out[:-1]):
        if a in sizes:
            out[i + 1] = sizes[a]
    out = [f"{a.split('=')[0]}={sizes[a.split('=')[0]]}" if "=" in a and a.split("=")[0] in sizes else a
           for a in out]
    if "--limit" not in out and not any(a.startswith("--limit=") for a in out) \
            and "--limit" in _accepted_flags(out):
        out += ["--limit", sizes["--limit"]]
    return out


def _paths(argv: list[str]) -> tuple[set[str], set[str]]:
    """(written, named): the paths ``argv`` writes (:data:`WRITE_FLAGS`), and every other argument as a
    path it may read (``student:student/`` names ``student``)."""
    values = {i + 1 for i, a in enumerate(argv[:-1]) if a in WRITE_FLAGS}
    written = {argv[i].rstrip("/") for i in values}
    named = {a.rstrip("/").rpartition(":")[2] for i, a in enumerate(argv) if i not in values}
    return written, named


def readme_chains(examples: list[Example]) -> list[list[Example]]:
    """The runnable examples grouped into chains, in README order: an example joins the chain of every
    earlier example whose written path it names (chains it links are merged); otherwise it starts one."""
    chains: list[list[Example]] = []
    writer: dict[str, int] = {}  # path -> index of the chain that wrote it
    for ex in examples:
        if ex.skip:
            continue
        written, named = _paths(shlex.split(ex.command)[1:])
        linked = sorted({writer[p] for p in named & writer.keys()})
        if not linked:
            chains.append([])
            linked = [len(chains) - 1]
        home = linked[0]
        for other in linked[1:]:  # an example reading two chains' outputs: one chain from then on
            chains[home] += chains[other]
            chains[other] = []
            writer = {p: home if c == other else c for p, c in writer.items()}
        chains[home].append(ex)
        writer.update({p: home for p in written})
    return [sorted(c, key=lambda e: e.line) for c in chains if c]


def _expand(arg: str, env: dict[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` replaced from ``env``, as the shell would (the README writes ``$RAGKIT_DATA``)."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), arg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    port = _free_port()
    argv = list(argv)
    if "--port" in argv:
        argv[argv.index("--port") + 1] = str(port)
    else:
        argv += ["--port", str(port)]
    proc = subprocess.Popen([sys.executable, "-m", "ragkit.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return 0, ""
            except OSError:
                time.sleep(1)
        return proc.poll() or 1, "no /health answer"
    finally:
        proc.terminate()
        try:
            out = proc.communicate(timeout=30)[0] or ""
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0] or ""
        if proc.returncode not in (0, -15, 143, None):
            print(out[-2000:])


def test_readme_examples_are_found() -> None:
    """The parser finds the README's commands (a quick check that runs in the default suite)."""
    examples = readme_examples(README.read_text(encoding="utf-8"))
    assert any(e.command.startswith("ragkit eval") for e in examples)
    text = "```bash\nragkit a --x 1   # note\nragkit b \\\n  --y 2\n```\n<!-- examples: skip GPU -->\n```bash\n" \
           "ragkit c\n```\n```bash\nragkit d  # examples: skip needs a server\n```\n"
    got = readme_examples(text)
    assert [(e.command, e.skip) for e in got] == [("ragkit a --x 1", None), ("ragkit b --y 2", None),
                                                  ("ragkit c", "GPU"), ("ragkit d", "needs a server")]


def test_readme_chains_link_an_example_to_what_it_reads() -> None:
    """Chains follow paths (quick): an index and the search of it, labels and the student trained on
    them and served from them; a reader of two chains merges them; a skipped example is left out."""
    text = ("```bash\nragkit index --out idx\nragkit ask q\nragkit search --index idx/ --query q\n"
            "ragkit distill labels --out labels.jsonl\nragkit distill --labels labels.jsonl --out student/\n"
            "ragkit rerank --reranker student:student/ --query q\nragkit eval --out a.json\n"
            "ragkit eval --out b.json\nragkit report a.json b.json > both.md\n"
            "ragkit c  # examples: skip a server\n```\n")
    chains = [[e.line for e in c] for c in readme_chains(readme_examples(text))]
    assert chains == [[2, 4], [3], [5, 6, 7], [8, 9, 10]]


def _example_env(cache: Path) -> dict[str, str]:
    from ragkit.datasets import data_dir

    return {**os.environ, "RAGKIT_DATA": str(data_dir()), "PYTHONPATH": str(ROOT), "RAGKIT_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "RAGKIT_NO_PROGRESS": "1"}


def _chain_params() -> list:
    examples = readme_examples(README.read_text(encoding="utf-8"))
    params = [pytest.param(chain, id=f"README:{chain[0].line}") for chain in readme_chains(examples)]
    params += [pytest.param([ex], id=f"README:{ex.line}", marks=pytest.mark.skip(reason=ex.skip))
               for ex in examples if ex.skip]
    return params


@pytest.fixture(scope="session")
def readme_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``RAGKIT_CACHE`` shared by this process's examples, empty before the first."""
    return tmp_path_factory.mktemp("ragkit-cache")


@pytest.mark.slow
@pytest.mark.parametrize("chain", _chain_params())
def test_readme_example_runs(chain: list[Example], tmp_path: Path, readme_cache: Path) -> None:
    """Run one chain of README examples at a small limit in a fresh folder; report every failure at once."""
    import torch

    cuda = [ex.line for ex in chain if "cuda" in shlex.split(ex.command)]
    if cuda and not torch.cuda.is_available():  # before any example runs: a skip must not hide a failure
        pytest.skip(f"README:{cuda[0]} needs CUDA")
    work = tmp_path / "work"
    work.mkdir()
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    for name, content in FIXTURES.items():
        (work / name).write_text(content, encoding="utf-8")
    env = _example_env(readme_cache)
    failures, ran = [], []
    for ex in chain:
        argv = shlex.split(ex.command)[1:]
        argv = small([_expand(a, env) for a in argv], tmp_path)
        stdout_file = None
        if ">" in argv:  # `... --json > FILE`: stdout into FILE, as the shell would
            stdout_file = work / argv[argv.index(">") + 1]
            argv = argv[: argv.index(">")]
        t0 = time.perf_counter()
        if argv[0] == "serve":
            rc, out = _serve(argv, env, work)
        else:
            try:
                p = subprocess.run([sys.executable, "-m", "ragkit.cli", *argv], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
                rc, out = p.returncode, (p.stdout + p.stderr)
                if stdout_file is not None:
                    stdout_file.parent.mkdir(parents=True, exist_ok=True)
                    stdout_file.write_text(p.stdout, encoding="utf-8")
            except subprocess.TimeoutExpired:
                rc, out = 124, f"timed out after {EXAMPLE_TIMEOUT_S} s"
        ran.append(f"README:{ex.line} {time.perf_counter() - t0:6.1f} s  rc={rc}  ragkit {shlex.join(argv)}")
        if rc != 0:
            failures.append(f"README:{ex.line}: ragkit {shlex.join(argv)} -> exit {rc}\n{out[-1500:]}")
    print("\n".join(["ran:", *ran]))
    assert not failures, "\n\n".join(failures)
