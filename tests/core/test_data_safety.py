"""Users' files are never destroyed, and a torn append-only file never needs hand repair.

Issue "Hardening", items 1 and 2: ``ragkit index --out "$PWD"`` once wiped a project folder, and a
torn last line of an eval run's partial file made the re-run refuse to resume.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragkit.io import (
    ARTIFACT_MARKER,
    append_jsonl,
    artifact_kind,
    atomic_dir,
    check_writable_dir,
    read_appended_jsonl,
    resume_appended_jsonl,
)


def _user_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    d = tmp_path / "project"
    (d / "src").mkdir(parents=True)
    files = {"corpus.jsonl": '{"id": "1", "text": "hello"}\n', "notes.txt": "mine", "src/a.py": "x = 1\n"}
    for rel, text in files.items():
        (d / rel).write_text(text)
    return d, files


def _unchanged(d: Path, files: dict[str, str]) -> bool:
    return all((d / rel).read_text() == text for rel, text in files.items()) and not any(
        p.name == ARTIFACT_MARKER for p in d.rglob("*")
    )


# ----------------------------------------------------------------------------- atomic_dir rules
def test_atomic_dir_never_replaces_a_folder_of_user_files(tmp_path: Path) -> None:
    d, files = _user_folder(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="never replaces"):
            with atomic_dir(d, kind="index", overwrite=overwrite) as tmp:
                (tmp / "x").write_text("new")
        assert _unchanged(d, files)
    assert not list(tmp_path.glob("project.tmp-*"))  # no temp folder left behind


def test_atomic_dir_file_needs_overwrite(tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_text("precious")
    with pytest.raises(FileExistsError, match="--overwrite"):
        with atomic_dir(f, kind="index"):
            pass
    assert f.read_text() == "precious"
    with atomic_dir(f, kind="index", overwrite=True) as tmp:
        (tmp / "a").write_text("1")
    assert f.is_dir() and (f / "a").read_text() == "1" and artifact_kind(f) == "index"


def test_atomic_dir_replaces_same_kind_only(tmp_path: Path) -> None:
    out = tmp_path / "idx"
    with atomic_dir(out, kind="index") as tmp:
        (tmp / "v").write_text("1")
    with atomic_dir(out, kind="index") as tmp:  # a previous index of the same kind: replaced
        (tmp / "v").write_text("2")
    assert (out / "v").read_text() == "2"
    with pytest.raises(FileExistsError, match="holds a ragkit index"):
        with atomic_dir(out, kind="reranker"):
            pass
    assert (out / "v").read_text() == "2"
    with atomic_dir(out, kind="reranker", overwrite=True) as tmp:
        (tmp / "w").write_text("3")
    assert artifact_kind(out) == "reranker" and not (out / "v").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_writable_dir(empty, "index") == empty


def test_legacy_index_folder_is_recognised(tmp_path: Path) -> None:
    old = tmp_path / "old-index"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"format": "ragkit-index", "version": 1, "kind": "bm25"}))
    assert artifact_kind(old) == "index"
    check_writable_dir(old, "index")


# ----------------------------------------------------------------------------- real writers
def test_retriever_save_refuses_user_folder(tmp_path: Path) -> None:
    from ragkit.retrievers import BM25Retriever
    from ragkit.types import Passage

    d, files = _user_folder(tmp_path)
    r = BM25Retriever().index([Passage("1", "alpha beta"), Passage("2", "gamma delta")])
    with pytest.raises(FileExistsError):
        r.save(d)
    with pytest.raises(FileExistsError):
        r.save(d, overwrite=True)
    assert _unchanged(d, files)
    r.save(tmp_path / "idx")
    r.save(tmp_path / "idx")  # replacing its own previous index is fine


def test_cli_index_into_project_folder_keeps_every_file(tmp_path: Path, monkeypatch) -> None:
    from ragkit.cli import main

    d, files = _user_folder(tmp_path)
    monkeypatch.chdir(d)
    for extra in ([], ["--overwrite"]):
        rc = main(["index", "--corpus", "corpus.jsonl", "--out", str(d), "--kind", "bm25", *extra])
        assert rc == 1
        assert _unchanged(d, files)
    f = tmp_path / "file-out"
    f.write_text("keep")
    assert main(["index", "--corpus", str(d / "corpus.jsonl"), "--out", str(f), "--kind", "bm25"]) == 1
    assert f.read_text() == "keep"
    assert main(["index", "--corpus", str(d / "corpus.jsonl"), "--out", str(tmp_path / "idx"), "--kind", "bm25"]) == 0
    assert main(["index", "--corpus", str(d / "corpus.jsonl"), "--out", str(tmp_path / "idx"), "--kind", "bm25"]) == 0


def test_cli_distill_refuses_user_folder_before_training(tmp_path: Path) -> None:
    from ragkit.cli import main

    d, files = _user_folder(tmp_path)
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")  # never read: the --out check comes first
    rc = main(["distill", "--labels", str(labels), "--out", str(d), "--overwrite"])
    assert rc == 1
    assert _unchanged(d, files)


# ----------------------------------------------------------------------------- torn append-only files
def test_torn_last_line_is_dropped_and_file_repaired(tmp_path: Path, caplog) -> None:
    f = tmp_path / "run.partial.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}\n{"c": 3, "d"')
    with caplog.at_level("WARNING"):
        rows = read_appended_jsonl(f)
    assert rows == [{"a": 1}, {"b": 2}]
    assert "torn last line" in caplog.text
    assert f.read_text() == '{"a": 1}\n{"b": 2}\n'  # truncated: the next append starts on a clean line
    append_jsonl(f, [{"c": 3}])
    assert read_appended_jsonl(f) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n{"b": 2}')
    assert read_appended_jsonl(f) == [{"a": 1}, {"b": 2}]
    append_jsonl(f, [{"c": 3}])
    assert read_appended_jsonl(f) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_damage_inside_the_file_is_not_silently_dropped(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n{"b": \n{"c": 3}\n')
    with pytest.raises(ValueError, match=":2: not valid JSON"):
        read_appended_jsonl(f)
    assert f.read_text() == '{"a": 1}\n{"b": \n{"c": 3}\n'


def test_eval_resumes_over_a_torn_partial_file(tmp_path: Path, tiny_lm_dir: Path) -> None:
    from ragkit.datasets import sample_records
    from ragkit.eval.runner import EvalConfig, run_eval
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=16, show_progress=False)
    recs = sample_records(3)
    cfg = EvalConfig(sample=True, limit=3, k=3, methods=("none",), max_new_tokens=3, n_bootstrap=10, chunk_size=1)
    ref = run_eval(cfg, out=tmp_path / "ref.json", records=recs, generator=gen, show_progress=False)

    out = tmp_path / "run.json"

    class Stop(Exception):
        pass

    def stop_after(n: int) -> None:
        if n >= 2:
            raise Stop

    with pytest.raises(Stop):
        run_eval(cfg, out=out, records=recs, generator=gen, show_progress=False, on_chunk=stop_after)
    part = out.with_name(out.name + ".partial.jsonl")
    with open(part, "a", encoding="utf-8") as fh:  # the write of the 3rd row was torn (full disk, kill)
        fh.write('{"method": "none", "qid": "' + recs[2].id + '", "pred')
    rep = run_eval(cfg, out=out, records=recs, generator=gen, show_progress=False)
    assert [o["qid"] for o in rep["outputs"]] == [r.id for r in recs]
    assert [o["prediction"] for o in rep["outputs"]] == [o["prediction"] for o in ref["outputs"]]
    assert rep["timing"]["resumed_items"] == 2


def test_label_file_with_torn_tail_reads(tmp_path: Path) -> None:
    from ragkit.training.labels import read_labels

    good = {"qid": "q1", "question": "Who?", "passage_ids": ["a", "b"], "texts": ["t", "u"], "u": [0.5, -0.5]}
    f = tmp_path / "labels.jsonl"
    f.write_text(json.dumps(good) + "\n" + '{"qid": "q2", "quest')
    labels = read_labels(f)
    assert [r.qid for r in labels] == ["q1"]
    assert f.read_text() == json.dumps(good) + "\n"


# ----------------------------------------------------------------------------- one resume rule for every run
def test_resume_appended_jsonl_keeps_same_settings_and_refuses_others(tmp_path: Path) -> None:
    f = tmp_path / "out.json.partial.jsonl"
    head = {"_fp": "abc", "config": {"k": 10}}
    assert resume_appended_jsonl(f, head, resume=True, key="_fp") == []
    assert read_appended_jsonl(f) == [head]  # a new file starts with its header
    append_jsonl(f, [{"q": 1}, {"q": 2}])
    assert resume_appended_jsonl(f, head, resume=True, key="_fp") == [{"q": 1}, {"q": 2}]
    # only the key fingerprints: other header fields may differ
    assert resume_appended_jsonl(f, {"_fp": "abc", "config": {}}, resume=True, key="_fp") == [{"q": 1}, {"q": 2}]
    with pytest.raises(ValueError, match="other settings.*--no-resume"):
        resume_appended_jsonl(f, {"_fp": "xyz"}, resume=True, key="_fp")
    assert len(read_appended_jsonl(f)) == 3  # the other run's rows are not deleted
    assert resume_appended_jsonl(f, {"_fp": "xyz"}, resume=False, key="_fp") == []
    assert read_appended_jsonl(f) == [{"_fp": "xyz"}]


def test_resume_appended_jsonl_restarts_a_file_torn_in_its_header(tmp_path: Path) -> None:
    # killed while the header was written: nothing was done, so the run starts over (the eval
    # runner used to refuse this file, the sweep restarted it; one rule now)
    f = tmp_path / "out.json.partial.jsonl"
    f.write_text('{"_fp": "ab')
    assert resume_appended_jsonl(f, {"_fp": "abc"}, resume=True, key="_fp") == []
    assert f.read_text() == '{"_fp": "abc"}\n'
