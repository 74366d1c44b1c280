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
    # a dev result names the commit of its config, and the config has not changed since
    for f in sorted((root / "experiments" / "pipeline").glob("results/*-dev*.json")):
        if f.name.endswith(".eval.json"):
            continue
        r = json.loads(f.read_text(encoding="utf-8"))
        assert r["stage"] == "dev" and r["config_frozen"] is True and len(r["config_commit"] or "") == 40, f.name
        if _full_history(root):  # a shallow clone or an exported tree cannot name a file's last commit
            assert study.config_commit(str(root / r["config"])) == (r["config_commit"], True), f.name


def _full_history(root: Path) -> bool:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return out == "false"


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


def test_headline_pairs_rows_across_runs_on_committed_results(load_bench, tmp_path: Path) -> None:
    """compare.py: one reranker against baselines from two runs, Holm-corrected over the whole table."""
    compare = load_bench("pipeline/compare")
    res = Path(compare.__file__).parent / "results"
    out = tmp_path / "h.json"
    runs = {"b75": str(res / "hotpotqa-select.eval.json"), "b0": str(res / "hotpotqa-select-blend0.eval.json")}
    assert compare.main(["--runs", json.dumps(runs), "--reranker", "b0:moi_masked",
                         "--against", "b75:none,b75:upr,b75:moi_masked", "--bootstrap", "300", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    h = r["headline"]
    assert h["baseline"] is None and h["family"] == 3 * 4  # 3 baselines x (recall@3, ndcg@10, f1, em)
    by = {(x["contrast"], x["metric"]): x for x in h["rows"]}
    # the means are the committed aggregates' differences (20 train questions, paired)
    agg75 = json.loads((res / "hotpotqa-select.json").read_text())["aggregate"]
    agg0 = json.loads((res / "hotpotqa-select-blend0.json").read_text())["aggregate"]
    for base in ("none", "upr", "moi_masked"):
        for m in ("recall@3", "f1"):
            want = agg0["moi_masked"][m]["mean"] - agg75[base][m]["mean"]
            assert by[(f"b0:moi_masked - b75:{base}", m)]["mean"] == pytest.approx(want)
    assert r["questions_in_common"] == 20 and r["cost"]["b75:upr"]["cost_per_question"]["generator_calls"] == 21
    assert all(x["holm_lo"] <= x["lo"] + 1e-12 for x in h["rows"])
    with pytest.raises(SystemExit, match="no rows for b75:moi"):
        compare.main(["--runs", json.dumps(runs), "--against", "b75:moi", "--reranker", "b0:none", "--out", str(out)])


def test_a_finished_study_run_started_again_rewrites_nothing(study, tiny_lm_dir: Path, shared_data: Path,
                                                             tmp_path: Path) -> None:
    """A queue restarts every step; a finished one must leave its JSON (wall time, corpus size) as it was."""
    data = tmp_path / "h4.jsonl"
    with open(shared_data / "hotpotqa" / "dev.jsonl", encoding="utf-8") as f:
        data.write_text("".join(line for _, line in zip(range(4), f)), encoding="utf-8")
    out = tmp_path / "r.json"
    argv = ["--data-file", str(data), "--limit", "2", "--candidates", "4", "-k", "2", "--methods", "none",
            "--model", str(tiny_lm_dir), "--max-new-tokens", "2", "--bootstrap", "10", "--passage-tokens", "12",
            "--device", "cpu", "--quiet", "--out", str(out)]
    assert study.main(argv) == 0
    first, first_eval = out.read_bytes(), out.with_suffix(".eval.json").read_bytes()
    assert json.loads(first_eval)["protocol"]["corpus_passages"] == 40
    assert study.main(argv) == 0
    assert out.with_suffix(".eval.json").read_bytes() == first_eval
    assert out.read_bytes() == first  # wall time, machine and the keys' order as the run that did the work wrote them
