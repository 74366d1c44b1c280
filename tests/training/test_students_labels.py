"""Labels a user can make: label-free MoI (question outcome), gold-passage labels, pipeline candidates, .gz files."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

SAMPLE = Path(__file__).resolve().parents[2] / "ragkit" / "data" / "hotpotqa_dev_sample.jsonl"


def test_gold_passage_labels_on_bm25_candidates_and_gz(tmp_path: Path, capsys) -> None:
    from ragkit.cli import main
    from ragkit.training.labels import read_labels

    out = tmp_path / "gold.jsonl"
    rc = main(["distill", "labels", "--data-file", str(SAMPLE), "--retriever", "bm25", "--candidates", "6",
               "--outcome", "passages", "--out", str(out), "--json"])
    assert rc == 0, capsys.readouterr().err
    labs = read_labels(out)
    assert labs and all(len(lab.passage_ids) == 6 for lab in labs)
    for lab in labs:
        assert set(lab.u) == {0.0, 1.0} and lab.outcome == "gold_passages" and lab.generator_calls == 0
        assert {pid for pid, u in zip(lab.passage_ids, lab.u) if u == 1.0} == set(lab.gold_ids) & set(lab.passage_ids)
    # BM25 candidates, not the record's own 10 paragraphs in their order
    given = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(labs) <= len(given)
    gz = tmp_path / "gold.jsonl.gz"
    with open(out, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    assert read_labels(gz) == labs  # a committed compressed label file reads as the plain one


def test_label_free_question_outcome(tiny_lm_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("ragkit.debias.moi")
    from ragkit.generation import Generator
    from ragkit.training.labels import generate_labels, read_labels
    from ragkit.types import Passage, QARecord

    ps = tuple(Passage(id=f"p{i}", text=t) for i, t in enumerate(["Paris is in France.", "Dogs bark.", "Rome."]))
    recs = [QARecord(id="a", question="Where is Paris?", answers=("France",), passages=ps)]
    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    out = tmp_path / "q.jsonl"
    generate_labels(gen, recs, out, outcome="question", show_progress=False)
    (lab,) = read_labels(out)
    assert lab.outcome == "question" and lab.design == "loo" and np.all(np.isfinite(lab.u))
    with pytest.raises(ValueError, match="label outcome"):
        generate_labels(gen, recs, tmp_path / "x.jsonl", outcome="consensus", show_progress=False)
