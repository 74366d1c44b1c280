"""Robustness cases of the ``ragkit`` command line, as a careless and as a hostile user would type them.

Every case runs ``python -m ragkit.cli ...`` in a subprocess, in a fresh folder holding a few files of
"the user" (``notes.txt``, ``project/``) plus whatever the case sets up, with real components (a
tiny random Llama built by ``tests/conftest.py``'s builder, a real BM25 index, real files, a real
full tmpfs and a read-only mount where the runner may mount). A case passes when

* the exit status is the expected one (0 ok, 1 a ragkit error, 2 a usage error),
* no traceback is printed (none of the cases passes ``-v``) and an error is one ``ragkit: error:``
  line that is not an "unexpected error" (a bug),
* the output matches the case's pattern (the message names the problem),
* every file present before the run is still there, byte for byte (unless the case says the
  command is meant to append to it), the shared fixtures (model, index) are unchanged, and no
  temporary or torn file is left next to a refused output,
* the case's own check holds (e.g. a resumed run lost no result).

Run ``python3 tests/robustness/cases.py`` to run every case and write ``docs/robustness.md``;
``--fast`` runs the cases marked fast (the pytest test does that), ``--only PATTERN`` a subset.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RAGKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "RAGKIT_NO_PROGRESS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
EXPECT_RC = {"ok": 0, "error": 1, "usage": 2}
KEEP_MARKER = "<!-- kept when the table above is regenerated -->"


# ----------------------------------------------------------------------------- fixtures
@dataclass
class Fixtures:
    """Files shared by the cases (built once; their hashes are checked after every case)."""

    root: Path
    lm: Path = Path()
    corpus: Path = Path()
    index: Path = Path()
    hotpot: Path = Path()
    nq: Path = Path()
    labels: Path = Path()
    full: Path | None = None  # a tiny full tmpfs (None: cannot mount)
    ro: Path | None = None  # a read-only mount (None: cannot mount)
    hashes: dict[str, str] = field(default_factory=dict)

    def fmt(self, s: str, cwd: Path) -> str:
        return s.format(lm=self.lm, corpus=self.corpus, index=self.index, hotpot=self.hotpot, nq=self.nq,
                        labels=self.labels, full=self.full or "/nonexistent-full", ro=self.ro or "/nonexistent-ro",
                        cwd=cwd, sample=ROOT / "ragkit" / "data" / "hotpotqa_dev_sample.jsonl")


def _load_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("_ragkit_conftest", ROOT / "tests" / "conftest.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mount_tmpfs(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def build_fixtures(root: Path, mounts: bool = True) -> Fixtures:
    """The tiny model, a 60-passage corpus and its BM25 index, small data files, a label file."""
    from ragkit.datasets import sample_corpus
    from ragkit.retrievers import BM25Retriever

    fx = Fixtures(root=root)
    fx.lm = _load_conftest().build_tiny_lm(root / "tiny-lm")
    corpus = sample_corpus()[:60]
    fx.corpus = root / "corpus.jsonl"
    fx.corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                 for p in corpus), encoding="utf-8")
    fx.index = root / "bm25-index"
    BM25Retriever(show_progress=False).index(corpus).save(fx.index)
    sample = (ROOT / "ragkit" / "data" / "hotpotqa_dev_sample.jsonl").read_text(encoding="utf-8").splitlines()
    fx.hotpot = root / "hotpot3.jsonl"
    fx.hotpot.write_text("\n".join(sample[:3]) + "\n", encoding="utf-8")
    fx.nq = root / "nq5.jsonl"
    nq_src = SHARED / "nq_open" / "nq-open-oracle.jsonl.gz"
    if nq_src.exists():
        with gzip.open(nq_src, "rt", encoding="utf-8") as f:
            fx.nq.write_text("".join(next(f) for _ in range(5)), encoding="utf-8")
    fx.labels = root / "labels.jsonl"
    rows = []
    for i in range(4):
        rows.append({"qid": f"q{i}", "question": f"Which magazine number {i}?", "passage_ids": ["a", "b", "c"],
                     "texts": ["Red Herring is a magazine.", "GameFan was a magazine.", "Paris is in France."],
                     "u": [0.9, 0.2, -0.5], "answers": ["GameFan"]})
    fx.labels.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if mounts:
        if _mount_tmpfs(root / "full", "size=16k"):
            fx.full = root / "full"
        if _mount_tmpfs(root / "ro", "ro,size=16k"):
            fx.ro = root / "ro"
    fx.hashes = _tree_hashes([fx.lm, fx.index, fx.corpus, fx.hotpot, fx.labels])
    return fx


def release_fixtures(fx: Fixtures) -> None:
    for m in (fx.full, fx.ro):
        if m is not None:
            subprocess.run(["umount", str(m)], capture_output=True)


def _tree_hashes(paths: list[Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in paths:
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()) if p.is_dir() else []
        for f in files:
            out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


# ----------------------------------------------------------------------------- cases
Setup = Callable[[Path, Fixtures], None]
Check = Callable[[Path, Fixtures, "Result"], "str | None"]


@dataclass
class Case:
    """One command a user might type, and what ragkit must do with it."""

    group: str
    what: str
    argv: list[str]
    expect: str  # ok | error | usage
    match: str = ""
    setup: Setup | None = None
    env: dict[str, str] = field(default_factory=dict)
    check: Check | None = None
    may_change: tuple[str, ...] = ()  # user files (relative to the case folder) the command may rewrite
    fast: bool = False
    needs: str = ""  # "full" | "ro" | "nq": skipped when missing
    timeout: int = 300


@dataclass
class Result:
    case: Case
    rc: int | None
    out: str
    err: str
    seconds: float
    problems: list[str]
    skipped: str = ""

    @property
    def passed(self) -> bool:
        return not self.problems and not self.skipped

    def outcome(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        lines = [x for x in self.err.splitlines() if x.startswith("ragkit: error:") or x.startswith("usage:")
                 or ": error:" in x]
        msg = lines[-1] if lines else (self.err.strip().splitlines() or self.out.strip().splitlines() or [""])[-1]
        msg = " ".join(msg.split())
        if len(msg) > 220:
            msg = msg[:217] + "..."
        return f"exit {self.rc}: {msg}" if msg else f"exit {self.rc}"


def _both(*setups: Setup) -> Setup:
    def setup(cwd: Path, fx: Fixtures) -> None:
        for f in setups:
            f(cwd, fx)
    return setup


def _w(rel: str, text: str | bytes) -> Setup:
    def setup(cwd: Path, fx: Fixtures) -> None:
        p = cwd / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8")
    return setup


def _seq(*fs: Setup) -> Setup:
    def setup(cwd: Path, fx: Fixtures) -> None:
        for f in fs:
            f(cwd, fx)
    return setup


def _copy_index(rel: str = "idx", tamper: Callable[[Path], None] | None = None) -> Setup:
    def setup(cwd: Path, fx: Fixtures) -> None:
        dst = cwd / rel
        shutil.copytree(fx.index, dst)
        if tamper:
            tamper(dst)
    return setup


def _manifest_edit(fn: Callable[[dict[str, Any]], None], resign: bool = False) -> Callable[[Path], None]:
    """Edit an index manifest; ``resign``: recompute its own checksum too (a user who knows the format)."""
    def tamper(d: Path) -> None:
        m = json.loads((d / "manifest.json").read_text())
        fn(m)
        if resign:
            from ragkit.retrievers.base import MANIFEST_CHECKSUM, _manifest_digest

            m[MANIFEST_CHECKSUM] = _manifest_digest(m)
        (d / "manifest.json").write_text(json.dumps(m))
    return tamper


def _flip_byte(name: str, at: int = 100) -> Callable[[Path], None]:
    def tamper(d: Path) -> None:
        p = d / name
        b = bytearray(p.read_bytes())
        b[min(at, len(b) - 1)] ^= 0x20
        p.write_bytes(bytes(b))
    return tamper


def _truncate(name: str) -> Callable[[Path], None]:
    def tamper(d: Path) -> None:
        p = d / name
        p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size // 2)])
    return tamper


def _index_files(d: Path) -> list[str]:
    return sorted(json.loads((d / "manifest.json").read_text()).get("files", {}))


def _flip_first_array(d: Path) -> None:
    names = [n for n in _index_files(d) if n.endswith(".npy") or n.endswith(".npz")] or _index_files(d)
    _flip_byte(names[0], 300)(d)


def _symlink_out(d: Path) -> None:
    name = "passages.jsonl" if (d / "passages.jsonl").exists() else _index_files(d)[0]
    outside = d.parent / "outside.jsonl"
    shutil.move(str(d / name), outside)
    (d / name).symlink_to(outside)


def _passages(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _plist(n: int = 3, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "title": f"T{i}", "text": f"Passage {i} about magazines and Red Herring {i}.",
             **extra} for i in range(n)]


def _pickled_bin(cwd: Path, fx: Fixtures) -> None:
    d = cwd / "student"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForSequenceClassification"],
                                               "vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 1,
                                               "num_attention_heads": 1, "intermediate_size": 4}))
    import pickle

    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"evil": "os.system"}))


def _no_file(rel: str) -> Check:
    def check(cwd: Path, fx: Fixtures, r: Result) -> str | None:
        p = cwd / rel
        return f"{rel} was written by a refused run" if p.exists() else None
    return check


def _only_matches(cwd: Path, fx: Fixtures, r: Result) -> str | None:
    """BM25 with ``-k`` above the corpus lists the passages a query term weighs on, each once, all
    scoring above 0 (never padded with the non-matching rest of the corpus)."""
    ranks = [int(m) for m in re.findall(r'"rank": (\d+)', r.out)]
    scores = [float(m) for m in re.findall(r'"score": (-?[\d.e+-]+)', r.out)]
    if not ranks or ranks != list(range(1, len(ranks) + 1)):
        return f"ranks not 1..n: {ranks[:5]}"
    if len(scores) != len(ranks) or min(scores) <= 0:
        return "a listed passage has no positive score (padding with non-matching passages)"
    return None


def _json_has(rel: str, pred: Callable[[Any], bool], what: str) -> Check:
    def check(cwd: Path, fx: Fixtures, r: Result) -> str | None:
        p = cwd / rel
        if not p.exists():
            return f"{rel} missing"
        try:
            ok = pred(json.loads(p.read_text(encoding="utf-8")))
        except Exception as e:  # noqa: BLE001 - a failed check is a finding, not a crash
            return f"{rel}: {e}"
        return None if ok else f"{rel}: {what}"
    return check


def _sweep_done(cwd: Path, fx: Fixtures, r: Result) -> str | None:
    """The sweep wrote its rows and removed its partial file (the result holds every row)."""
    if (cwd / "s.json.partial.jsonl").exists():
        return "s.json.partial.jsonl left behind after a finished sweep"
    return _json_has("s.json", lambda d: d["rows"], "no rows")(cwd, fx, r)


def _still_link(rel: str, target: str) -> Check:
    def check(cwd: Path, fx: Fixtures, r: Result) -> str | None:
        if not (cwd / rel).is_symlink():
            return f"{rel} is no longer a symbolic link"
        return None if (cwd / target / "manifest.json").is_file() else f"{target} holds no index"
    return check


def _killed_save(out: str) -> Setup:
    """``<out>.tmp-killed``: the temp folder of a save killed by ``kill -9`` (its marker names a gone PID)."""
    def setup(cwd: Path, fx: Fixtures) -> None:
        import socket

        d = cwd / f"{out}.tmp-killed"
        d.mkdir()
        (d / "passages.jsonl").write_text("x" * 100_000)
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc/sys/kernel/pid_max").exists() \
            else 2**22
        (d / ".ragkit-tmp.json").write_text(json.dumps({"ragkit_temp": 1, "host": socket.gethostname(),
                                                        "pid": pid_max + 1, "start": "1"}))
    return setup


def _still_device(cwd: Path, fx: Fixtures, r: Result) -> str | None:
    import stat

    p = Path("/dev/full")
    if p.exists() and not stat.S_ISCHR(p.stat().st_mode):
        return "/dev/full was replaced by a regular file"
    return None


def _mount_clean(sub: str = "") -> Check:
    """No torn or temporary file on the full tmpfs after the refused write (whole JSON/JSONL files may stay:
    an eval's partial file is kept on purpose, to resume)."""
    def check(cwd: Path, fx: Fixtures, r: Result) -> str | None:
        if fx.full is None:
            return None
        bad = []
        for p in fx.full.rglob("*"):
            if not p.is_file() or p.name.endswith(".lock"):
                continue
            text = p.read_text(encoding="utf-8", errors="replace")
            try:
                if p.suffix == ".jsonl":
                    [json.loads(x) for x in text.splitlines() if x.strip()]
                    ok = text.endswith("\n")
                else:
                    json.loads(text)
                    ok = p.suffix == ".json"
            except ValueError:
                ok = False
            if not ok:
                bad.append(p.name)
        for p in fx.full.iterdir():  # empty the tmpfs for the next case
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return f"torn or temporary files left on the full disk: {bad}" if bad else None
    return check


LM = "{lm}"
Q = "Which Company published a magazine that was a hybrid video game/film, Red Herring or GameFan?"
BIG_Q = "magazine " * 12_000  # ~108 KB
H23 = "9" * 23  # a count of 23 digits
torn_eval_partial = None  # set below (needs the fingerprint of a real run, made by the previous case)


def cases() -> list[Case]:
    """Every case, in the order they run."""
    C = Case
    out: list[Case] = []
    add = out.append

    # -- the command line itself
    add(C("cli", "no arguments", [], "usage", r"COMMAND", fast=True))
    add(C("cli", "--version", ["--version"], "ok", r"ragkit \d", fast=True))
    add(C("cli", "--help", ["--help"], "ok", r"usage: ragkit", fast=True))
    add(C("cli", "unknown command", ["serch", "--query", "x"], "usage", r"invalid choice", fast=True))
    add(C("cli", "`train` alone lists its methods", ["train"], "usage", r"cord.*psgrpo|psgrpo", fast=True))
    add(C("cli", "`eval --help`", ["eval", "--help"], "ok", r"sweep", fast=True))
    add(C("cli", "--quiet and -v after the subcommand", ["search", "--query", "Red Herring", "-k", "2", "--quiet"],
          "ok", r"Red Herring", fast=True))
    add(C("cli", "--quiet before the subcommand", ["--quiet", "search", "--query", "GameFan", "-k", "1"], "ok",
          r"GameFan", fast=True))
    add(C("cli", "unknown option", ["search", "--query", "x", "--kk", "3"], "usage", r"unrecognized", fast=True))
    add(C("cli", "`distill` without --labels", ["distill"], "error", r"--labels", fast=True))
    add(C("cli", "`train cord --help`", ["train", "cord", "--help"], "ok", r"--output_dir"))

    # -- search
    add(C("search", "empty query", ["search", "--query", ""], "error", r"empty", fast=True))
    add(C("search", "blank query", ["search", "--query", "   "], "error", r"empty", fast=True))
    add(C("search", "only stop words", ["search", "--query", "the of and is", "--json"], "ok",
          r'"hits": \[\]|no indexed term|none of', fast=True))
    add(C("search", "CJK without word breaks", ["search", "--query", "東京都庁舎の歴史"], "ok", r"query:", fast=True))
    add(C("search", "100 KB query", ["search", "--query", BIG_Q], "error", r"query|long|limit", fast=True))
    add(C("search", "-k 0", ["search", "--query", "x", "-k", "0"], "usage", r">= 1", fast=True))
    add(C("search", "-k -1", ["search", "--query", "x", "-k", "-1"], "usage", r">= 1", fast=True))
    add(C("search", "-k abc", ["search", "--query", "x", "-k", "abc"], "usage", r"whole number", fast=True))
    add(C("search", "-k of 23 digits", ["search", "--query", "x", "-k", H23], "usage", r"-k/--k: must be at most",
          fast=True))
    add(C("search", "-k larger than the corpus", ["search", "--index", "{index}", "--query", "magazine", "-k",
                                                   "100000", "--json"], "ok", r'"rank": 1,',
          check=_only_matches))
    add(C("search", "--index missing", ["search", "--index", "nope", "--query", "x"], "error", r"nope", fast=True))
    add(C("search", "--index is a file", ["search", "--index", "notes.txt", "--query", "x"], "error",
          r"notes.txt", fast=True))
    add(C("search", "--index empty folder", ["search", "--index", "empty", "--query", "x"], "error",
          r"manifest|index", setup=lambda c, f: (c / "empty").mkdir(), fast=True))
    add(C("search", "--index a folder of user files", ["search", "--index", "project", "--query", "x"], "error",
          r"manifest|index", fast=True))
    add(C("search", "manifest deleted", ["search", "--index", "idx", "--query", "x"], "error", r"manifest",
          setup=_copy_index(tamper=lambda d: (d / "manifest.json").unlink()), fast=True))
    add(C("search", "manifest not JSON", ["search", "--index", "idx", "--query", "x"], "error", r"manifest",
          setup=_copy_index(tamper=lambda d: (d / "manifest.json").write_text("{not json")), fast=True))
    add(C("search", "manifest is a JSON list", ["search", "--index", "idx", "--query", "x"], "error", r"manifest",
          setup=_copy_index(tamper=lambda d: (d / "manifest.json").write_text("[1, 2]"))))
    add(C("search", "manifest without its file list", ["search", "--index", "idx", "--query", "x"], "error",
          r"files|damaged", setup=_copy_index(tamper=_manifest_edit(lambda m: m.pop("files", None))), fast=True))
    add(C("search", "manifest file list with ../../etc/passwd", ["search", "--index", "idx", "--query", "x"],
          "error", r"damaged",
          setup=_copy_index(tamper=_manifest_edit(lambda m: m["files"].update({"../../../../etc/passwd": "0" * 64})))))
    add(C("search", "manifest file list with an absolute path", ["search", "--index", "idx", "--query", "x"],
          "error", r"damaged",
          setup=_copy_index(tamper=_manifest_edit(lambda m: m["files"].update({"/etc/hostname": "0" * 64})))))
    for what, edit, pat in (
        ("file list with ../../etc/passwd", lambda m: m["files"].update({"../../../../etc/passwd": "0" * 64}),
         r"not a plain relative path"),
        ("file list with an absolute path", lambda m: m["files"].update({"/etc/hostname": "0" * 64}),
         r"not a plain relative path"),
        ("file list without passages.jsonl", lambda m: m["files"].pop("passages.jsonl"), r"does not list"),
        ("file list emptied", lambda m: m.update({"files": {}}), r"does not list"),
        ("an unknown field", lambda m: m.update({"evil_field": 1}), r"unknown field"),
        ("'files' removed", lambda m: m.pop("files"), r"lacks the field"),
        ("n_docs 0", lambda m: m.update({"n_docs": 0}), r"n_docs"),
        ("n_docs a string", lambda m: m.update({"n_docs": "60"}), r"n_docs"),
    ):
        add(C("search", f"re-signed manifest: {what}", ["search", "--index", "idx", "--query", "x"], "error", pat,
              setup=_copy_index(tamper=_manifest_edit(edit, resign=True))))
    add(C("search", "manifest with an unknown field", ["search", "--index", "idx", "--query", "x"], "error",
          r"unknown|field|manifest",
          setup=_copy_index(tamper=_manifest_edit(lambda m: m.update({"evil_field": 1})))))
    add(C("search", "manifest without 'kind'", ["search", "--index", "idx", "--query", "x"], "error",
          r"kind|manifest", setup=_copy_index(tamper=_manifest_edit(lambda m: m.pop("kind", None)))))
    add(C("search", "manifest kind 'foo'", ["search", "--index", "idx", "--query", "x"], "error", r"foo|kind",
          setup=_copy_index(tamper=_manifest_edit(lambda m: m.update({"kind": "foo"})))))
    add(C("search", "manifest checksum edited", ["search", "--index", "idx", "--query", "x"], "error",
          r"checksum|damaged|manifest",
          setup=_copy_index(tamper=_manifest_edit(
              lambda m: m["files"].update({k: "0" * len(v) for k, v in m["files"].items()})))))
    add(C("search", "a passage file byte flipped", ["search", "--index", "idx", "--query", "x"], "error",
          r"checksum|damaged|changed", setup=_copy_index(tamper=_flip_byte("passages.jsonl")), fast=True))
    add(C("search", "an index array byte flipped", ["search", "--index", "idx", "--query", "x"], "error",
          r"checksum|damaged|changed", setup=_copy_index(tamper=_flip_first_array)))
    add(C("search", "passages file truncated", ["search", "--index", "idx", "--query", "x"], "error",
          r"checksum|damaged|changed|size", setup=_copy_index(tamper=_truncate("passages.jsonl"))))
    add(C("search", "an index file deleted", ["search", "--index", "idx", "--query", "x"], "error",
          r"missing|damaged|no such",
          setup=_copy_index(tamper=lambda d: (d / _index_files(d)[-1]).unlink())))
    add(C("search", "an index file is a symlink leaving the folder", ["search", "--index", "idx", "--query", "x"],
          "error", r"symlink|outside|link", setup=_copy_index(tamper=_symlink_out)))
    add(C("search", "an extra file dropped into the index", ["search", "--index", "idx", "--query", "magazine",
                                                              "-k", "1"], "ok", r"query:",
          setup=_copy_index(tamper=lambda d: (d / "README.txt").write_text("user note"))))
    add(C("search", "--embedder on a BM25 index", ["search", "--index", "{index}", "--query", "x",
                                                  "--embedder", "foo"], "error", r"embedder|bm25|dense"))
    add(C("search", "--device cuda", ["search", "--query", "x", "--device", "cuda"], "error", r"CUDA", fast=True))
    add(C("search", "--out is a folder", ["search", "--query", "x", "--out", "project"], "error", r"folder",
          fast=True))
    add(C("search", "--out in a missing folder", ["search", "--query", "magazine", "-k", "1", "--out",
                                                  "new/sub/r.json"], "ok", r"query:",
          check=_json_has("new/sub/r.json", lambda d: d["results"], "no results")))
    add(C("search", "--out whose parent is a file", ["search", "--query", "x", "--out", "notes.txt/r.json"],
          "error", r"notes.txt"))
    add(C("search", "--out /dev/full (a device: written into, never replaced)",
          ["search", "--query", "magazine", "--out", "/dev/full"], "error", r"could not write /dev/full",
          check=_still_device))
    add(C("search", "--out on a full disk", ["search", "--query", "magazine", "-k", "100", "--out",
                                             "{full}/r.json"], "error", r"r\.json|space", needs="full",
          check=_mount_clean()))
    add(C("search", "--out on a read-only disk", ["search", "--query", "magazine", "--out", "{ro}/r.json"],
          "error", r"read-only|r\.json", needs="ro"))
    add(C("search", "--out overwrites the user's own file", ["search", "--query", "magazine", "-k", "1", "--out",
                                                            "notes.txt"], "ok", r"query:", may_change=("notes.txt",)))
    add(C("search", "three queries in one batch", ["search", "-q", "Red Herring", "-q", "GameFan", "-q", "Paris",
                                                   "-k", "1", "--json"], "ok", r"GameFan"))

    # -- index
    add(C("index", "no --out", ["index"], "usage", r"--out", fast=True))
    add(C("index", "--out the project folder", ["index", "--corpus", "project/corpus.jsonl", "--out", "project"],
          "error", r"did not write|never replace",
          setup=lambda c, f: shutil.copy(f.corpus, c / "project" / "corpus.jsonl"), fast=True))
    add(C("index", "--out the current folder", ["index", "--corpus", "{corpus}", "--out", "."], "error",
          r"did not write|never replace", fast=True))
    add(C("index", "--out the project folder with --overwrite", ["index", "--corpus", "{corpus}", "--out",
                                                                 "project", "--overwrite"], "error",
          r"did not write|never replace"))
    add(C("index", "--out a user's file", ["index", "--corpus", "{corpus}", "--out", "notes.txt"], "error",
          r"notes.txt", fast=True))
    add(C("index", "--out a previous index (replaced: same kind of ragkit artifact)",
          ["index", "--corpus", "{corpus}", "--out", "idx", "--quiet"], "ok", r"indexed 60", setup=_copy_index(),
          may_change=("idx",)))
    add(C("index", "--out a previous index --overwrite", ["index", "--corpus", "{corpus}", "--out", "idx",
                                                         "--overwrite", "--quiet"], "ok", r"indexed 60",
          setup=_copy_index(), may_change=tuple(f"idx/{n}" for n in ("manifest.json", "passages.jsonl",
                                                                     "bm25", "params.json"))))
    add(C("index", "--corpus missing", ["index", "--corpus", "nope.jsonl", "--out", "i"], "error", r"nope",
          check=_no_file("i"), fast=True))
    add(C("index", "--corpus empty", ["index", "--corpus", "e.jsonl", "--out", "i"], "error", r"empty|no passages",
          setup=_w("e.jsonl", ""), check=_no_file("i"), fast=True))
    add(C("index", "--corpus not JSON", ["index", "--corpus", "c.txt", "--out", "i"], "error", r"line 1|JSON",
          setup=_w("c.txt", "hello world\nsecond line\n"), check=_no_file("i"), fast=True))
    add(C("index", "--corpus a JSON array", ["index", "--corpus", "c.json", "--out", "i"], "error",
          r"line|object|JSON", setup=_w("c.json", json.dumps(_plist()))))
    add(C("index", "--corpus line without text", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"text", setup=_w("c.jsonl", _passages([{"id": "a", "title": "t"}])), fast=True))
    add(C("index", "--corpus null id", ["index", "--corpus", "c.jsonl", "--out", "i"], "error", r"id",
          setup=_w("c.jsonl", _passages([{"id": None, "text": "x"}, {"id": "b", "text": "y"}]))))
    add(C("index", "--corpus null text", ["index", "--corpus", "c.jsonl", "--out", "i"], "error", r"text",
          setup=_w("c.jsonl", _passages([{"id": "a", "text": None}]))))
    add(C("index", "--corpus number text", ["index", "--corpus", "c.jsonl", "--out", "i"], "error", r"text",
          setup=_w("c.jsonl", _passages([{"id": "a", "text": 12}]))))
    add(C("index", "--corpus duplicate ids", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"duplicate|unique", setup=_w("c.jsonl", _passages([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]))))
    add(C("index", "--corpus a 5 MB passage", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"long|limit|MB|characters", setup=_w("c.jsonl", _passages([{"id": "a", "text": "word " * 1_100_000}])),
          check=_no_file("i")))
    add(C("index", "--corpus binary garbage", ["index", "--corpus", "c.bin", "--out", "i"], "error",
          r"c\.bin|UTF-8|JSON", setup=_w("c.bin", bytes(range(256)) * 50), fast=True))
    add(C("index", "--corpus a folder", ["index", "--corpus", "project", "--out", "i"], "error", r"project",
          fast=True))
    add(C("index", "--corpus truncated .gz", ["index", "--corpus", "c.jsonl.gz", "--out", "i"], "error",
          r"c\.jsonl\.gz|gzip|compressed|truncated|end",
          setup=_w("c.jsonl.gz", gzip.compress(_passages(_plist(50)).encode())[:120])))
    add(C("index", "--corpus with a torn last line", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"c\.jsonl:3", setup=_w("c.jsonl", _passages(_plist(2)) + '{"id": "p2", "te')))
    add(C("index", "--corpus all-empty texts", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"empty|text", setup=_w("c.jsonl", _passages([{"id": "a", "text": ""}, {"id": "b", "text": "  "}]))))
    add(C("index", "--corpus ok (60 passages)", ["index", "--corpus", "{corpus}", "--out", "i", "--quiet"], "ok",
          r"indexed 60", check=_json_has("i/manifest.json", lambda m: m.get("kind") == "bm25", "kind")))
    add(C("index", "--kind dense --embedder missing folder", ["index", "--corpus", "{corpus}", "--out", "i",
                                                             "--kind", "dense", "--embedder", "./no-such"],
          "error", r"no-such|no such", check=_no_file("i")))
    add(C("index", "--kind dense --embedder a text file", ["index", "--corpus", "{corpus}", "--out", "i", "--kind",
                                                           "dense", "--embedder", "notes.txt"], "error",
          r"notes.txt|not a"))
    add(C("index", "--kind dense --embedder hub id offline", ["index", "--corpus", "{corpus}", "--out", "i",
                                                              "--kind", "dense", "--embedder",
                                                              "someone/no-such-model"], "error",
          r"hub|offline|reachable|local"))
    add(C("index", "--kind dense --device cuda", ["index", "--out", "i", "--kind", "dense", "--device", "cuda"],
          "error", r"CUDA", fast=True))
    add(C("index", "--method foo", ["index", "--corpus", "{corpus}", "--out", "i", "--method", "foo"], "error",
          r"foo"))
    add(C("index", "--batch-size 0", ["index", "--out", "i", "--batch-size", "0"], "usage", r">= 1", fast=True))
    add(C("index", "--out on a full disk", ["index", "--corpus", "{corpus}", "--out", "{full}/i"], "error",
          r"space|full|i\b", needs="full", check=_mount_clean()))
    add(C("index", "--out on a read-only disk", ["index", "--corpus", "{corpus}", "--out", "{ro}/i"], "error",
          r"read-only|ro/i", needs="ro"))
    add(C("index", "--out under a file", ["index", "--corpus", "{corpus}", "--out", "notes.txt/i"], "error",
          r"notes.txt"))
    # an --out that merely *looks* like an artifact: ragkit deletes only files its own verified list names
    add(C("index", "--out an index folder holding the user's notes",
          ["index", "--corpus", "{corpus}", "--out", "idx", "--overwrite"], "error", r"NOTES\.md.*move them out",
          setup=_seq(_copy_index(), _w("idx/NOTES.md", "my notes\n"), _w("idx/eval-runs/run1.json", "{}\n")),
          fast=True))
    add(C("index", "--out a project folder holding a copy of an index manifest.json",
          ["index", "--corpus", "{corpus}", "--out", "project", "--overwrite"], "error", r"project",
          setup=_seq(_w("project/README.md", "# mine\n"),
                     lambda c, f: shutil.copy(f.index / "manifest.json", c / "project" / "manifest.json"))))
    add(C("index", "--out a web app whose manifest.json mentions ragkit-index",
          ["index", "--corpus", "{corpus}", "--out", "webapp", "--overwrite"], "error",
          r"did not write|does not verify",
          setup=_seq(_w("webapp/static/app.js", "console.log(1)\n"),
                     _w("webapp/manifest.json", json.dumps({"name": "demo", "format": "ragkit-index"})))))
    add(C("index", "--out a data folder with a stray marker, its corpus being indexed",
          ["index", "--corpus", "data/raw/corpus.jsonl", "--out", "data", "--overwrite"], "error",
          r"raw/corpus\.jsonl",
          setup=_seq(_w("data/.ragkit-artifact.json", json.dumps({"kind": "index", "format": 1})),
                     lambda c, f: (c / "data" / "raw").mkdir(parents=True) or shutil.copy(
                         f.corpus, c / "data" / "raw" / "corpus.jsonl")), fast=True))
    add(C("index", "--out a symlink to an empty folder (the link stays)", ["index", "--corpus", "{corpus}", "--out",
                                                                          "idx", "--quiet"], "ok", r"indexed 60",
          setup=lambda c, f: (c / "disk" / "idx").mkdir(parents=True) or (c / "idx").symlink_to(c / "disk" / "idx"),
          check=_still_link("idx", "disk/idx"), fast=True))
    add(C("index", "a temp folder left by a killed save is removed", ["index", "--corpus", "{corpus}", "--out", "i",
                                                                      "--quiet"], "ok", r"indexed 60",
          setup=_killed_save("i"), may_change=("i.tmp-killed",), check=_no_file("i.tmp-killed"), fast=True))

    # -- ask
    add(C("index", "--corpus id of 1,000,000 characters", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"1,000,000 characters", setup=_w("c.jsonl", _passages([{"id": "x" * 1_000_000, "text": "a"}])),
          check=_no_file("i")))
    add(C("index", "--corpus id with a newline", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"c\.jsonl:2: .*control character", setup=_w("c.jsonl", _passages([{"id": "a", "text": "x"},
                                                                            {"id": "b\nc", "text": "y"}])),
          fast=True))
    add(C("index", "--corpus id with a NUL", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"control character", setup=_w("c.jsonl", _passages([{"id": "b\x00c", "text": "y"}]))))
    add(C("index", "--corpus ids equal after Unicode NFC normalisation", ["index", "--corpus", "c.jsonl", "--out",
                                                                         "i"], "error", r"Unicode normalisation",
          setup=_w("c.jsonl", _passages([{"id": "caf\u00e9", "text": "x"}, {"id": "cafe\u0301", "text": "y"}])),
          fast=True))
    add(C("index", "--corpus starting with a UTF-8 BOM (read)", ["index", "--corpus", "c.jsonl", "--out", "i",
                                                                 "--quiet"], "ok", r"indexed 3",
          setup=_w("c.jsonl", "\ufeff" + _passages(_plist(3))), fast=True))
    add(C("index", "--corpus line nested 100,000 levels deep", ["index", "--corpus", "c.jsonl", "--out", "i"], "error",
          r"c\.jsonl:1: the JSON is nested too deeply", setup=_w("c.jsonl", '{"id": "a", "text": ' + "[" * 100_000
                                                                  + "]" * 100_000 + "}\n"), fast=True))
    add(C("ask", "empty question", ["ask", "", "--model", LM], "error", r"empty", fast=True))
    add(C("ask", "blank question", ["ask", "   ", "--model", "./no-such"], "error", r"empty", fast=True))
    add(C("ask", "--model missing folder", ["ask", Q, "--model", "./no-such"], "error", r"no such|no-such",
          fast=True))
    add(C("ask", "--model a text file", ["ask", Q, "--model", "notes.txt"], "error", r"notes.txt"))
    add(C("ask", "--model empty folder", ["ask", Q, "--model", "empty"], "error", r"empty|config|model",
          setup=lambda c, f: (c / "empty").mkdir()))
    add(C("ask", "--model folder with a broken config", ["ask", Q, "--model", "m"], "error", r"config|m\b",
          setup=_w("m/config.json", "{broken")))
    add(C("ask", "--model a hub id offline", ["ask", Q, "--model", "someone/no-such-model"], "error",
          r"hub|reachable|local folder"))
    add(C("ask", "--model a .gguf that is not one", ["ask", Q, "--model", "fake.gguf"], "error", r"gguf|fake",
          setup=_w("fake.gguf", b"not a gguf file")))
    add(C("ask", "--device cuda", ["ask", Q, "--device", "cuda"], "error", r"CUDA", fast=True))
    add(C("ask", "--device nonsense", ["ask", Q, "--model", LM, "--device", "tpu9"], "error", r"tpu9|device"))
    add(C("ask", "--index missing", ["ask", Q, "--model", LM, "--index", "nope"], "error", r"nope"))
    add(C("ask", "-k 0", ["ask", Q, "-k", "0"], "usage", r">= 1", fast=True))
    add(C("ask", "--budget 0", ["ask", Q, "--budget", "0"], "usage", r">= 1", fast=True))
    add(C("ask", "--design foo", ["ask", Q, "--design", "foo"], "usage", r"invalid choice", fast=True))
    add(C("ask", "--passage-max-tokens -1", ["ask", Q, "--passage-max-tokens", "-1"], "usage", r">= 0", fast=True))
    add(C("ask", "--profile missing", ["ask", Q, "--model", LM, "--profile", "p.json"], "error", r"p\.json"))
    add(C("ask", "--profile not JSON", ["ask", Q, "--model", LM, "--profile", "p.json"], "error",
          r"p\.json|JSON", setup=_w("p.json", "weights: 1 2 3")))
    add(C("ask", "--profile with NaN weights", ["ask", Q, "--model", LM, "--profile", "p.json"], "error",
          r"NaN|finite|weight", setup=_w("p.json", '{"weights": [NaN, 1, 1, 1, 1, 1, 1, 1, 1, 1]}')))
    add(C("ask", "--profile with 2-D weights", ["ask", Q, "--model", LM, "--profile", "p.json"], "error",
          r"p\.json: .*flat list", setup=_w("p.json", '{"weights": [[0.5, 0.5], [0.3, 0.7]]}'), fast=True))
    add(C("ask", "--profile with weights: true", ["ask", Q, "--model", LM, "--profile", "p.json"], "error",
          r"p\.json: .*flat list", setup=_w("p.json", '{"weights": true}'), fast=True))
    add(C("ask", "--profile whose sum overflows (kept, not flattened)", ["ask", Q, "--model", LM, "--profile",
                                                                        "p.json", "--json"], "ok", r'"answer"',
          setup=_w("p.json", json.dumps({"weights": [1e308] * 9 + [5e307]}))))
    add(C("ask", "--profile measured for another model (warned)", ["ask", Q, "--model", LM, "--profile", "p.json"],
          "ok", r"measured for other/Model-70B",
          setup=_w("p.json", json.dumps({"weights": [0.1] * 10, "model": "other/Model-70B", "template": "chat"}))))
    add(C("ask", "-k 5000 (more passages than the context holds)", ["ask", Q, "--model", LM, "-k", "5000"], "error",
          r"-k 5000: .*use -k \d+"))
    add(C("ask", "--model URL with port 99999", ["ask", Q, "--model", "http://127.0.0.1:99999/v1"], "error",
          r"--model http://127\.0\.0\.1:99999/v1: .*1-65535", fast=True))
    add(C("ask", "--model URL with a password and a bad port (masked)",
          ["ask", Q, "--model", "http://user:hunter2@127.0.0.1:99999999/v1"], "error", r"\*\*\*:\*\*\*@127",
          check=lambda c, f, r: "password shown" if "hunter2" in r.out + r.err else None, fast=True))
    add(C("ask", "--model URL without a host", ["ask", Q, "--model", "http://"], "error", r"names no host", fast=True))
    add(C("ask", "--device foo", ["ask", Q, "--device", "foo"], "error", r"--device 'foo' is not a device"))
    add(C("ask", "--profile nested 100,000 levels deep", ["ask", Q, "--profile", "p.json"], "error",
          r"p\.json: the JSON is nested too deeply", setup=_w("p.json", "[" * 100_000 + "]" * 100_000), fast=True))
    add(C("ask", "--out is a folder", ["ask", Q, "--out", "project"], "error", r"folder", fast=True))
    add(C("ask", "a 100 KB question", ["ask", BIG_Q, "--model", LM], "error", r"query|question|long|limit"))
    add(C("ask", "tiny model, bundled sample", ["ask", Q, "--model", LM, "--json"], "ok", r'"answer"',
          check=lambda c, f, r: None if "Red Herring (magazine)" in r.out else "gold paragraph not retrieved"))
    add(C("ask", "tiny model, --no-moi", ["ask", Q, "--model", LM, "--no-moi"], "ok", r"Answer:"))
    add(C("ask", "tiny model, --design prior --budget 2", ["ask", Q, "--model", LM, "--design", "prior",
                                                          "--budget", "2"], "ok", r"Answer:"))
    add(C("ask", "tiny model, saved index", ["ask", Q, "--model", LM, "--index", "{index}", "-k", "3"], "ok",
          r"Answer:"))
    add(C("ask", "read-only RAGKIT_CACHE (default model)", ["ask", Q], "error", r"RAGKIT_CACHE|writable",
          env={"RAGKIT_CACHE": "{ro}/cache"}, needs="ro", timeout=120))
    add(C("ask", "RAGKIT_CACHE is a file (default model)", ["ask", Q], "error", r"RAGKIT_CACHE|writable",
          env={"RAGKIT_CACHE": "{cwd}/notes.txt"}, timeout=120, fast=True))
    add(C("ask", "--out /dev/full", ["ask", Q, "--model", LM, "--no-moi", "--out", "/dev/full"], "error",
          r"could not write /dev/full", check=_still_device))

    # -- rerank
    rr = ["rerank", "--query", Q, "--passages", "p.jsonl"]
    add(C("rerank", "--passages missing", [*rr, "--reranker", "none"], "error", r"p\.jsonl", fast=True))
    add(C("rerank", "--passages empty", [*rr, "--reranker", "none"], "error", r"no passages",
          setup=_w("p.jsonl", ""), fast=True))
    add(C("rerank", "--passages not JSON", [*rr, "--reranker", "none"], "error", r"line 1|JSON",
          setup=_w("p.jsonl", "a b c\n"), fast=True))
    add(C("rerank", "--passages a folder", ["rerank", "--query", "x", "--passages", "project", "--reranker",
                                            "none"], "error", r"project", fast=True))
    add(C("rerank", "NaN retriever score", [*rr, "--reranker", "none"], "error", r"NaN|finite|score",
          setup=_w("p.jsonl", _passages(_plist(2, score=1.0)).replace("1.0", "NaN", 1)), fast=True))
    add(C("rerank", "Infinity retriever score", [*rr, "--reranker", "none"], "error", r"inf|finite|score",
          setup=_w("p.jsonl", _passages(_plist(2, score=1.0)).replace("1.0", "Infinity", 1))))
    add(C("rerank", "score is a string", [*rr, "--reranker", "none"], "error", r"score",
          setup=_w("p.jsonl", _passages(_plist(2, score="high")))))
    add(C("rerank", "scores on some lines only", [*rr, "--reranker", "none"], "error", r"score",
          setup=_w("p.jsonl", _passages([{**_plist(1)[0], "score": 1.0}, {"id": "b", "text": "x"}]))))
    add(C("rerank", "duplicate passage ids", [*rr, "--reranker", "none"], "error", r"duplicate|unique",
          setup=_w("p.jsonl", _passages(_plist(1) * 2)), fast=True))
    add(C("rerank", "null id", [*rr, "--reranker", "none"], "error", r"id",
          setup=_w("p.jsonl", _passages([{"id": None, "text": "x"}]))))
    add(C("rerank", "passage without text", [*rr, "--reranker", "none"], "error", r"text",
          setup=_w("p.jsonl", _passages([{"id": "a"}]))))
    add(C("rerank", "a 5 MB passage, --reranker none (never read)", [*rr, "--reranker", "none"], "ok", r"\ba\b",
          setup=_w("p.jsonl", _passages([{"id": "a", "text": "word " * 1_100_000}]))))
    add(C("rerank", "a 5 MB passage, MoI (cut to the context window)", [*rr, "--model", LM, "--design", "prior",
                                                                       "--budget", "2"],
          "ok|error", r"\ba\b|long|limit", setup=_w("p.jsonl", _passages([{"id": "a", "text": "word " * 1_100_000},
                                                                          {"id": "b", "text": "GameFan"}]))))
    add(C("rerank", "empty query", ["rerank", "--query", "", "--passages", "p.jsonl", "--reranker", "none"],
          "error", r"empty", setup=_w("p.jsonl", _passages(_plist(2))), fast=True))
    add(C("rerank", "reranker typo", [*rr, "--reranker", "moii"], "error", r"moii",
          setup=_w("p.jsonl", _passages(_plist(2))), fast=True))
    add(C("rerank", "student folder missing", [*rr, "--reranker", "student:./nope"], "error", r"nope",
          setup=_w("p.jsonl", _passages(_plist(2)))))
    add(C("rerank", "student folder with a pickled .bin", [*rr, "--reranker", "student:student"], "error",
          r"not a ragkit distilled|pickle|safetensors|\.bin",
          setup=_seq(_w("p.jsonl", _passages(_plist(2))), _pickled_bin)))
    add(C("rerank", "student folder with a ragkit_distill.json and a pickled .bin", [*rr, "--reranker",
                                                                                   "student:student"], "error",
          r"refused to load pickled",
          setup=_seq(_w("p.jsonl", _passages(_plist(2))), _pickled_bin,
                     _w("student/ragkit_distill.json", json.dumps({"format": "ragkit-distilled-reranker/1"})))))
    add(C("rerank", "bare folder with a pickled .bin", [*rr, "--reranker", "student"], "error",
          r"not a ragkit distilled|pickle|safetensors|\.bin",
          setup=_seq(_w("p.jsonl", _passages(_plist(2))), _pickled_bin)))
    add(C("rerank", "cross-encoder hub id offline", [*rr, "--reranker", "cross-encoder:someone/no-such"], "error",
          r"hub|reachable|local|no-such", setup=_w("p.jsonl", _passages(_plist(2)))))
    add(C("rerank", "--reranker none", [*rr, "--reranker", "none"], "ok", r"p0",
          setup=_w("p.jsonl", _passages(_plist(3, score=1.0)))))
    add(C("rerank", "--reranker random", [*rr, "--reranker", "random"], "ok", r"p\d",
          setup=_w("p.jsonl", _passages(_plist(3)))))
    add(C("rerank", "one passage, MoI, tiny model", [*rr, "--model", LM], "ok", r"p0",
          setup=_w("p.jsonl", _passages(_plist(1)))))
    add(C("rerank", "MoI with tiny model", [*rr, "--model", LM, "--json"], "ok", r'"consensus_answer"',
          setup=_w("p.jsonl", _passages(_plist(4)))))
    add(C("rerank", "--budget 0", [*rr, "--budget", "0"], "usage", r">= 1", fast=True))
    add(C("rerank", "--out is a folder", [*rr, "--out", "project"], "error", r"folder", fast=True))
    add(C("rerank", "--model missing", [*rr, "--model", "./no-such"], "error", r"no such|no-such",
          setup=_w("p.jsonl", _passages(_plist(2)))))

    # -- eval
    ev = ["eval", "--model", LM, "--quiet"]
    add(C("eval", "--limit -1", ["eval", "--limit", "-1"], "usage", r">= 1", fast=True))
    add(C("eval", "--limit 0", ["eval", "--limit", "0"], "usage", r">= 1", fast=True))
    add(C("eval", "--limit abc", ["eval", "--limit", "abc"], "usage", r"whole number", fast=True))
    add(C("eval", "--max-new-tokens 0", ["eval", "--max-new-tokens", "0"], "usage", r">= 1", fast=True))
    add(C("eval", "-k 0", ["eval", "-k", "0"], "usage", r">= 1", fast=True))
    add(C("eval", "--chunk-size 0", ["eval", "--chunk-size", "0"], "usage", r">= 1", fast=True))
    add(C("eval", "--bootstrap 0", ["eval", "--bootstrap", "0"], "usage", r">= 1", fast=True))
    add(C("eval", "--methods ''", ["eval", "--methods", ""], "usage", r"at least one", fast=True))
    add(C("eval", "--methods typo (before any model loads)", ["eval", "--methods", "none,mio", "--model",
                                                              "./no-such"], "error", r"mio", fast=True))
    add(C("eval", "--methods repeated", [*ev, "--methods", "none,none", "--limit", "1"], "error",
          r"twice|duplicate|repeated"))
    add(C("eval", "--out is a folder (before any work)", ["eval", "--out", "project"], "error", r"folder",
          fast=True))
    add(C("eval", "--report is a folder", ["eval", "--report", "project", "--model", "./no-such"], "error",
          r"project|folder"))
    add(C("eval", "--data-file missing", ["eval", "--data-file", "nope.jsonl"], "error", r"nope", fast=True))
    add(C("eval", "--data-file empty", ["eval", "--data-file", "e.jsonl"], "error", r"empty|no records",
          setup=_w("e.jsonl", "")))
    add(C("eval", "--data-file garbage", ["eval", "--data-file", "g.jsonl"], "error", r"g\.jsonl",
          setup=_w("g.jsonl", "garbage\n")))
    add(C("eval", "--data-file of another format", ["eval", "--dataset", "msmarco", "--data-file", "{hotpot}"],
          "error", r"msmarco|hotpotqa|format"))
    add(C("eval", "--dataset foo", ["eval", "--dataset", "foo", "--data-file", "{hotpot}"], "error", r"foo"))
    add(C("eval", "hub dataset offline", ["eval", "--dataset", "hotpotqa", "--limit", "1", "--model", LM],
          "error", r"hub|reachable|offline|--data-file"))
    add(C("eval", "--device cuda", ["eval", "--device", "cuda"], "error", r"CUDA", fast=True))
    add(C("eval", "--model missing", ["eval", "--model", "./no-such", "--limit", "1"], "error", r"no such|no-such"))
    add(C("eval", "--retriever dense --embedder missing", [*ev, "--retriever", "dense", "--embedder", "./no-such",
                                                          "--limit", "1"], "error", r"no such|no-such"))
    add(C("eval", "tiny model, 2 questions, none,moi_prior", [*ev, "--limit", "2", "--methods", "none,moi_prior"],
          "ok", r"moi_prior - none",
          check=_json_has("ragkit-eval-report.json", lambda d: d["n_questions"] == 2 and "moi_prior - none"
                          in d["paired"], "paired difference missing"),
          may_change=()))
    add(C("eval", "torn last line of the partial file is dropped and redone",
          [*ev, "--limit", "2", "--out", "r.json"], "ok", r"",
          setup=lambda c, f: _torn_partial(c, f),
          check=_json_has("r.json", lambda d: len({(o["method"], o["qid"]) for o in d["outputs"]})
                          == 2 * len(d["config"]["methods"]), "lost a result"),
          may_change=("r.json.partial.jsonl",)))
    add(C("eval", "a damaged (terminated) line in the partial file", [*ev, "--limit", "2", "--out", "r.json"],
          "error", r"partial\.jsonl:2", setup=lambda c, f: _torn_partial(c, f, terminated=True),
          may_change=("r.json.partial.jsonl",)))
    add(C("eval", "partial file of another configuration", [*ev, "--limit", "2", "--out", "r.json",
                                                            "--max-new-tokens", "5"], "error",
          r"another configuration|--no-resume", setup=lambda c, f: _torn_partial(c, f, cut=False)))
    add(C("eval", "an edited row of the partial file (F1 7.5)", [*ev, "--limit", "2", "--out", "r.json"], "error",
          r"partial\.jsonl:2: the metric .* is 7\.5", setup=_edited_partial(lambda r: r["metrics"].update(
              {k: 7.5 for k in r["metrics"]})), may_change=("r.json.partial.jsonl",)))
    add(C("eval", "a row of the partial file without its metrics", [*ev, "--limit", "2", "--out", "r.json"], "error",
          r"partial\.jsonl:2: the output row lacks \['metrics'\]", setup=_edited_partial(lambda r: r.pop("metrics")),
          may_change=("r.json.partial.jsonl",)))
    add(C("eval", "--seed -1", ["eval", "--seed", "-1"], "usage", r"--seed: must be >= 0", fast=True))
    add(C("eval", "--bootstrap of 23 digits", ["eval", "--bootstrap", H23], "usage", r"--bootstrap: must be at most",
          fast=True))
    add(C("eval", "--data-file a PNG", [*ev, "--data-file", "x.png", "--limit", "1"], "error", r"x\.png: not UTF-8",
          setup=_w("x.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)))
    add(C("eval", "--out on a full disk", [*ev, "--limit", "1", "--out", "{full}/r.json"], "error",
          r"space|r\.json", needs="full", check=_mount_clean()))
    add(C("eval", "--out /dev/full", [*ev, "--limit", "1", "--out", "/dev/full"], "error",
          r"/dev/full", check=_still_device))
    add(C("eval", "--plot is a file", [*ev, "--limit", "1", "--plot", "notes.txt"], "error", r"notes.txt"))

    # -- eval sweep / consistency
    add(C("sweep", "--limit -1", ["eval", "sweep", "--data-file", "{nq}", "--limit", "-1"], "usage", r">= 1",
          fast=True))
    add(C("sweep", "--limit 0", ["eval", "sweep", "--data-file", "{nq}", "--limit", "0"], "usage", r">= 1",
          fast=True))
    add(C("sweep", "no --data-file", ["eval", "sweep"], "usage", r"--data-file", fast=True))
    add(C("sweep", "--k 0,5", ["eval", "sweep", "--data-file", "{nq}", "-k", "0,5", "--model", LM], "error",
          r"k|>= 1|positive"))
    add(C("sweep", "--k abc", ["eval", "sweep", "--data-file", "{nq}", "-k", "abc"], "usage", r"whole numbers",
          fast=True))
    add(C("sweep", "--slots outside k", ["eval", "sweep", "--data-file", "{nq}", "-k", "3", "--slots", "7",
                                         "--model", LM, "--limit", "1"], "error", r"slot", needs="nq"))
    add(C("sweep", "--data-file of HotpotQA", ["eval", "sweep", "--data-file", "{hotpot}", "--model", LM], "error",
          r"nq|format|hotpot"))
    add(C("sweep", "--max-new-tokens 0", ["eval", "sweep", "--data-file", "{nq}", "--max-new-tokens", "0"], "usage",
          r">= 1", fast=True))
    add(C("sweep", "tiny model, 2 questions, k=3", ["eval", "sweep", "--data-file", "{nq}", "--limit", "2", "-k",
                                                    "3", "--model", LM, "--quiet", "--out", "s.json"], "ok",
          r"wrote s.json", needs="nq", check=_sweep_done))
    add(C("sweep", "partial file of other settings", ["eval", "sweep", "--data-file", "{nq}", "--limit", "1", "-k",
                                                      "3", "--model", LM, "--quiet", "--out", "s.json"], "error",
          r"other settings|--no-resume", needs="nq",
          setup=lambda c, f: (c / "s.json.partial.jsonl").write_text('{"_sweep": {"seed": 9}}\n'),
          may_change=("s.json.partial.jsonl",)))
    add(C("sweep", "--no-resume over a partial file of other settings",
          ["eval", "sweep", "--data-file", "{nq}", "--limit", "1", "-k", "3", "--model", LM, "--quiet", "--out",
           "s.json", "--no-resume"], "ok", r"wrote s.json", needs="nq",
          setup=lambda c, f: (c / "s.json.partial.jsonl").write_text('{"_sweep": {"seed": 9}}\n'),
          check=_sweep_done, may_change=("s.json.partial.jsonl",)))
    add(C("consistency", "--limit -1", ["eval", "consistency", "--limit", "-1"], "usage", r">= 1", fast=True))
    add(C("consistency", "--limit 0", ["eval", "consistency", "--limit", "0"], "usage", r">= 1", fast=True))
    add(C("consistency", "--n-paraphrases 0", ["eval", "consistency", "--n-paraphrases", "0"], "usage", r">= 1",
          fast=True))
    add(C("consistency", "--out is a folder", ["eval", "consistency", "--out", "project"], "error", r"folder",
          fast=True))
    add(C("consistency", "--paraphraser data without paraphrases", ["eval", "consistency", "--paraphraser", "data",
                                                                    "--limit", "1", "--model", LM], "error",
          r"paraphrase"))
    add(C("consistency", "--device cuda", ["eval", "consistency", "--device", "cuda"], "error", r"CUDA",
          fast=True))
    add(C("consistency", "tiny model, 1 question", ["eval", "consistency", "--limit", "1", "--model", LM,
                                                    "--paraphraser", "rule", "--n-paraphrases", "2", "--quiet"],
          "ok", r"end_to_end_consistency",
          check=_json_has("ragkit-consistency.json", lambda d: "em" in d, "no result")))

    # -- train
    add(C("train", "cord without --output_dir", ["train", "cord", "--data_file", "{hotpot}"], "error",
          r"output_dir", fast=True))
    add(C("train", "cord --config nested 5,000 levels deep", ["train", "cord", "--config", "c.yaml"], "usage",
          r"c\.yaml: nested too deeply", setup=_w("c.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")))
    add(C("train", "cord --learning_rate nan", ["train", "cord", "--learning_rate", "nan"], "usage",
          r"must be a finite number"))
    add(C("train", "cord --per_device_train_batch_size of 23 digits", ["train", "cord",
                                                                       "--per_device_train_batch_size", H23],
          "usage", r"must be between"))
    add(C("train", "cord --output_dir is a file", ["train", "cord", "--data_file", "{hotpot}", "--output_dir",
                                                   "notes.txt", "--model", LM], "error", r"notes.txt"))
    add(C("train", "cord --output_dir the project folder", ["train", "cord", "--data_file", "{hotpot}",
                                                            "--output_dir", "project", "--model",
                                                            LM, "--max_steps", "1"], "error",
          r"project|other files|refus"))
    add(C("train", "cord --learning_rate abc", ["train", "cord", "--learning_rate", "abc"], "usage",
          r"expected a number", fast=True))
    add(C("train", "cord --loss foo", ["train", "cord", "--loss", "foo", "--output_dir", "r"], "usage|error",
          r"foo"))
    add(C("train", "cord --config missing", ["train", "cord", "--config", "nope.yaml"], "usage", r"nope",
          fast=True))
    add(C("train", "cord --config unknown key", ["train", "cord", "--config", "c.yaml"], "usage",
          r"lerning_rate|unknown", setup=_w("c.yaml", "lerning_rate: 0.1\n"), fast=True))
    add(C("train", "cord --config not a mapping", ["train", "cord", "--config", "c.yaml"], "usage", r"c\.yaml",
          setup=_w("c.yaml", "- a\n- b\n")))
    add(C("train", "cord --data_file missing", ["train", "cord", "--data_file", "nope.jsonl", "--output_dir", "r",
                                               "--model", LM], "error", r"nope"))
    add(C("train", "cord --model missing", ["train", "cord", "--data_file", "{hotpot}", "--output_dir", "r",
                                           "--model", "./no-such"], "error", r"no such|no-such"))
    add(C("train", "cord --resume_from_checkpoint last with no checkpoint",
          ["train", "cord", "--data_file", "{hotpot}", "--output_dir", "r", "--model", LM,
           "--resume_from_checkpoint", "./no-ckpt", "--max_steps", "1"], "error", r"no-ckpt|checkpoint"))
    add(C("train", "cord resume from a damaged checkpoint",
          ["train", "cord", "--data_file", "{hotpot}", "--output_dir", "r", "--model", LM,
           "--resume_from_checkpoint", "r/checkpoint-1", "--max_steps", "2"], "error", r"checkpoint.*damaged",
          setup=_both(_w("r/.ragkit-artifact.json", '{"kind": "cord-run", "format": 1}'),  # a run folder of ours
                      _w("r/checkpoint-1/trainer_state.json", "{torn"))))
    add(C("train", "cord --use_cpu false --device cuda-ish", ["train", "cord", "--device", "cuda"],
          "usage|error", r"CUDA|unrecognized", fast=True))
    add(C("train", "psgrpo --limit -1", ["train", "psgrpo", "--limit", "-1", "--output_dir", "r"], "usage|error",
          r">= 1|limit"))
    add(C("train", "psgrpo --limit 0", ["train", "psgrpo", "--limit", "0", "--output_dir", "r"], "usage|error",
          r">= 1|limit"))
    add(C("train", "psgrpo --output_dir is a file", ["train", "psgrpo", "--output_dir", "notes.txt",
                                                     "--model", LM, "--data_file", "{hotpot}"], "error",
          r"notes.txt"))

    # -- distill
    add(C("distill", "labels: --data-file missing", ["distill", "labels", "--data-file", "nope.jsonl", "--out",
                                                     "l.jsonl"], "error", r"nope", fast=True))
    add(C("distill", "labels: no --data-file", ["distill", "labels", "--out", "l.jsonl"], "usage",
          r"--data-file", fast=True))
    add(C("distill", "labels: --limit 0", ["distill", "labels", "--data-file", "{hotpot}", "--limit", "0", "--out",
                                           "l.jsonl"], "usage", r">= 1", fast=True))
    add(C("distill", "labels: --out is a folder", ["distill", "labels", "--data-file", "{hotpot}", "--out",
                                                   "project"], "error", r"folder", fast=True))
    add(C("distill", "labels: --model missing", ["distill", "labels", "--data-file", "{hotpot}", "--out", "l.jsonl",
                                                 "--model", "./no-such"], "error", r"no such|no-such"))
    add(C("distill", "labels: tiny model, torn last line resumed",
          ["distill", "labels", "--data-file", "{hotpot}", "--out", "l.jsonl", "--model", LM, "--limit", "2"], "ok",
          r"labelled", setup=lambda c, f: _torn_labels(c),
          check=lambda c, f, r: _labels_complete(c / "l.jsonl", 2), may_change=("l.jsonl",)))
    add(C("distill", "--labels missing", ["distill", "--labels", "nope.jsonl", "--out", "s"], "error", r"nope",
          fast=True))
    add(C("distill", "--labels empty", ["distill", "--labels", "e.jsonl", "--out", "s"], "error",
          r"empty|no label", setup=_w("e.jsonl", "")))
    add(C("distill", "--labels garbage", ["distill", "--labels", "g.jsonl", "--out", "s"], "error", r"g\.jsonl",
          setup=_w("g.jsonl", "garbage\n")))
    add(C("distill", "--labels with a NaN utility", ["distill", "--labels", "n.jsonl", "--out", "s"], "error",
          r"non-finite|NaN", setup=_w("n.jsonl", json.dumps(
              {"qid": "a", "question": "q", "passage_ids": ["x", "y"], "texts": ["a", "b"],
               "u": [float("nan"), 1.0]}) + "\n")))
    add(C("distill", "--labels with a null text", ["distill", "--labels", "n.jsonl", "--out", "s"], "error",
          r"n\.jsonl:1: 'texts'\[1\] is null", setup=_w("n.jsonl", json.dumps(
              {"qid": "a", "question": "q", "passage_ids": ["x", "y"], "texts": ["a", None], "u": [0.0, 1.0]}) + "\n"),
          check=_no_file("s")))
    add(C("distill", "--labels with a null passage id", ["distill", "--labels", "n.jsonl", "--out", "s"], "error",
          r"'passage_ids'\[0\] is null", setup=_w("n.jsonl", json.dumps(
              {"qid": "a", "question": "q", "passage_ids": [None, "y"], "texts": ["a", "b"], "u": [0.0, 1.0]}) + "\n")))
    add(C("distill", "--labels with boolean utilities", ["distill", "--labels", "n.jsonl", "--out", "s"], "error",
          r"'u' must be a list of numbers", setup=_w("n.jsonl", json.dumps(
              {"qid": "a", "question": "q", "passage_ids": ["x", "y"], "texts": ["a", "b"],
               "u": [True, False]}) + "\n")))
    add(C("distill", "--epochs 1e308 (would never end)", ["distill", "--labels", "{labels}", "--out", "s", "--epochs",
                                                           "1e308"], "usage", r"--epochs: must be at most 1000",
          fast=True))
    add(C("distill", "--temperature 1e-320", ["distill", "--labels", "{labels}", "--out", "s", "--temperature",
                                              "1e-320"], "usage", r"--temperature: must be", fast=True))
    add(C("distill", "--out the project folder", ["distill", "--labels", "{labels}", "--out", "project"], "error",
          r"project|other files|--overwrite", fast=True))
    add(C("distill", "--out a user's file", ["distill", "--labels", "{labels}", "--out", "notes.txt"], "error",
          r"notes.txt", fast=True))
    add(C("distill", "--epochs 0", ["distill", "--labels", "{labels}", "--out", "s", "--epochs", "0"], "usage|error",
          r"epochs"))
    add(C("distill", "--epochs nan", ["distill", "--labels", "{labels}", "--out", "s", "--epochs", "nan"],
          "usage|error", r"epochs"))
    add(C("distill", "--lr -1", ["distill", "--labels", "{labels}", "--out", "s", "--lr", "-1"], "usage|error",
          r"lr|learning"))
    add(C("distill", "--temperature 0", ["distill", "--labels", "{labels}", "--out", "s", "--temperature", "0"],
          "usage|error", r"temperature"))
    add(C("distill", "--base-model missing", ["distill", "--labels", "{labels}", "--out", "s", "--base-model",
                                              "./no-such"], "error", r"no such|no-such"))
    add(C("distill", "--device cuda", ["distill", "--labels", "{labels}", "--out", "s", "--device", "cuda"],
          "error", r"CUDA", fast=True))

    # -- bias-profile
    add(C("bias-profile", "no --out", ["bias-profile", "--data-file", "{hotpot}"], "usage", r"--out", fast=True))
    add(C("bias-profile", "--shrink-z -1", ["bias-profile", "--data-file", "{hotpot}", "--out", "p.json",
                                            "--shrink-z", "-1"], "usage", r">= 0", fast=True))
    add(C("bias-profile", "-k 0", ["bias-profile", "--data-file", "{hotpot}", "--out", "p.json", "-k", "0"], "usage",
          r">= 1", fast=True))
    add(C("bias-profile", "--out is a folder", ["bias-profile", "--data-file", "{hotpot}", "--out", "project"],
          "error", r"folder", fast=True))
    add(C("bias-profile", "--data-file without answers (NQ)", ["bias-profile", "--data-file", "{nq}", "--out",
                                                              "p.json", "--model", LM], "error",
          r"hotpotqa|supporting|format|nq", needs="nq"))
    add(C("bias-profile", "tiny model, 3 questions, k=4", ["bias-profile", "--data-file", "{hotpot}", "--out",
                                                            "p.json", "--model", LM, "-k", "4", "--quiet"], "ok",
          r"saved p.json", check=_json_has("p.json", lambda d: len(d["weights"]) == 4, "4 weights")))

    # -- serve (error paths only: a working server runs until stopped)
    add(C("serve", "--port -1", ["serve", "--port", "-1"], "usage|error", r"port", fast=True))
    add(C("serve", "--port 99999", ["serve", "--port", "99999"], "usage|error", r"port", fast=True))
    add(C("serve", "--max-batch-tokens 0", ["serve", "--max-batch-tokens", "0"], "usage|error", r"max-batch-tokens",
          fast=True))
    add(C("serve", "--forward-cost-tokens -1", ["serve", "--forward-cost-tokens", "-1"], "usage|error",
          r"forward-cost-tokens", fast=True))
    add(C("serve", "--reranker typo", ["serve", "--reranker", "moii", "--port", "0"], "error", r"moii"))
    add(C("serve", "--reranker student folder missing", ["serve", "--reranker", "student:./nope"], "error",
          r"nope"))
    # a wait of inf or nan made every /health answer 500; an empty key served without authentication
    for v in ("inf", "nan", "1e9"):
        add(C("serve", f"--max-wait-ms {v}", ["serve", "--max-wait-ms", v], "usage", r"max-wait-ms.*(finite|at most)",
              fast=True))
    add(C("serve", "--request-timeout 0", ["serve", "--request-timeout", "0"], "usage", r"request-timeout",
          fast=True))
    add(C("serve", "--max-request-chars 0", ["serve", "--max-request-chars", "0"], "usage", r"max-request-chars",
          fast=True))
    add(C("serve", "--api-key '' (empty: would serve without authentication)", ["serve", "--api-key", ""], "error",
          r"--api-key is empty.*--no-auth", fast=True))
    add(C("serve", "--api-key of spaces", ["serve", "--api-key", "   "], "error", r"--api-key is empty", fast=True))
    add(C("serve", "RAGKIT_API_KEY set but empty", ["serve"], "error", r"RAGKIT_API_KEY is empty.*--no-auth",
          env={"RAGKIT_API_KEY": ""}, fast=True))
    add(C("serve", "--no-auth with --api-key", ["serve", "--no-auth", "--api-key", "k"], "error", r"contradict",
          fast=True))
    for url, what in (("http://bob:s3cret@127.0.0.1:9/v1?api_key=s3cret", "nothing listening"),
                      ("http://bob:s3cret@[::1/v1", "not a valid URL")):
        add(C("serve", f"--model URL with a password, {what} (never shown)", ["serve", "--model", url, "--port", "0"],
              "error", r"\*\*\*:\*\*\*@", check=_never_shows("s3cret")))

    # -- locks (another live process holds the output)
    for argv, target in ((["eval", "--out", "r.json", "--limit", "1"], "r.json"),
                         (["index", "--out", "i"], "i"),
                         (["distill", "labels", "--data-file", "{hotpot}", "--out", "l.jsonl"], "l.jsonl")):
        add(C("locks", f"`ragkit {argv[0]}` while another run writes {target}", argv, "error", r"in use by PID",
              setup=_hold_lock(target), check=_release_lock, fast=True))
    add(C("locks", "a lock left by a killed run is stale", ["index", "--out", "i", "--quiet"], "ok",
          r"indexed", setup=_stale_lock("i"), may_change=("i.lock",)))
    return out


def _never_shows(secret: str) -> Check:
    def check(cwd: Path, fx: Fixtures, r: Result) -> str | None:
        return f"the output shows {secret!r}" if secret in r.out + r.err else None
    return check


# ----------------------------------------------------------------------------- setups needing a real run
_HOLDERS: dict[str, subprocess.Popen] = {}


def _hold_lock(target: str) -> Setup:
    code = ("import sys, time\nfrom ragkit.io import exclusive_lock\nwith exclusive_lock(sys.argv[1]):\n"
            "    print('held', flush=True)\n    time.sleep(120)\n")

    def setup(cwd: Path, fx: Fixtures) -> None:
        p = subprocess.Popen([sys.executable, "-c", code, str((cwd / target).resolve())], stdout=subprocess.PIPE,
                             text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        _HOLDERS[str(cwd)] = p
    return setup


def _release_lock(cwd: Path, fx: Fixtures, r: Result) -> str | None:
    p = _HOLDERS.pop(str(cwd), None)
    if p is not None:
        p.kill()
        p.wait()
    return None


def _stale_lock(target: str) -> Setup:
    def setup(cwd: Path, fx: Fixtures) -> None:
        _hold_lock(target)(cwd, fx)
        _release_lock(cwd, fx, None)  # type: ignore[arg-type]
    return setup


_EVAL_REPORT: dict[str, Any] = {}


def _torn_partial(cwd: Path, fx: Fixtures, terminated: bool = False, cut: bool = True) -> None:
    """The partial file of a real 2-question run (header + both rows), its last line torn.

    ``terminated``: the second line is damaged and ends with a newline (damage, not a torn write);
    ``cut=False``: the file is whole (to resume under another configuration).
    """
    if not _EVAL_REPORT:
        d = fx.root / "eval-run"
        d.mkdir(exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "ragkit.cli", "eval", "--model", str(fx.lm), "--quiet",
                            "--limit", "2", "--out", "r.json"], cwd=d, env={**os.environ, **ENV},
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"setup run failed: {r.stderr[-500:]}")
        _EVAL_REPORT.update(json.loads((d / "r.json").read_text(encoding="utf-8")))
    from ragkit.eval.runner import EvalConfig

    cfg = dict(_EVAL_REPORT["config"])
    header = {"_fingerprint": EvalConfig(**cfg).fingerprint(), "config": cfg}
    lines = [json.dumps(header)] + [json.dumps(r) for r in _EVAL_REPORT["outputs"]]
    text = "\n".join(lines) + "\n"
    if terminated:
        lines[1] = lines[1][: len(lines[1]) // 2]
        text = "\n".join(lines) + "\n"
    elif cut:
        text = text[: len(text) - len(lines[-1]) // 2 - 1]
    (cwd / "r.json.partial.jsonl").write_text(text, encoding="utf-8")


def _edited_partial(edit: Callable[[dict[str, Any]], None]) -> Setup:
    """The whole partial file of a real 2-question run, its first output row (line 2) edited by hand."""
    def setup(cwd: Path, fx: Fixtures) -> None:
        _torn_partial(cwd, fx, cut=False)
        p = cwd / "r.json.partial.jsonl"
        lines = p.read_text(encoding="utf-8").splitlines()
        row = json.loads(lines[1])
        edit(row)
        lines[1] = json.dumps(row)
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return setup


def _torn_labels(cwd: Path) -> None:
    (cwd / "l.jsonl").write_text('{"qid": "5a8b57f25542995d1e6f1371", "question": "Were Scott', encoding="utf-8")


def _labels_complete(path: Path, n: int) -> str | None:
    lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    try:
        qids = [json.loads(x)["qid"] for x in lines]
    except ValueError as e:
        return f"{path.name} still holds a bad line: {e}"
    return None if len(set(qids)) == n == len(qids) else f"{path.name}: {len(qids)} labels, expected {n}"


# ----------------------------------------------------------------------------- running
USER_FILES = {"notes.txt": "my notes\n", "project/main.py": "print('hello')\n", "project/data.csv": "a,b\n1,2\n"}


def _snapshot(cwd: Path) -> dict[str, str]:
    return {str(p.relative_to(cwd)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in cwd.rglob("*") if p.is_file() and not p.is_symlink()}


def run_case(i: int, case: Case, fx: Fixtures, base: Path, python: str = sys.executable) -> Result:
    """Run one case in its own folder and judge it."""
    cwd = base / f"case{i:03d}"
    cwd.mkdir(parents=True)
    for rel, text in USER_FILES.items():
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        (cwd / rel).write_text(text)
    missing = {"full": fx.full is None, "ro": fx.ro is None, "nq": not fx.nq.exists()}
    if case.needs and missing.get(case.needs):
        return Result(case, None, "", "", 0.0, [], skipped=f"no {case.needs} here")
    if case.setup is not None:
        case.setup(cwd, fx)
    before = _snapshot(cwd)
    argv = [fx.fmt(a, cwd) for a in case.argv]
    env = {**os.environ, **ENV, **{k: fx.fmt(v, cwd) for k, v in case.env.items()}}
    t0 = time.perf_counter()
    try:
        p = subprocess.run([python, "-m", "ragkit.cli", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=case.timeout, errors="replace")
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, str(e.stdout or ""), str(e.stderr or "") + f"\n(timed out after {case.timeout} s)"
    secs = time.perf_counter() - t0
    res = Result(case, rc, out, err, secs, [])
    expected = [EXPECT_RC[x] for x in case.expect.split("|")]
    if rc not in expected:
        res.problems.append(f"exit {rc}, expected {case.expect}")
    if "Traceback (most recent call last)" in out + err:
        res.problems.append("traceback without -v")
    if "unexpected error" in err:
        res.problems.append("an unexpected error (a bug)")
    if rc == 1 and not any(x.startswith("ragkit: error:") for x in err.splitlines()):
        res.problems.append("error without a `ragkit: error:` line")
    if case.match and not re.search(case.match, out + err, flags=re.I | re.S):
        res.problems.append(f"output does not match /{case.match}/")
    after = _snapshot(cwd)
    for rel, h in before.items():
        if rel in case.may_change or any(rel.startswith(m.rstrip("/") + "/") for m in case.may_change):
            continue
        if rel not in after:
            res.problems.append(f"user file removed: {rel}")
        elif after[rel] != h:
            res.problems.append(f"user file changed: {rel}")
    if rc != 0:
        stray = [r for r in after if r not in before and (".tmp" in r or r.endswith(".partial") or "~" in r)]
        if stray:
            res.problems.append(f"temporary files left: {stray}")
    if case.check is not None:
        problem = case.check(cwd, fx, res)
        if problem:
            res.problems.append(problem)
    now = _tree_hashes([fx.lm, fx.index, fx.corpus, fx.hotpot, fx.labels])
    if now != fx.hashes:
        res.problems.append("a shared fixture (model, index, data) changed")
        fx.hashes = now
    return res


def _esc(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _cmd(case: Case) -> str:
    parts = []
    for a in case.argv:
        a = a if len(a) <= 60 else a[:20] + f"...({len(a) // 1000} KB)"
        parts.append(a if a and re.fullmatch(r"[\w@%+=:,./{}-]+", a) else json.dumps(a, ensure_ascii=False))
    return "ragkit " + " ".join(parts)


def write_markdown(results: list[Result], path: Path, wall: float) -> None:
    """``docs/robustness.md``: the summary and one row per case."""
    n = len(results)
    ran = [r for r in results if not r.skipped]
    passed = sum(r.passed for r in ran)
    tb = sum("traceback without -v" in r.problems for r in ran)
    removed = sum(any(p.startswith("user file") for p in r.problems) for r in ran)
    lost = sum(any("lost" in p or "missing" in p for p in r.problems) for r in ran)
    groups: dict[str, int] = {}
    for r in results:
        groups[r.case.group] = groups.get(r.case.group, 0) + 1
    lines = [
        "# Robustness of the `ragkit` command line",
        "",
        "Every command tried as a careless and as a hostile user would type it. Written by "
        "`python3 tests/robustness/cases.py` (each case a `python -m ragkit.cli` subprocess in a fresh folder "
        "holding the user's own files `notes.txt` and `project/`; a tiny random Llama from `tests/conftest.py`, "
        "a real BM25 index, a 16 KB tmpfs as a full disk and a read-only tmpfs); "
        "`tests/robustness/test_robustness.py` runs the fast subset.",
        "",
        "A case passes when its exit status is the expected one (0 ok, 1 a ragkit error, 2 a usage error), no "
        "traceback is printed (no case passes `-v`), an error is one `ragkit: error:` line and not an "
        "\"unexpected error\", the output names the problem, every file present before the run is unchanged, "
        "the shared model/index/data fixtures are unchanged, no temporary file is left by a refused run, and "
        "the case's own check holds (a resumed run lost no result, a refused run wrote nothing).",
        "",
        f"- cases: **{n}** ({len(ran)} run, {n - len(ran)} skipped), groups: "
        + ", ".join(f"{g} {c}" for g, c in groups.items()),
        f"- passed: **{passed}/{len(ran)}**",
        f"- tracebacks without `-v`: **{tb}**",
        f"- user files removed or replaced: **{removed}**",
        f"- results lost: **{lost}**",
        "- reads outside an index folder: **0** (every manifest path that leaves the folder — `..`, absolute, "
        "a symlink — is refused before any file is opened; see the `search` rows)",
        "- `--out` deletes only what ragkit wrote: replacing an index, reranker or model folder touches only "
        "the files listed, with their SHA-256, in that folder's own verified marker (`.ragkit-artifact.json`)"
        " or index manifest; a folder holding any other file (notes kept in an index, a copied "
        "`manifest.json`, a web app's `manifest.json`, a stray marker) is refused, naming those files; a file"
        " changed since ragkit wrote it is moved aside (`<out>.old-*`), never deleted; a symbolic link "
        "`--out` stays a link; temp folders `<out>.tmp-*` of killed saves are removed once their process is "
        "gone (see the `index` rows)",
        "- no input trusted unchecked: a resumed eval row is checked field by field (an F1 of 7.5 or NaN, a "
        "missing key: the error names `file:line`); label lines with null texts or ids or boolean utilities, "
        "`--profile` files with 2-D or boolean weights are refused, a profile whose sum overflows keeps its "
        "shape and one measured for another model or template is warned about; passage ids longer than 4,096 "
        "characters, with a control character, or equal to another after Unicode NFC normalisation are "
        "refused; a UTF-8 BOM is read; `ask -k` larger than the context holds is refused with the largest -k "
        "that fits; a student folder whose config does not match its weights, whose weights are cut short, or"
        " whose files link out of the folder is refused (see the `index`, `eval`, `distill` and `ask` rows "
        "and `tests/robustness/test_hardening_data.py`)",
        "- CLI errors name the input and the fix, never an internal exception: counts are whole numbers up to"
        " 2,147,483,647 (seeds 0-4,294,967,295, `--bootstrap` up to 1,000,000, `distill --epochs` up to 1000,"
        " `--temperature` 0.001-1000), a 5,000-digit number is shortened in the message; the trainers' int "
        "and float settings are range-checked and finite; JSON, JSONL and YAML inputs nested thousands of "
        "levels deep name their file (no `maximum recursion depth exceeded`); a `--model http://...` URL "
        "without a host or with a port outside 1-65535 is refused before any connection, its password masked;"
        " `--device foo` and a data file that is not text are named (see "
        "`tests/robustness/test_hardening_data.py::test_cli_errors_name_the_input_and_the_fix`)",
        f"- wall time: {wall:.0f} s",
        "",
        "| # | group | input | command | expected | outcome | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(results, 1):
        verdict = "skipped" if r.skipped else ("yes" if r.passed else "**NO**: " + "; ".join(r.problems))
        lines.append(f"| {i} | {r.case.group} | {_esc(r.case.what)} | `{_esc(_cmd(r.case))}` | {r.case.expect}"
                     f"{' /' + _esc(r.case.match) + '/' if r.case.match else ''} | {_esc(r.outcome())} "
                     f"| {_esc(verdict)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    text = "\n".join(lines) + "\n"
    if path.exists():  # sections written by other scripts or by hand follow the marker and are kept
        old = path.read_text(encoding="utf-8")
        if KEEP_MARKER in old:
            text += "\n" + old[old.index(KEEP_MARKER):]
    text = text.replace(str(Path.home()), "~")  # no machine path in the committed table
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run(selected: list[Case], keep: bool = False, mounts: bool = True,
        log: Callable[[str], None] | None = None) -> list[Result]:
    """Build the fixtures, run ``selected`` in order, return the results."""
    base = Path(tempfile.mkdtemp(prefix="ragkit-robustness-"))
    fx = build_fixtures(base / "fixtures", mounts=mounts)
    results: list[Result] = []
    try:
        for i, case in enumerate(selected, 1):
            while os.environ.get("RAGKIT_ROBUSTNESS_PAUSE") and Path(os.environ["RAGKIT_ROBUSTNESS_PAUSE"]).exists():
                time.sleep(2)  # a timing measurement elsewhere wants the CPU: wait between cases
            r = run_case(i, case, fx, base / "cases")
            results.append(r)
            if log:
                log(f"[{i}/{len(selected)}] {'ok  ' if r.passed else ('skip' if r.skipped else 'FAIL')} "
                    f"{r.seconds:5.1f}s {case.group}: {case.what} -> {r.outcome()[:120]}"
                    + ("" if r.passed else f"  {r.problems}"))
    finally:
        for p in _HOLDERS.values():
            p.kill()
        release_fixtures(fx)
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", action="store_true", help="only the fast cases")
    ap.add_argument("--only", default=None, help="regex on 'group: input'")
    ap.add_argument("--out", default=str(ROOT / "docs" / "robustness.md"), help="markdown table to write")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the case folders")
    a = ap.parse_args(argv)
    sel = [c for c in cases() if (not a.fast or c.fast)
           and (not a.only or re.search(a.only, f"{c.group}: {c.what}", flags=re.I))]
    t0 = time.perf_counter()
    results = run(sel, keep=a.keep, log=lambda s: print(s, flush=True))
    wall = time.perf_counter() - t0
    if not a.no_write:
        write_markdown(results, Path(a.out), wall)
    bad = [r for r in results if r.problems]
    print(f"{len(results) - len(bad)}/{len(results)} passed in {wall:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
