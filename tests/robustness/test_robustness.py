"""A fast subset of the robustness cases (``tests/robustness/cases.py``): no traceback, the user's files kept."""

from __future__ import annotations

import math
import re

import cases  # tests/robustness/cases.py (this folder is on sys.path under pytest's rootdir-less import mode)
import pytest

from ragkit.debias import get_reranker
from ragkit.types import Passage

QUICK = [
    "cli: `train` alone", "search: manifest without its file list", "search: a passage file byte flipped",
    "search: --out is a folder", "index: --out the project folder$", "index: --corpus not JSON",
    "rerank: NaN retriever score", "rerank: duplicate passage ids", "eval: --limit -1",
    "eval: --methods typo", "ask: RAGKIT_CACHE is a file", "serve: --port 99999",
    "locks: `ragkit index` while", "serve: --max-wait-ms nan", "serve: RAGKIT_API_KEY set but empty",
]


def test_quick_cases_pass() -> None:
    sel = [c for c in cases.cases() if any(re.search(q, f"{c.group}: {c.what}") for q in QUICK)]
    assert len(sel) == len(QUICK)
    results = cases.run(sel, mounts=False)
    bad = [f"{r.case.group}: {r.case.what}: {r.problems} ({r.outcome()})" for r in results if r.problems]
    assert not bad, "\n".join(bad)
    assert not any("Traceback" in r.err for r in results)


def test_case_table_has_enough_cases() -> None:
    all_cases = cases.cases()
    assert len(all_cases) >= 150
    assert len({(c.group, c.what) for c in all_cases}) == len(all_cases)  # every row names a distinct input


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_reranker_refuses_non_finite_scores(bad: float) -> None:
    ps = [Passage("a", "alpha"), Passage("b", "beta")]
    with pytest.raises(ValueError, match="not a finite number"):
        get_reranker("none").rank("q", ps, [bad, 1.0])


@pytest.mark.parametrize("kw", [{"max_new_tokens": 0}, {"limit": -1}, {"limit": 0}, {"n_bootstrap": 0},
                                {"batch_size": 0}])
def test_eval_config_refuses_nonsense_counts(kw: dict) -> None:
    """``max_new_tokens=0`` is not 16 and ``limit=-1`` is not "all": refused before any work."""
    from ragkit.eval.runner import EvalConfig

    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} must be >= 1"):
        EvalConfig(**kw)


def test_sample_limit_minus_one_is_not_all_but_the_last() -> None:
    from ragkit.datasets import sample_records

    with pytest.raises(ValueError, match="limit must be >= 1"):
        sample_records(-1)


def test_atomic_write_never_replaces_a_device(tmp_path) -> None:
    """``--out /dev/full`` once replaced the device node with a regular file (as root); now it says the disk is full."""
    import os
    import stat
    from pathlib import Path

    from ragkit.io import atomic_write_text, write_json

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so opening the FIFO for writing does not block
    try:
        atomic_write_text(fifo, "hello")
        assert os.read(r, 100) == b"hello"
    finally:
        os.close(r)
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # still the FIFO, not a file put in its place
    if Path("/dev/full").exists():
        with pytest.raises(OSError, match="could not write /dev/full"):
            write_json("/dev/full", {"a": 1})
        assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)


def test_failed_write_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch) -> None:
    """A write that fails half-way (a full disk) names the file; the old content stays, no temp file is left."""
    import os

    from ragkit.io import atomic_write_text

    target = tmp_path / "r.json"
    target.write_text("old")
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"could not write .*r\.json: No space left"):
        atomic_write_text(target, "new")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_read_jsonl_names_the_file_for_bad_shapes(tmp_path) -> None:
    """A JSON array line, a truncated .gz and a folder were a TypeError / EOFError traceback before."""
    import gzip

    from ragkit.io import read_jsonl

    arr = tmp_path / "arr.jsonl"
    arr.write_text('[{"id": "a", "text": "x"}]\n')
    with pytest.raises(ValueError, match=r"arr\.jsonl:1: a JSON list, expected one JSON object per line"):
        read_jsonl(arr)
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"id": "a", "text": "x"}\n' * 200)[:60])
    with pytest.raises(ValueError, match=r"c\.jsonl\.gz: the compressed file is damaged or cut short"):
        read_jsonl(gz)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        read_jsonl(tmp_path)


def test_corpus_reader_names_a_truncated_gz(tmp_path) -> None:
    """`ragkit index --corpus c.jsonl.gz` cut short was an EOFError traceback ("an unexpected error")."""
    import gzip

    from ragkit.retrievers.base import iter_passages

    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"id": "a", "text": "x"}\n' * 200)[:60])
    with pytest.raises(ValueError, match=r"c\.jsonl\.gz: the compressed file is damaged or cut short"):
        list(iter_passages(gz))
    whole = tmp_path / "corpus.data"  # gzipped, whatever the name says
    whole.write_bytes(gzip.compress(b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n'))
    assert [p.id for p in iter_passages(whole)] == ["a", "b"]


def test_profile_that_is_not_json_names_the_file(tmp_path) -> None:
    from ragkit.debias.profile import PositionProfile

    p = tmp_path / "p.json"
    p.write_text("weights: 1 2 3")
    with pytest.raises(ValueError, match=r"p\.json is not a position profile"):
        PositionProfile.load(p)
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"p\.json is not a position profile \(a JSON list"):
        PositionProfile.load(p)
