"""Hardening II (data side): ``--out`` never deletes a file ragkit did not write, no input is trusted unchecked.

Each test names the input a careless or hostile user gave and fails on the code before the fix.
"""

from __future__ import annotations

import json
import logging
import os
import re
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


# ----------------------------------------------------------------------------- resumed eval rows
@pytest.fixture(scope="module")
def eval_run(tiny_lm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    from ragkit.eval.runner import EvalConfig, run_eval
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=16, show_progress=False)
    cfg = EvalConfig(sample=True, limit=3, k=3, methods=("none",), max_new_tokens=3, n_bootstrap=10, chunk_size=1)
    rep = run_eval(cfg, out=tmp_path_factory.mktemp("eval") / "ref.json", generator=gen, show_progress=False)
    return cfg, gen, rep


def _partial_with(out: Path, cfg, rep: dict, edit) -> Path:
    from dataclasses import asdict

    rows = [dict(r, metrics=dict(r["metrics"])) for r in rep["outputs"]]
    edit(rows[1])  # a middle row
    part = out.with_name(out.name + ".partial.jsonl")
    part.write_text("\n".join(json.dumps(x) for x in [{"_fingerprint": cfg.fingerprint(), "config": asdict(cfg)},
                                                      *rows]) + "\n", encoding="utf-8")
    return part


@pytest.mark.parametrize("edit, match", [
    (lambda r: r["metrics"].__setitem__("f1", 7.5), r"the metric 'f1' is 7\.5"),
    (lambda r: r["metrics"].__setitem__("f1", float("nan")), r"the metric 'f1' is nan"),
    (lambda r: r.pop("metrics"), r"lacks \['metrics'\]"),
    (lambda r: r.pop("qid"), r"lacks \['qid'\]"),
    (lambda r: r.__setitem__("seconds", -3), r"'seconds' -3"),
    (lambda r: r.__setitem__("ranking", [None]), r"'ranking' holds a value that is not a string"),
], ids=["f1-7.5", "f1-nan", "no-metrics", "no-qid", "negative-seconds", "null-id"])
def test_resumed_eval_rows_are_checked(eval_run: tuple, tmp_path: Path, edit, match: str) -> None:
    """An edited middle row of an eval partial file entered the summary (F1 7.5, NaN) or stopped every
    resume with a bare KeyError; now the error names the file, the line and the fix."""
    from ragkit.eval.runner import run_eval

    cfg, gen, rep = eval_run
    out = tmp_path / "r.json"
    _partial_with(out, cfg, rep, edit)
    with pytest.raises(ValueError, match=rf"r\.json\.partial\.jsonl:3: .*{match}.*--no-resume"):
        run_eval(cfg, out=out, generator=gen, show_progress=False)
    assert not out.exists()


def test_resumed_eval_rows_that_are_intact_are_reused(eval_run: tuple, tmp_path: Path) -> None:
    from ragkit.eval.runner import run_eval

    cfg, gen, rep = eval_run
    out = tmp_path / "r.json"
    _partial_with(out, cfg, rep, lambda r: None)
    again = run_eval(cfg, out=out, generator=gen, show_progress=False)
    assert again["timing"]["resumed_items"] == 3
    assert again["outputs"] == rep["outputs"]


# ----------------------------------------------------------------------------- label files
_GOOD_LABEL = {"qid": "q1", "question": "Who?", "passage_ids": ["a", "b"], "texts": ["t", "u"], "u": [0.5, -0.5]}


@pytest.mark.parametrize("change, match", [
    ({"texts": ["t", None]}, r"'texts'\[1\] is null, not a string"),
    ({"passage_ids": [None, "b"]}, r"'passage_ids'\[0\] is null"),
    ({"qid": None}, r"'qid' is null"),
    ({"question": None}, r"'question' is null"),
    ({"u": [True, False]}, r"'u' must be a list of numbers; 'u'\[0\] is true"),
    ({"answers": [None]}, r"'answers'\[0\] is null"),
    ({"generator_calls": True}, r"'generator_calls' is true"),
    ({"metadata": [1, 2]}, r"'metadata' must be a JSON object"),
], ids=["null-text", "null-id", "null-qid", "null-question", "bool-u", "null-answer", "bool-calls", "list-meta"])
def test_label_nulls_and_booleans_are_refused(tmp_path: Path, change: dict, match: str) -> None:
    """Null texts became the text "None", null ids the id "None", booleans utilities 1.0 / 0.0."""
    from ragkit.training.labels import read_labels

    f = tmp_path / "labels.jsonl"
    f.write_text(json.dumps(_GOOD_LABEL) + "\n" + json.dumps({**_GOOD_LABEL, "qid": "q2", **change}) + "\n")
    with pytest.raises(ValueError, match=rf"labels\.jsonl:2: {match}"):
        read_labels(f)


def test_label_integer_ids_and_null_optional_fields_still_read(tmp_path: Path) -> None:
    from ragkit.training.labels import read_labels

    f = tmp_path / "labels.jsonl"
    f.write_text(json.dumps({**_GOOD_LABEL, "qid": 7, "passage_ids": [1, 2], "titles": [None, "T"],
                             "source": None}) + "\n")
    (rec,) = read_labels(f)
    assert rec.qid == "7" and rec.passage_ids == ("1", "2") and rec.titles == ("", "T") and rec.source == ""


# ----------------------------------------------------------------------------- --profile
@pytest.mark.parametrize("data, match", [
    ({"weights": [[0.5, 0.5], [0.2, 0.8]]}, r"flat list of numbers"),
    ({"weights": True}, r"flat list of numbers"),
    ({"weights": [True, False, True]}, r"flat list of numbers"),
    ({"weights": [0.5, 0.5], "k": "2"}, r"'k' must be a whole number"),
    ({"weights": [0.5, 0.5], "model": ["x"]}, r"'model' must be a string"),
], ids=["2-D", "true", "booleans", "k-string", "model-list"])
def test_profile_file_shapes_are_refused(tmp_path: Path, data: dict, match: str) -> None:
    """2-D weights were flattened and ``true`` read as a one-slot profile."""
    from ragkit.debias.profile import PositionProfile

    p = tmp_path / "p.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"p\.json: .*{match}"):
        PositionProfile.load(p)


def test_profile_near_float_max_keeps_its_shape() -> None:
    """Weights whose sum overflows to infinity fell back to the flat profile without a word."""
    from ragkit.debias.profile import PositionProfile

    prof = PositionProfile.from_dict({"weights": [1e308, 1e308, 5e307]})
    assert prof.weights.tolist() == pytest.approx([0.4, 0.4, 0.2])


def test_profile_of_another_model_is_warned_about(tiny_lm_dir: Path, caplog) -> None:
    from ragkit.debias.profile import PositionProfile
    from ragkit.debias.reranker import MoIReranker
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    other = PositionProfile([0.1, 0.2, 0.7], model="meta-llama/Llama-3.1-70B-Instruct", template="chat")
    with caplog.at_level(logging.WARNING, logger="ragkit.debias.profile"):
        MoIReranker(gen, profile=other).profile_for(3)
    assert "measured for meta-llama/Llama-3.1-70B-Instruct (template chat)" in caplog.text
    assert "ragkit bias-profile" in caplog.text
    caplog.clear()
    own = PositionProfile([0.1, 0.2, 0.7], model=f"/elsewhere/{tiny_lm_dir.name}", template=gen.template.name)
    with caplog.at_level(logging.WARNING, logger="ragkit.debias.profile"):
        MoIReranker(gen, profile=own).profile_for(3)
        MoIReranker(gen, profile=PositionProfile([0.5, 0.5])).profile_for(2)  # synthetic: any model
    assert "measured for" not in caplog.text


# ----------------------------------------------------------------------------- corpora
@pytest.mark.parametrize("pid, match", [
    ("x" * 1_000_000, r"1,000,000 characters"),
    ("a\nb", r"control character '\\n'"),
    ("a\x00b", r"control character '\\x00'"),
    ("a\u2028b", r"U\+2028"),
    ("   ", r"empty id"),
], ids=["1M-chars", "newline", "NUL", "line-separator", "blank"])
def test_corpus_ids_that_are_not_ids_are_refused(tmp_path: Path, pid: str, match: str) -> None:
    from ragkit.retrievers import BM25Retriever
    from ragkit.retrievers.base import iter_passages
    from ragkit.types import Passage

    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"id": "ok", "text": "fine"}) + "\n" + json.dumps({"id": pid, "text": "x"}) + "\n")
    with pytest.raises(ValueError, match=rf"c\.jsonl:2: .*{match}"):
        list(iter_passages(c))
    with pytest.raises(ValueError, match=match):
        BM25Retriever(show_progress=False).index([Passage("ok", "fine"), Passage(pid, "x")])


def test_ids_equal_after_unicode_normalisation_are_refused() -> None:
    from ragkit.retrievers import BM25Retriever
    from ragkit.types import Passage

    nfc, nfd = "caf\u00e9", "cafe\u0301"
    with pytest.raises(ValueError, match="differ only in their Unicode normalisation"):
        BM25Retriever(show_progress=False).index([Passage(nfc, "one text"), Passage(nfd, "another text")])
    r = BM25Retriever(show_progress=False).index([Passage(nfc, "one text"), Passage("b", "two")])
    with pytest.raises(ValueError, match="Unicode normalisation"):
        r.add([Passage(nfd, "another")])


def test_utf8_bom_at_the_start_of_a_jsonl_file_is_read(tmp_path: Path) -> None:
    """A BOM (Notepad's "UTF-8") made line 1 "not valid JSON"."""
    from ragkit.datasets import load_dataset
    from ragkit.io import read_appended_jsonl, read_jsonl
    from ragkit.retrievers.base import iter_passages

    bom = "\ufeff"
    c = tmp_path / "c.jsonl"
    c.write_text(bom + json.dumps({"id": "a", "text": "x"}) + "\n", encoding="utf-8")
    assert [p.id for p in iter_passages(c)] == ["a"]
    assert read_jsonl(c) == [{"id": "a", "text": "x"}]
    assert read_appended_jsonl(c) == [{"id": "a", "text": "x"}]
    sample = (ROOT / "ragkit" / "data" / "hotpotqa_dev_sample.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    h = tmp_path / "hotpot.jsonl"
    h.write_text(bom + "\n".join(sample) + "\n", encoding="utf-8")
    assert len(load_dataset("auto", path=h)) == 2
    g = tmp_path / "labels.jsonl"
    g.write_text(bom + json.dumps(_GOOD_LABEL) + "\n", encoding="utf-8")
    from ragkit.training.labels import read_labels

    assert [r.qid for r in read_labels(g)] == ["q1"]


# ----------------------------------------------------------------------------- ask -k
def test_ask_with_more_passages_than_the_context_holds_is_refused(tiny_lm_dir: Path, capsys) -> None:
    """``ragkit ask -k 5000`` cut every passage to 0 tokens and ran full-context prompts without a word."""
    from ragkit.cli import main

    rc = main(["--quiet", "ask", "Which magazine was published first?", "--model", str(tiny_lm_dir), "-k", "5000"])
    err = capsys.readouterr().err
    assert rc == 1 and "-k 5000" in err and "use -k" in err and "tokens" in err


def test_ask_k_that_crowds_the_context_is_warned_about(tiny_lm_dir: Path, caplog) -> None:
    from ragkit.cli.ask import _check_k_fits
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    room = gen.max_length - gen.answer_reserve
    with caplog.at_level(logging.WARNING):
        _check_k_fits(room // 32, gen)
    assert "passages are cut" in caplog.text
    caplog.clear()
    _check_k_fits(5, gen)
    assert not caplog.text


# ----------------------------------------------------------------------------- student folders
@pytest.fixture(scope="module")
def student_dir(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ragkit.debias.student import DistilledReranker

    s = DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0)
    return s.save_pretrained(tmp_path_factory.mktemp("students") / "student")


def _student_copy(student_dir: Path, tmp_path: Path) -> Path:
    d = tmp_path / "student"
    shutil.copytree(student_dir, d)
    return d


def test_student_config_with_one_more_layer_is_refused(student_dir: Path, tmp_path: Path) -> None:
    """It loaded a randomly initialised extra layer and ranked with it."""
    from ragkit.debias.student import DistilledReranker

    d = _student_copy(student_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config\.json does not match the weights: .*layer\.2\..*would be random"):
        DistilledReranker.load(d, device="cpu")
    assert DistilledReranker.load(student_dir, device="cpu").rank("q", ["a", "b"]).ids()  # the intact one loads


def test_truncated_student_weights_name_the_file(student_dir: Path, tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    d = _student_copy(student_dir, tmp_path)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged or cut short"):
        DistilledReranker.load(d, device="cpu")


def test_student_weights_linked_from_outside_are_refused(student_dir: Path, tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    d = _student_copy(student_dir, tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(str(d / "model.safetensors"), outside)
    (d / "model.safetensors").symlink_to(outside)
    with pytest.raises(ValueError, match=r"symbolic link leading out of the student folder"):
        DistilledReranker.load(d, device="cpu")
    with pytest.raises(ValueError, match=r"symbolic link"):
        DistilledReranker.from_pretrained(d, device="cpu")


# ----------------------------------------------------------------------------- CLI errors that named no input
_H = "9" * 23  # a 23-digit count
_Q = "Which magazine was published first?"


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad-inputs")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep.jsonl").write_text('{"id": "a", "text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (d / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (d / "png.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (d / "l.jsonl").write_text(json.dumps(_GOOD_LABEL) + "\n")
    return d


CLI_ERRORS = [
    # (argv, exit status, what the message must say)
    (["search", "--query", "x", "-k", _H], 2, r"-k/--k: must be at most 2,147,483,647"),
    (["search", "--query", "x", "-k", "9" * 5000], 2, r"expected a whole number, got '9+'\.\.\. \(5,000 characters\)"),
    (["eval", "--seed", "-1"], 2, r"--seed: must be >= 0, got -1"),
    (["eval", "--seed", _H], 2, r"--seed: must be at most 4,294,967,295"),
    (["eval", "--bootstrap", _H], 2, r"--bootstrap: must be at most 1,000,000"),
    (["eval", "sweep", "--slots", "0,-1"], 2, r"--slots: slots are 0-based positions"),
    (["distill", "--labels", "{d}/l.jsonl", "--out", "s", "--epochs", "1e308"], 2, r"--epochs: must be at most 1000"),
    (["distill", "--labels", "{d}/l.jsonl", "--out", "s", "--temperature", "1e-320"], 2, r"--temperature: must be"),
    (["distill", "--labels", "{d}/l.jsonl", "--out", "s", "--seed", _H], 2, r"--seed: must be at most"),
    (["distill", "--labels", "{d}", "--out", "s"], 1, r"is a folder; pass a label file"),
    (["distill", "--labels", "{d}/deep.jsonl", "--out", "s"], 1, r"deep\.jsonl:1: the JSON is nested too deeply"),
    (["ask", _Q, "--model", "http://127.0.0.1:99999/v1"], 1, r"--model http://127\.0\.0\.1:99999/v1: .*1-65535"),
    (["ask", _Q, "--model", "http://"], 1, r"--model http://: the URL names no host"),
    (["ask", _Q, "--model", "http://user:secret@127.0.0.1:99999999/v1"], 1, r"--model http://\*\*\*:\*\*\*@127"),
    (["ask", _Q, "--model", "http://[::1/v1"], 1, r"not a valid URL \(Invalid IPv6 URL\)"),
    (["ask", _Q, "--device", "foo"], 1, r"--device 'foo' is not a device; use auto, cpu, cuda"),
    (["ask", _Q, "--profile", "{d}/deep.json"], 1, r"deep\.json: the JSON is nested too deeply"),
    (["index", "--corpus", "{d}/deep.jsonl", "--out", "{d}/i"], 1, r"deep\.jsonl:1: the JSON is nested too deeply"),
    (["rerank", "--query", _Q, "--passages", "{d}/deep.jsonl", "--reranker", "none"], 1, r"nested too deeply"),
    (["train", "cord", "--config", "{d}/deep.yaml"], 2, r"deep\.yaml: nested too deeply"),
    (["train", "cord", "--learning_rate", "nan"], 2, r"--learning_rate.*must be a finite number, got 'nan'"),
    (["train", "cord", "--per_device_train_batch_size", _H], 2, r"--per_device_train_batch_size.*must be between"),
]


@pytest.mark.parametrize("argv, rc, match", CLI_ERRORS, ids=[" ".join(a[:1] + a[-2:])[:60] for a, _, _ in CLI_ERRORS])
def test_cli_errors_name_the_input_and_the_fix(bad_files: Path, capsys, argv: list[str], rc: int, match: str) -> None:
    """Each was an internal exception (OverflowError, InvalidURL, RecursionError, "an unexpected error"), a
    retried connection, or a training run that would not end; now one line names the flag or file."""
    from ragkit.cli import main

    args = [a.replace("{d}", str(bad_files)) for a in argv]
    assert main(["--quiet", *args]) == rc
    err = capsys.readouterr().err
    assert re.search(match, err), err[-500:]
    assert "unexpected error" not in err and "Traceback" not in err and "secret" not in err


def test_data_file_that_is_not_text_is_named(bad_files: Path, tiny_lm_dir: Path, capsys) -> None:
    from ragkit.cli import main

    assert main(["--quiet", "eval", "--model", str(tiny_lm_dir), "--data-file", str(bad_files / "png.png"),
                 "--limit", "1", "--out", str(bad_files / "e.json")]) == 1
    assert re.search(r"png\.png: not UTF-8 text .*data file", capsys.readouterr().err)
    assert main(["--quiet", "eval", "--model", str(tiny_lm_dir), "--data-file", str(bad_files / "deep.json"),
                 "--limit", "1", "--out", str(bad_files / "e.json")]) == 1
    assert "nested too deeply" in capsys.readouterr().err
