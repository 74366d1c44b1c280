"""A bare ``ragkit eval`` shows what the library is for: the given order, MoI (default and prior designs), a baseline,
paired."""

from __future__ import annotations

import pytest

from ragkit.cli import build_parser
from ragkit.cli import eval as eval_cli
from ragkit.eval.report import paired_text
from ragkit.eval.runner import paired_differences


def test_bare_eval_runs_given_order_both_moi_designs_and_a_baseline() -> None:
    args = build_parser().parse_args(["eval"])
    assert args.methods is None  # chosen by _run_eval: the sample's methods
    assert eval_cli.SAMPLE_METHODS[0] == "none"  # the baseline of the paired differences
    assert {"moi", "moi_prior"} <= set(eval_cli.SAMPLE_METHODS) and len(eval_cli.SAMPLE_METHODS) >= 4
    assert build_parser().parse_args(["eval", "--data-file", "x.jsonl"]).methods is None


def test_paired_differences_pair_questions() -> None:
    rows = []
    for i in range(10):
        rows.append({"method": "none", "qid": f"q{i}", "metrics": {"em": 0.0, "f1": 0.5}})
        rows.append({"method": "moi_prior", "qid": f"q{i}", "metrics": {"em": 1.0 if i < 3 else 0.0, "f1": 0.5}})
    rows.append({"method": "moi_prior", "qid": "only-here", "metrics": {"em": 1.0, "f1": 1.0}})  # unpaired: left out
    d = paired_differences(rows, "hotpotqa", ("none", "moi_prior"), n_bootstrap=200, seed=0)
    em = d["moi_prior - none"]["em"]
    assert em["n"] == 10 and em["mean"] == pytest.approx(0.3)
    assert 0.0 <= em["lo"] <= 0.3 <= em["hi"] <= 0.7
    f1 = d["moi_prior - none"]["f1"]
    assert f1["mean"] == 0.0 and f1["lo"] == 0.0 == f1["hi"]
    text = paired_text({"paired": d})
    assert "moi_prior - none: em 0.300 [" in text
    assert paired_differences(rows, "hotpotqa", ("none",), 10, 0) == {}
