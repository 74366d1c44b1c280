"""`ragkit index` / `ragkit search` end to end through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragkit.cli import main
from ragkit.io import write_jsonl


@pytest.fixture()
def corpus_file(tmp_path: Path) -> Path:
    rows = [
        {"id": "paris", "title": "Paris", "text": "Paris is the capital of France."},
        {"id": "berlin", "title": "Berlin", "text": "Berlin is the capital of Germany."},
        {"id": "rome", "text": "Rome is the capital of Italy."},
    ]
    write_jsonl(tmp_path / "corpus.jsonl", rows)
    return tmp_path / "corpus.jsonl"


def test_index_and_search_bm25(corpus_file: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "idx"
    assert main(["--quiet", "index", "--corpus", str(corpus_file), "--out", str(out),
                 "--kind", "bm25"]) == 0
    assert "indexed 3 passages" in capsys.readouterr().out
    assert (out / "manifest.json").exists()
    res_file = tmp_path / "res.json"
    assert main(["search", "--index", str(out), "-q", "capital of Germany", "-q", "Italy",
                 "-k", "2", "--out", str(res_file)]) == 0
    table = capsys.readouterr().out
    assert "query: capital of Germany" in table and "berlin" in table
    res = json.loads(res_file.read_text())
    assert res["k"] == 2 and len(res["results"]) == 2
    assert res["results"][0]["hits"][0]["id"] == "berlin"
    assert res["results"][1]["hits"][0] == {**res["results"][1]["hits"][0], "id": "rome", "rank": 1}


def test_search_without_index_uses_bundled_sample(capsys: pytest.CaptureFixture[str]) -> None:
    from ragkit.datasets import sample_corpus

    target = sample_corpus()[7]
    assert main(["search", "-q", target.contents, "-k", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["kind"] == "bm25" and len(res["results"][0]["hits"]) == 3
    assert res["results"][0]["hits"][0]["id"] == target.id


def test_dense_index_via_cli(corpus_file: Path, tmp_path: Path, tiny_encoder_dir: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dense"
    assert main(["--quiet", "index", "--corpus", str(corpus_file), "--out", str(out), "--kind",
                 "dense", "--embedder", str(tiny_encoder_dir), "--device", "cpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "dense" and summary["n_docs"] == 3
    assert main(["search", "--index", str(out), "-q", "France", "-k", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert sorted(h["id"] for h in res["results"][0]["hits"]) == ["berlin", "paris", "rome"]
    # a foreign embedder is refused with a clear message
    assert main(["search", "--index", str(out), "-q", "France",
                 "--embedder", "sentence-transformers/all-mpnet-base-v2"]) == 1
    assert "was built with embedder" in capsys.readouterr().err


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--index", str(tmp_path / "missing"), "-q", "x"]) == 1
    assert "no index folder" in capsys.readouterr().err
    assert main(["search", "-q", "x", "-k", "0"]) == 2  # a usage error, before any work
    assert "-k/--k: must be >= 1, got 0" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    assert main(["index", "--corpus", str(bad), "--out", str(tmp_path / "o")]) == 1
    assert "duplicate passage id 'a'" in capsys.readouterr().err
