"""Index integrity (manifest protected, nothing read outside an index folder), nonsense input
refused, size limits and a streamed corpus (issue 18, items 3, 5 and 9)."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
from pathlib import Path

import pytest

from ragkit.retrievers import BM25Retriever, HybridRetriever, IndexFormatError, load_retriever
from ragkit.retrievers.base import _manifest_digest, check_passages, iter_passages
from ragkit.retrievers.fusion import fuse
from ragkit.types import Passage

CORPUS = [
    Passage("a", "Paris is the capital of France.", "France"),
    Passage("b", "Berlin is the capital of Germany.", "Germany"),
    Passage("c", "The quick brown fox jumps over the lazy dog."),
    Passage("d", "Madrid is the capital and largest city of Spain.", "Spain"),
]


def _bm25(passages=CORPUS) -> BM25Retriever:
    return BM25Retriever(show_progress=False).index(passages)


def _edit(folder: Path, fn, resign: bool) -> None:
    """Edit a saved manifest; ``resign`` recomputes its own checksum (a deliberate edit)."""
    m = json.loads((folder / "manifest.json").read_text())
    fn(m)
    if resign:
        m["manifest_sha256"] = _manifest_digest(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _damage_text(folder: Path, sub: str = "") -> None:
    p = folder / sub / "passages.jsonl"
    p.write_text(p.read_text().replace("Paris", "Rome"))


# ---------------------------------------------------------------- 18.3 manifest protected
@pytest.mark.parametrize("resign", [False, True])
def test_manifest_without_its_file_list_is_damaged(tmp_path: Path, resign: bool) -> None:
    # today: deleting `files` turned every checksum off and the damaged text was served
    d = _bm25().save(tmp_path / "idx")
    _damage_text(d)
    _edit(d, lambda m: m.pop("files"), resign)
    with pytest.raises(IndexFormatError, match="damaged"):
        load_retriever(d)


@pytest.mark.parametrize("drop", ["passages.jsonl", "bm25s/vocab.index.json"])
def test_manifest_must_list_the_index_files(tmp_path: Path, drop: str) -> None:
    d = _bm25().save(tmp_path / "idx")
    _damage_text(d)
    _edit(d, lambda m: m["files"].pop(drop), resign=True)
    with pytest.raises(IndexFormatError, match="does not list"):
        load_retriever(d)


def test_edited_manifest_fails_its_own_checksum(tmp_path: Path) -> None:
    d = _bm25().save(tmp_path / "idx")
    _edit(d, lambda m: m["params"].update(k1=0.1), resign=False)
    with pytest.raises(IndexFormatError, match="own checksum"):
        load_retriever(d)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(comment="hi"), "unknown field"),
    (lambda m: m.pop("n_docs"), "lacks the field"),
    (lambda m: m.update(n_docs="4"), "should be a int"),
])
def test_unknown_missing_or_mistyped_field_is_a_clear_error(tmp_path: Path, change, message) -> None:
    d = _bm25().save(tmp_path / "idx")
    _edit(d, change, resign=True)
    with pytest.raises(IndexFormatError, match=message):
        load_retriever(d)


def test_numba_kernel_is_cached_on_disk() -> None:
    # the JIT compile (seconds) happens once per machine; later processes load machine code
    k = pytest.importorskip("ragkit.retrievers._bm25_numba")
    from numba.core.caching import NullCache

    for fn in (k.topk_batch, k._sift_to_root, k._sift_to_leaf, k._below):
        assert not isinstance(fn._cache, NullCache), fn


def test_checks_cannot_be_skipped(tmp_path: Path) -> None:
    assert "verify" not in inspect.signature(BM25Retriever.load).parameters
    d = _bm25().save(tmp_path / "idx")
    _damage_text(d)
    with pytest.raises(TypeError, match="cannot be switched off"):
        BM25Retriever.load(d, verify=False)
    with pytest.raises(IndexFormatError, match="checksum"):
        BM25Retriever.load(d)


# ---------------------------------------------------------------- 18.3 nothing read outside
def test_files_key_outside_the_folder_is_never_opened(tmp_path: Path) -> None:
    # today `../secret` was opened and hashed: with its right digest the index even loaded, and
    # "missing" vs "checksum" told a caller whether any path exists
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    msgs = []
    for i, (rel, dig) in enumerate([("../secret.txt", digest), ("../nothing-here", "0" * 64),
                                     ("../../etc/passwd", "0" * 64), ("/etc/passwd", "0" * 64),
                                     ("bm25s/../../secret.txt", digest)]):
        d = _bm25().save(tmp_path / f"idx{i}")
        _edit(d, lambda m, rel=rel, dig=dig: m["files"].update({rel: dig}), resign=True)
        with pytest.raises(IndexFormatError, match="not a plain relative path") as e:
            load_retriever(d)
        msgs.append(str(e.value).replace(rel, "X").replace(str(d), "D"))
    assert len(set(msgs)) == 1  # the same answer whether the outside path exists or not


def test_symlink_leading_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    d = _bm25().save(tmp_path / "idx")
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes((d / "passages.jsonl").read_bytes())  # same bytes: checksum would pass
    (d / "passages.jsonl").unlink()
    os.symlink(outside, d / "passages.jsonl")
    with pytest.raises(IndexFormatError, match="leads outside the index folder"):
        load_retriever(d)


@pytest.mark.parametrize("child", ["../other", "/tmp", "retriever_0/../../other"])
def test_hybrid_child_outside_the_folder_is_refused(tmp_path: Path, child: str) -> None:
    # today a hybrid child `dir` of `../other` loaded another index (here: other texts)
    hy = HybridRetriever([BM25Retriever(show_progress=False), BM25Retriever(show_progress=False)])
    d = hy.index(CORPUS).save(tmp_path / "hy")
    other = [Passage(p.id, "hostile " + p.text, p.title) for p in CORPUS]
    _bm25(other).save(tmp_path / "other")
    _edit(d, lambda m: m["retrievers"][0].update(dir=child), resign=True)
    with pytest.raises(IndexFormatError, match="not a plain relative path"):
        load_retriever(d)


def test_hybrid_child_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    hy = HybridRetriever([BM25Retriever(show_progress=False), BM25Retriever(show_progress=False)])
    d = hy.index(CORPUS).save(tmp_path / "hy")
    other = [Passage(p.id, "hostile " + p.text, p.title) for p in CORPUS]
    _bm25(other).save(tmp_path / "other")
    import shutil

    shutil.rmtree(d / "retriever_1")
    os.symlink(tmp_path / "other", d / "retriever_1")
    with pytest.raises(IndexFormatError, match="leads outside"):
        load_retriever(d)
    # and an intact hybrid index still loads and searches
    d2 = hy.save(tmp_path / "hy2")
    assert load_retriever(d2).search("capital of France", k=1)[0].ids() == ["a"]


def test_hybrid_sub_index_swapped_for_another_is_refused(tmp_path: Path) -> None:
    import shutil

    hy = HybridRetriever([BM25Retriever(show_progress=False), BM25Retriever(show_progress=False)])
    d = hy.index(CORPUS).save(tmp_path / "hy")
    other = [Passage(p.id, "hostile " + p.text, p.title) for p in CORPUS]  # same ids
    o = _bm25(other).save(tmp_path / "other")
    shutil.rmtree(d / "retriever_0")
    shutil.copytree(o, d / "retriever_0")  # a valid index of its own, but not this one's
    with pytest.raises(IndexFormatError, match="not the sub-index"):
        load_retriever(d)


# ---------------------------------------------------------------- 18.5 nonsense refused
@pytest.mark.parametrize("row, what", [({"id": None, "text": "x"}, "null id"),
                                       ({"id": "a", "text": None}, "null text"),
                                       ({"id": ["a"], "text": "x"}, "ids are strings"),
                                       ({"id": "a", "text": {"t": 1}}, "texts are strings")])
def test_null_ids_and_texts_are_refused(tmp_path: Path, row, what) -> None:
    # today JSON null became the string "None"
    with pytest.raises(ValueError, match=what):
        Passage.from_dict(row)
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"id": "ok", "text": "fine"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"c.jsonl:2: .*{what}"):
        list(iter_passages(f))


def test_null_id_inside_a_saved_index_is_a_damaged_index(tmp_path: Path) -> None:
    d = _bm25().save(tmp_path / "idx")
    lines = (d / "passages.jsonl").read_text().splitlines()
    lines[1] = json.dumps({"id": None, "text": "x"})
    (d / "passages.jsonl").write_text("\n".join(lines) + "\n")
    digest = hashlib.sha256((d / "passages.jsonl").read_bytes()).hexdigest()
    _edit(d, lambda m: m["files"].update({"passages.jsonl": digest}), resign=True)
    with pytest.raises(IndexFormatError, match="passages.jsonl line 2: .*null id"):
        load_retriever(d)


def test_duplicate_ids_are_all_named() -> None:
    ps = CORPUS + [Passage("a", "again"), Passage("c", "again"), Passage("a", "thrice")]
    with pytest.raises(ValueError, match=r"duplicate passage ids 'a' \(3x\), 'c' \(2x\)"):
        BM25Retriever(show_progress=False).index(ps)


@pytest.mark.parametrize("bad", [float("nan"), math.inf, "x", None])
def test_nan_fusion_weight_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="weight 0"):
        HybridRetriever([BM25Retriever(), BM25Retriever()], weights=[bad, 1.0])
    runs = [{"q": {"a": 1.0, "b": 0.5}}, {"q": {"a": 0.2}}]
    for method in ("rrf", "minmax"):
        with pytest.raises(ValueError, match="weight 0"):
            fuse(runs, method=method, weights=[bad, 1.0])


def test_nan_scores_and_rrf_k_are_refused() -> None:
    runs = [{"q": {"a": float("nan"), "b": 0.5}}, {"q": {"a": 0.2}}]
    with pytest.raises(ValueError, match="finite scores"):
        fuse(runs, method="minmax")
    with pytest.raises(ValueError, match="RRF constant"):
        fuse([{"q": {"a": 1.0}}], method="rrf", k=float("nan"))


def test_null_query_is_refused() -> None:
    with pytest.raises(ValueError, match="not a string"):
        _bm25().search(["capital", None])


# ---------------------------------------------------------------- 18.9 limits and streaming
def test_a_5mb_passage_hits_a_named_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    big = Passage("big", "word " * 1_000_000)  # 5 MB
    with pytest.raises(ValueError, match="RAGKIT_MAX_PASSAGE_CHARS"):
        check_passages([big])
    monkeypatch.setenv("RAGKIT_MAX_PASSAGE_CHARS", "6000000")
    assert check_passages([big]) == [big]
    monkeypatch.setenv("RAGKIT_MAX_PASSAGE_CHARS", "many")
    with pytest.raises(ValueError, match="not a whole number"):
        check_passages([big])


def test_a_100kb_query_hits_a_named_limit() -> None:
    r = _bm25()
    q = "capital " * 12_800  # 100 KB
    with pytest.raises(ValueError, match="RAGKIT_MAX_QUERY_CHARS"):
        r.search(q)
    r.max_query_chars = 200_000
    assert r.search(q, k=1)[0].ids()[0] in {"a", "b", "d"}


def test_corpus_file_is_streamed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip
    import types

    f = tmp_path / "c.jsonl.gz"
    with gzip.open(f, "wt", encoding="utf-8") as g:
        for p in CORPUS:
            g.write(json.dumps(p.to_dict()) + "\n\n")
    it = iter_passages(f)
    assert isinstance(it, types.GeneratorType)
    r = BM25Retriever(show_progress=False, chunk_size=1).index(it)  # 1 passage per chunk
    assert r.search("capital of Germany", k=1)[0].ids() == ["b"]
    assert r.passages == CORPUS
    monkeypatch.setenv("RAGKIT_MAX_PASSAGE_CHARS", "40")  # 'c' has 44 characters, on line 5
    with pytest.raises(ValueError, match=r"c.jsonl.gz:5: passage 'c' has 44 characters"):
        list(iter_passages(f))
