"""experiments/psgrpo/psgrpo_run.py: gold-F1 weights side by side on the same dev sets, paired, resumable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest


def test_paired_block_is_set_by_set(load_bench) -> None:
    pr = load_bench("psgrpo_run")
    a = {"per_set": [{"qid": "q1", "generator": 1.0, "f1": 0.5}, {"qid": "q2", "generator": 0.5, "f1": 0.0},
                     {"qid": "q3", "generator": 0.0, "f1": 1.0}]}
    b = {"per_set": [{"qid": "q2", "generator": 0.25, "f1": 0.0}, {"qid": "q1", "generator": 0.5, "f1": 0.5}]}
    d = pr.paired_block(a, b)
    # q3 is in one run only; q1 and q2 pair by id, not by position: (0.5 + 0.25) / 2
    assert d["generator"][0] == pytest.approx(0.375)
    assert d["f1"] == [0.0, 0.0, 0.0]
    assert d["generator"][1] <= d["generator"][0] <= d["generator"][2]
    assert "em" not in d  # not in the sets


@pytest.mark.usefixtures("shared_data")  # the script reads ../shared/data
def test_two_gold_weights_on_the_same_sets_then_resume(load_bench, tiny_lm_dir: Path, tmp_path: Path,
                                                      caplog) -> None:
    pr = load_bench("psgrpo_run")
    out = tmp_path / "ps.json"
    argv = ["--model", str(tiny_lm_dir), "--out", str(out), "--gold-weights", "0,0.5", "--train-questions", "2",
            "--eval-questions", "3", "--steps", "1", "--n", "2", "--g", "2", "--k", "2",
            "--passage-max-tokens", "8", "--eval-max-new", "3", "--max-completion-length", "3",
            "--run-dir", str(tmp_path / "runs"), "--save-steps", "1"]
    assert pr.main(argv) == 0
    got = json.loads(out.read_text())
    assert set(got["runs"]) == {"0", "0.5"}
    assert [r["gold_weight"] for r in got["runs"].values()] == [0.0, 0.5]
    assert (tmp_path / "runs" / "gold-0" / "final").is_dir() and (tmp_path / "runs" / "gold-0.5" / "final").is_dir()
    for run in got["runs"].values():
        assert run["after"]["n_sets"] == got["before"]["n_sets"] == 3
        m, lo, hi = run["after_minus_before"]["generator"]
        assert lo <= m <= hi
        assert m == pytest.approx(run["after"]["generator_consistency"] - got["before"]["generator_consistency"])
    assert set(got["between"]) == {"0.5_minus_0"} and "f1" in got["between"]["0.5_minus_0"]
    # same settings again: nothing is re-evaluated or retrained
    with caplog.at_level(logging.INFO):
        assert pr.main(argv) == 0
    assert "before: reused" in caplog.text and caplog.text.count("reused from") == 3
    assert json.loads(out.read_text())["runs"] == got["runs"]
    with pytest.raises(SystemExit):
        pr.main([*argv[:5], "0,-1"])  # a negative weight is refused
