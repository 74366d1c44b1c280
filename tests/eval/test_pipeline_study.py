"""experiments/pipeline/run.py: the frozen-config rule, the selection rule and the fidelity summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def study(load_bench):
    return load_bench("pipeline/run")


def test_dev_stage_refuses_a_config_that_is_not_committed(study, tmp_path: Path) -> None:
    cfg = tmp_path / "my-dev.json"
    cfg.write_text(json.dumps({"stage": "dev", "data_file": str(tmp_path / "never-read.jsonl")}), encoding="utf-8")
    with pytest.raises(SystemExit, match="frozen config: commit"):
        study.main(["--config", str(cfg)])
    assert study.config_commit(str(cfg)) == (None, False)


def test_committed_dev_configs_are_frozen_before_any_result(study) -> None:
    root = Path(__file__).resolve().parents[2]
    for f in sorted((root / "experiments" / "pipeline" / "configs").glob("*-dev*.json")):
        cfg = json.loads(f.read_text(encoding="utf-8"))
        assert cfg["stage"] == "dev" and cfg["_frozen"]["frozen_before_any_dev_run"] is True, f.name
        assert cfg["_frozen"]["reason"] and "select" in cfg["_frozen"]["reason"]
    assert not list((root / "experiments" / "pipeline").glob("results/*-dev*.json"))


def test_best_reranker_is_label_free_by_metric_then_tokens(study) -> None:
    agg = {"none": {"f1": {"mean": 0.9}},
           "upr": {"f1": {"mean": 0.4}, "cost_per_question": {"tokens_prefilled": 3000}},
           "icr": {"f1": {"mean": 0.4}, "cost_per_question": {"tokens_prefilled": 1000}},
           "moi": {"f1": {"mean": 0.3}, "cost_per_question": {"tokens_prefilled": 9000}},
           "moi_gold": {"f1": {"mean": 0.99}}}
    assert study.best_reranker(agg, "f1") == "icr"  # none is no reranker, moi_gold reads labels
    assert study.best_reranker(agg, "rouge_l") is None


def test_utility_fidelity_by_hand(study) -> None:
    rows = [{"method": "moi", "qid": "q", "utilities": [0.3, 0.1, -0.2, 0.0]},
            {"method": "moi_masked", "qid": "q", "utilities": [0.2, 0.25, -0.1, 0.0]},
            {"method": "moi", "qid": "r", "utilities": [1.0, 2.0, 3.0]},
            {"method": "moi_masked", "qid": "r", "utilities": [3.0, 2.0, 1.0]}]
    f = study.utility_fidelity(rows, k=2)
    # q: ranks (4,3,1,2) vs (3,4,1,2) -> rho = 1 - 6*2/(4*15) = 0.8; top-2 {0,1} vs {1,0}: 1.0
    # r: reversed -> rho = -1; top-2 {2,1} vs {0,1}: 0.5
    assert f["spearman"] == pytest.approx((0.8 - 1.0) / 2)
    assert f["top2_agreement"] == pytest.approx(0.75) and f["questions"] == 2
    assert study.utility_fidelity(rows[:1]) is None


def test_study_contrasts_pair_prune_with_plain_top_k(study) -> None:
    rows = []
    for i in range(10):
        rows.append({"method": "moi", "qid": f"q{i}", "metrics": {"f1": 0.2}})
        rows.append({"method": "moi@prune", "qid": f"q{i}", "metrics": {"f1": 0.5}})
    c = study.study_contrasts(rows, ["f1", "em"], n_boot=200)
    assert list(c) == ["moi@prune - moi"]
    assert c["moi@prune - moi"]["f1"] == pytest.approx([0.3, 0.3, 0.3]) and "em" not in c["moi@prune - moi"]
