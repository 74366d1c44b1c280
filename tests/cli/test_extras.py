"""A missing optional dependency is named with its extra before a command does any work.

Each case hides one module (``sys.modules[name] = None``, which makes its import fail) and runs
the command in-process on inputs that do not exist: the error must name the extra, so the
check ran before the command read its data or loaded a model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ragkit.cli import main

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.mark.parametrize("module, argv, extra", [
    ("peft", ["train", "cord", "--data_file", "missing.jsonl", "--output_dir", "{tmp}/run", "--lora"], "train"),
    ("datasets", ["distill", "--labels", "missing.jsonl", "--out", "{tmp}/student"], "train"),
    ("matplotlib", ["eval", "--data-file", "missing.jsonl", "--plot", "{tmp}/plots"], "plots"),
    ("matplotlib", ["bias-profile", "--data-file", "missing.jsonl", "--out", "{tmp}/p.json", "--plot", "p.png"],
     "plots"),
    ("matplotlib", ["eval", "sweep", "--data-file", "missing.jsonl.gz", "--plot", "{tmp}/s.png"], "plots"),
    ("spacy", ["eval", "--dataset", "msmarco", "--data-file", "missing.json"], "msmarco"),
    ("uvicorn", ["serve", "--reranker", "none"], "serve"),
])
def test_missing_extra_is_named_before_any_work(module: str, argv: list[str], extra: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.chdir(tmp_path)
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--quiet"])
    err = capsys.readouterr().err
    assert rc != 0
    assert f'pip install "ragkit[{extra}]"' in err, err
    assert module in err
    assert "missing" not in err.replace(module, "")  # not an error about the data file: the check came first
    assert not any(tmp_path.iterdir())  # nothing written


def test_msmarco_detected_from_the_file_needs_spacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """The dataset told from --data-file's content decides too (no --dataset given)."""
    data = SHARED / "msmarco" / "qna_v1.1_sample.json"
    if not data.is_file():
        pytest.skip("no MS MARCO sample in ../shared/data")
    monkeypatch.setitem(sys.modules, "spacy", None)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--data-file", str(data), "--limit", "1", "--quiet"]) == 1
    assert 'pip install "ragkit[msmarco]"' in capsys.readouterr().err
