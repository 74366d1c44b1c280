"""Hardening II (data side): ``--out`` never deletes a file ragkit did not write, no input is trusted unchecked.

Each test names the input a careless or hostile user gave and fails on the code before the fix.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragkit.io import ARTIFACT_MARKER, TEMP_MARKER, artifact_files, atomic_dir, remove_stale_temps, temp_dir_beside

ROOT = Path(__file__).resolve().parents[2]


def _corpus(path: Path, n: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"p{i}", "title": f"T{i}", "text": f"magazine number {i} words"}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def _index(out: Path, corpus: Path, *extra: str) -> int:
    from ragkit.cli import main

    return main(["--quiet", "index", "--corpus", str(corpus), "--out", str(out), "--kind", "bm25", *extra])


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file()}


# ----------------------------------------------------------------------------- --out never deletes a user's file
def test_notes_kept_inside_an_index_folder_are_never_deleted(tmp_path: Path, capsys) -> None:
    """``my-index/NOTES.md`` and ``my-index/eval-runs/run1.json`` were deleted by a rebuild (exit 0)."""
    corpus = _corpus(tmp_path / "c.jsonl")
    idx = tmp_path / "my-index"
    assert _index(idx, corpus) == 0
    (idx / "NOTES.md").write_text("my notes")
    (idx / "eval-runs").mkdir()
    (idx / "eval-runs" / "run1.json").write_text('{"f1": 0.5}')
    before = _files(idx)
    for extra in ([], ["--overwrite"]):
        assert _index(idx, corpus, *extra) == 1
        err = capsys.readouterr().err
        assert "NOTES.md" in err and "eval-runs/run1.json" in err and "move them out" in err
        assert _files(idx) == before
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    from ragkit.retrievers import load_retriever

    assert len(load_retriever(idx)) == 4  # the index itself is untouched too


def test_project_folder_with_a_copied_index_manifest_is_kept(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    assert _index(tmp_path / "real", corpus) == 0
    proj = tmp_path / "project"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.py").write_text("print('hi')\n")
    (proj / "README.md").write_text("# mine\n")
    shutil.copy(tmp_path / "real" / "manifest.json", proj / "manifest.json")
    before = _files(proj)
    for extra in ([], ["--overwrite"]):
        assert _index(proj, corpus, *extra) == 1
        assert _files(proj) == before
    shutil.copy(tmp_path / "real" / ARTIFACT_MARKER, proj / ARTIFACT_MARKER)  # a valid marker copied in too
    before = _files(proj)
    assert _index(proj, corpus, "--overwrite") == 1
    assert _files(proj) == before


def test_web_app_whose_manifest_mentions_ragkit_index_is_kept(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    web = tmp_path / "webapp"
    (web / "static").mkdir(parents=True)
    (web / "static" / "app.js").write_text("console.log('x')\n")
    (web / "manifest.json").write_text(json.dumps({"name": "demo", "description": "search a ragkit-index",
                                                    "format": "ragkit-index"}))
    before = _files(web)
    for extra in ([], ["--overwrite"]):
        assert _index(web, corpus, *extra) == 1
        assert _files(web) == before


def test_stray_marker_in_the_data_folder_being_indexed_keeps_the_corpus(tmp_path: Path, capsys) -> None:
    """A stray ``data/.ragkit-artifact.json`` made ``ragkit index --corpus data/raw/corpus.jsonl --out data``
    delete the corpus."""
    data = tmp_path / "data"
    corpus = _corpus(data / "raw" / "corpus.jsonl")
    (data / ARTIFACT_MARKER).write_text(json.dumps({"kind": "index", "format": 1}))
    before = _files(data)
    for extra in ([], ["--overwrite"]):
        assert _index(data, corpus, *extra) == 1
        assert "raw/corpus.jsonl" in capsys.readouterr().err
        assert _files(data) == before
    # a marker claiming to list files, but edited (its checksum fails): proves nothing either
    (data / ARTIFACT_MARKER).write_text(json.dumps({"kind": "index", "format": 2, "files": {}, "marker_sha256": "0"}))
    assert _index(data, corpus, "--overwrite") == 1
    assert (data / "raw" / "corpus.jsonl").read_bytes() == before["raw/corpus.jsonl"]


def test_out_symlink_to_an_empty_folder_stays_a_link(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    target = tmp_path / "big-disk" / "idx"
    target.mkdir(parents=True)
    link = tmp_path / "idx"
    link.symlink_to(target)
    assert _index(link, corpus) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert (target / "manifest.json").is_file()
    assert _index(link, corpus) == 0  # rebuilt through the link: still a link
    assert link.is_symlink() and (target / "manifest.json").is_file()
    from ragkit.retrievers import load_retriever

    assert len(load_retriever(link)) == 4


def test_rebuilding_an_index_replaces_it_and_leaves_nothing_beside(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    idx = tmp_path / "idx"
    assert _index(idx, corpus) == 0
    listing = artifact_files(idx)
    assert listing is not None and "passages.jsonl" in listing and "manifest.json" in listing
    _corpus(corpus, n=6)
    assert _index(idx, corpus) == 0
    from ragkit.retrievers import load_retriever

    assert len(load_retriever(idx)) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


def test_index_written_before_markers_listed_files_is_still_replaced(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    idx = tmp_path / "idx"
    assert _index(idx, corpus) == 0
    (idx / ARTIFACT_MARKER).write_text(json.dumps({"kind": "index", "format": 1}) + "\n")  # as ragkit wrote it before
    assert _index(idx, corpus) == 0
    assert json.loads((idx / ARTIFACT_MARKER).read_text())["format"] == 2


def test_a_changed_index_file_is_kept_aside_not_deleted(tmp_path: Path, caplog) -> None:
    """A damaged index is rebuilt in place; a file changed since ragkit wrote it is moved aside, not deleted."""
    corpus = _corpus(tmp_path / "c.jsonl")
    idx = tmp_path / "idx"
    assert _index(idx, corpus) == 0
    (idx / "passages.jsonl").write_text("edited by hand\n")
    with caplog.at_level(logging.WARNING, logger="ragkit.io"):
        assert _index(idx, corpus) == 0
    old = [p for p in tmp_path.iterdir() if p.name.startswith("idx.old-")]
    assert len(old) == 1 and _files(old[0]) == {"passages.jsonl": b"edited by hand\n"}
    assert "passages.jsonl" in caplog.text and old[0].name in caplog.text


def test_student_folder_with_user_notes_is_not_replaced(tmp_path: Path) -> None:
    """The same rule for every artifact: a reranker folder marked by an older ragkit (no file list) keeps notes."""
    d = tmp_path / "student"
    d.mkdir()
    (d / ARTIFACT_MARKER).write_text(json.dumps({"kind": "reranker", "format": 1}))
    (d / "config.json").write_text("{}")
    (d / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        with atomic_dir(d, "reranker") as tmp:
            (tmp / "config.json").write_text("{}")
    assert (d / "notes.txt").read_text() == "mine" and (d / "config.json").read_text() == "{}"
    (d / "notes.txt").unlink()
    with atomic_dir(d, "reranker") as tmp:  # only names a Hugging Face save writes: replaced
        (tmp / "config.json").write_text('{"new": 1}')
    assert json.loads((d / "config.json").read_text()) == {"new": 1}


# ----------------------------------------------------------------------------- temp folders of killed saves
def _dead_pid() -> int:
    """A PID no process has: one above the kernel's largest."""
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    except OSError:
        return 2**22 + 1


def test_stale_temp_folders_of_killed_saves_are_removed_and_only_those(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    dead = temp_dir_beside(out, mark=True)  # a save killed mid-way: its process is gone
    owner = json.loads((dead / TEMP_MARKER).read_text())
    (dead / TEMP_MARKER).write_text(json.dumps({**owner, "pid": _dead_pid()}))
    (dead / "passages.jsonl").write_text("x" * 1000)
    live = temp_dir_beside(out, mark=True)  # a save of this (live) process
    users = tmp_path / "idx.tmp-mine"  # the user's own folder, named alike, unmarked
    users.mkdir()
    (users / "keep.txt").write_text("keep")
    other_host = temp_dir_beside(out, mark=True)
    (other_host / TEMP_MARKER).write_text(json.dumps({**owner, "pid": _dead_pid(), "host": "elsewhere"}))
    assert remove_stale_temps(out) == [dead.name]
    assert not dead.exists() and live.is_dir() and other_host.is_dir() and (users / "keep.txt").read_text() == "keep"


@pytest.mark.slow
def test_index_save_cleans_what_a_killed_save_left(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    out = tmp_path / "idx"
    code = ("import os, sys\nfrom ragkit.io import atomic_dir\n"
            "with atomic_dir(sys.argv[1], 'index') as tmp:\n"
            "    (tmp / 'passages.jsonl').write_text('x' * 100000)\n    os._exit(9)\n")
    r = subprocess.run([sys.executable, "-c", code, str(out)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 9
    assert len(list(tmp_path.glob("idx.tmp-*"))) == 1  # what a kill -9 leaves
    assert _index(out, corpus) == 0
    assert not list(tmp_path.glob("idx.tmp-*"))
