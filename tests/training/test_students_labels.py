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


def test_masked_labels_are_what_moi_masked_computes(tiny_lm_dir: Path, tmp_path: Path, capsys) -> None:
    """`--design masked --outcome question`: the utilities of the moi_masked reranker, resumable, costed."""
    from ragkit.cli import main
    from ragkit.debias import get_reranker
    from ragkit.generation import Generator
    from ragkit.training.labels import read_labels

    out = tmp_path / "masked.jsonl"
    argv = ["distill", "labels", "--data-file", str(SAMPLE), "--retriever", "bm25", "--candidates", "5",
            "--design", "masked", "--outcome", "question", "--model", str(tiny_lm_dir), "--device", "cpu",
            "--passage-max-tokens", "48", "--out", str(out), "--json"]
    assert main([*argv, "--limit", "2"]) == 0, capsys.readouterr().err
    stats = json.loads(capsys.readouterr().out)
    assert stats["written"] == 2 and stats["seconds_per_question"] > 0
    labs = read_labels(out)
    assert len(labs) == 2
    for lab in labs:
        assert lab.design == "masked" and lab.outcome == "question" and lab.generator_calls == 6  # k + 1 rows
        cost = lab.metadata["cost"]
        assert cost["tokens_prefilled"] > 0 and cost["forwards"] >= 2 and cost["seconds"] > 0
        assert cost["batch_questions"] == 1  # each label's own cost, whatever --batch-queries says
        assert isinstance(lab.metadata["fallback"], bool)
    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False, passage_max_tokens=48)
    reranker = get_reranker("moi_masked", gen, blend=0)
    for lab in labs:
        ranked = reranker.rank(lab.question, lab.passages())
        np.testing.assert_allclose(lab.u, ranked.info.details["raw_utilities"], rtol=1e-5, atol=1e-6)
        if not lab.metadata["fallback"]:  # unblended, no fallback: the reranker ranks by the label's utilities
            assert ranked.ids() == list(lab.ranking)
    # resumable: a larger --limit appends only the new question; the first two keep their candidates
    assert main([*argv, "--limit", "3"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["skipped_existing"] == 2
    again = read_labels(out)
    assert len(again) == 3 and again[:2] == labs
    # the moi_attn probe fits to masked labels (its targets are the label utilities)
    probe = tmp_path / "probe.json"
    assert main(["distill", "probe", "--labels", str(out), "--model", str(tiny_lm_dir), "--device", "cpu",
                 "--passage-max-tokens", "48", "--probe-out", str(probe), "--holdout", "0.34", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["num_queries"] == 2 and fitted["held_out_fidelity"]["num_queries"] == 1
    assert fitted["label_design"] == "masked" and fitted["label_outcome"] == "question" and probe.exists()
    # the masked estimator scores the question: another outcome is refused with the fix
    assert main([*argv[:-3], "--out", str(tmp_path / "x.jsonl"), "--outcome", "gold"]) == 1
    assert "--outcome question" in capsys.readouterr().err


def test_pipeline_candidates_do_not_depend_on_limit(tmp_path: Path, capsys) -> None:
    """The BM25 corpus pools every record of --data-file, as the pipeline study does, whatever --limit is."""
    from ragkit.cli import main
    from ragkit.training.labels import read_labels

    runs = {}
    for name, extra in (("all", []), ("two", ["--limit", "2"])):
        out = tmp_path / f"{name}.jsonl"
        rc = main(["distill", "labels", "--data-file", str(SAMPLE), "--retriever", "bm25", "--candidates", "6",
                   "--outcome", "passages", "--out", str(out), *extra])
        assert rc == 0, capsys.readouterr().err
        runs[name] = {lab.qid: lab.passage_ids for lab in read_labels(out)}
    assert runs["two"] and all(runs["all"][q] == ids for q, ids in runs["two"].items())
