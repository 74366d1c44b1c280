"""experiments/cord/confirm.py: the pre-registered plan carried out end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def study(load_bench) -> ModuleType:
    return load_bench("cord/confirm")


def _small_plan(tmp_path: Path) -> Path:
    """The committed plan with fewer arms and one extra seed (the structure the script reads is the same)."""
    plan = json.loads((Path(__file__).parents[2] / "experiments" / "cord" / "plan.json").read_text())
    plan["arms"] = {k: v for k, v in plan["arms"].items() if k in ("base", "shuffle", "cord", "cord:alpha=1")}
    plan["seeds"]["second_round"]["seeds"] = [1]
    plan["intervals"]["headline_contrasts"] = ["shuffle - base", "cord - base", "cord:alpha=1 - base",
                                               "cord - shuffle", "cord:alpha=1 - shuffle"]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    return p


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_plan_carried_out_on_a_tiny_model(study: ModuleType, tiny_lm_dir: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    plan = _small_plan(tmp_path)
    out = tmp_path / "confirm.json"
    args = ["--plan", str(plan), "--out", str(out), "--model", str(tiny_lm_dir), "--workdir", str(tmp_path / "w"),
            "--max-questions", "3", "--max-steps", "1", "--passage-max-tokens", "8", "--n-boot", "200"]
    with pytest.raises(SystemExit, match="commit the plan"):
        study.main(args)  # an untracked plan is refused
    assert study.main([*args, "--allow-uncommitted-plan"]) == 0
    r = json.loads(out.read_text())
    assert r["plan"] == {"path": str(plan), "commit": None} and r["smoke"] is True
    assert r["contrasts_status"] == "final"
    assert r["best_cord"] in ("cord", "cord:alpha=1") and set(r["selection_spread"]) == {"cord", "cord:alpha=1"}
    arms = r["arms"]
    assert arms["base"]["seeds"] == [0] and arms["shuffle"]["seeds"] == [0, 1]
    assert arms[r["best_cord"]]["seeds"] == [0, 1] and all(a["n_questions"] == 3 for a in arms.values())
    m = arms["shuffle"]["per_seed"]["1"]["metrics"]
    assert set(m) == {"spread", "mean_logprob", "em", "psr"} and m["spread"] >= 0 and 0 <= m["psr"] <= 1
    # k = 20 only for base, shuffle and the chosen CORD arm
    other = ({"cord", "cord:alpha=1"} - {r["best_cord"]}).pop()
    assert "evaluation-k20" in arms["base"]["per_seed"]["0"]["sweeps"]
    assert "evaluation-k20" not in arms[other]["per_seed"]["0"]["sweeps"]
    c = r["contrasts"]["spread"]
    assert set(c) == {"shuffle - base", "cord - base", "cord:alpha=1 - base", "cord - shuffle",
                      "cord:alpha=1 - shuffle"}
    for v in c.values():
        assert v["lo_bonferroni"] <= v["lo"] <= v["mean"] <= v["hi"] <= v["hi_bonferroni"] and v["p_holm"] >= v["p"]
    assert r["decision"]["verdict"] in ("adopt BEST_CORD's settings as CORDConfig defaults",
                                        "keep the paper's defaults; recommend shuffle as the baseline")
    # the final run prints the page's tables: both context sizes, every contrast, the choice and the verdict
    printed = capsys.readouterr().out
    assert printed.count("## k = ") == 2 and "| shuffle | 2 | 3 |" in printed and "EM slot 10" in printed
    assert all(f"| {name} | spread |" in printed for name in c) and f"| {r['best_cord']} |" in printed
    assert printed.rstrip().endswith(r["decision"]["verdict"])
    # a re-run resumes: nothing is trained or swept again
    calls: list = []
    monkeypatch.setattr("ragkit.training.cord.train_cord", lambda *a, **k: calls.append(a))
    assert study.main([*args, "--allow-uncommitted-plan"]) == 0 and calls == []
    # other settings into the same JSON are refused, not mixed in with the sweeps already there
    with pytest.raises(SystemExit, match="other settings"):
        study.main([*args, "--max-questions", "2", "--allow-uncommitted-plan"])


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_a_lost_work_folder_retrains_no_swept_model(study: ModuleType, tiny_lm_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model is swept right after its training: a run stopped during the second training, whose work
    folder is then lost (a new machine), trains the first arm again only if a sweep of it is missing."""
    import shutil

    import ragkit.training.cord as cord

    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    plan, out, work = _small_plan(tmp_path), tmp_path / "confirm.json", tmp_path / "w"
    args = ["--plan", str(plan), "--out", str(out), "--model", str(tiny_lm_dir), "--workdir", str(work),
            "--max-questions", "2", "--max-steps", "1", "--passage-max-tokens", "8", "--n-boot", "50",
            "--allow-uncommitted-plan"]
    real, seen = cord.train_cord, []

    class Stop(Exception):
        pass

    def stop_at_second(examples, config):
        seen.append((config.loss, config.alpha, config.seed))
        if len(seen) == 2:
            raise Stop
        return real(examples, config)

    monkeypatch.setattr(cord, "train_cord", stop_at_second)
    with pytest.raises(Stop):
        study.main(args)
    partial = json.loads(out.read_text())["arms"]["shuffle"]
    first = partial["per_seed"]["0"]
    assert {"evaluation-k10", "evaluation-k20"} <= set(first["sweeps"])  # swept before the next arm trains
    assert partial["seeds"] == [0] and partial["n_questions"] == 2  # a partial JSON names them too
    shutil.rmtree(work)
    seen.clear()
    monkeypatch.setattr(cord, "train_cord", lambda examples, config: seen.append(config.loss) or real(examples, config))
    assert study.main(args) == 0
    assert seen.count("shuffle") == 1  # seed 1 only


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_only_and_partial_dir_let_short_lived_machines_share_the_work(study: ModuleType, tiny_lm_dir: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``--only`` works on the named models alone and the report stays interim until every sweep is recorded;
    ``--partial-dir`` receives the sweeps' rows, and a recorded sweep's file is removed."""
    import ragkit.eval.sweep as sweep_module

    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    plan, out, parts = _small_plan(tmp_path), tmp_path / "confirm.json", tmp_path / "kept"
    args = ["--plan", str(plan), "--out", str(out), "--model", str(tiny_lm_dir), "--workdir", str(tmp_path / "w"),
            "--max-questions", "2", "--max-steps", "1", "--passage-max-tokens", "8", "--n-boot", "50",
            "--allow-uncommitted-plan", "--partial-dir", str(parts)]
    monkeypatch.setattr("ragkit.models.fast_on_cpu", lambda dtype: dtype == "float32")
    half = json.loads(plan.read_text())
    half["dtype"]["value"] = "bfloat16"
    (tmp_path / "half.json").write_text(json.dumps(half))
    full = [a for a in args if a not in ("--max-steps", "1", "--max-questions", "2")]
    with pytest.raises(SystemExit, match="no fast bfloat16 path"):  # a full run on a CPU without it
        study.main([*full, "--plan", str(tmp_path / "half.json"), "--out", str(tmp_path / "half-out.json")])
    monkeypatch.setattr("ragkit.models.fast_on_cpu", lambda dtype: True)
    for bad, why in (("nonsense:0", "ARM one of"), ("base:1", "seeds \\[0\\] only"), ("shuffle", "ARM:SEED")):
        with pytest.raises(SystemExit, match=why):
            study.main([*args, "--only", bad])
    real, used = sweep_module.position_sweep, []
    monkeypatch.setattr(sweep_module, "position_sweep", lambda *x, **k: used.append(k["partial"]) or real(*x, **k))
    assert study.main([*args, "--only", "shuffle:0"]) == 0
    r = json.loads(out.read_text())
    assert set(r["arms"]) == {"shuffle"} and set(r["arms"]["shuffle"]["per_seed"]) == {"0"}
    assert set(r["arms"]["shuffle"]["per_seed"]["0"]["sweeps"]) == {"evaluation-k10", "evaluation-k20"}
    assert r["contrasts_status"].startswith("interim") and "base:0 evaluation-k10" in r["contrasts_status"]
    assert r["decision"]["verdict"] == "pending" and "best_cord" not in r
    assert used and all(Path(p).parent == parts for p in used) and not list(parts.glob("*.partial.jsonl"))
    assert study.main([*args, "--only", "base:0"]) == 0
    r = json.loads(out.read_text())
    assert set(r["arms"]) == {"shuffle", "base"} and set(r["contrasts"]["spread"]) == {"shuffle - base"}
    assert r["contrasts_status"].startswith("interim") and r["decision"]["verdict"] == "pending"
    assert study.main(args) == 0  # the rest, without --only
    r = json.loads(out.read_text())
    assert r["contrasts_status"] == "final" and r["decision"]["verdict"] != "pending"
    assert r["arms"]["shuffle"]["seeds"] == [0, 1]


def test_cord_config_defaults_follow_the_committed_decision() -> None:
    """Until the confirmation decides, ``CORDConfig`` keeps the paper's defaults (score-aware alpha,
    lambda 1); once it has decided, the defaults are what its rule chose and the docstring names the run."""
    import dataclasses

    from ragkit.training.cord import CORDConfig

    root = Path(__file__).parents[2]
    result = json.loads((root / "experiments" / "cord" / "results" / "confirm-qwen-cpu.json").read_text())
    decision = result["decision"]
    defaults = {f.name: f.default for f in dataclasses.fields(CORDConfig) if f.name in ("loss", "lam", "alpha")}
    paper = {"loss": "cord", "lam": 1.0, "alpha": None}
    if decision["verdict"] == "pending":
        assert defaults == paper, "the confirmation has not decided: keep the paper's defaults"
        return
    expected = decision["settings"] if decision["verdict"].startswith("adopt") else paper
    assert defaults == expected, f"the committed decision ({decision['verdict']}) sets CORDConfig's defaults"
    assert "confirm-qwen-cpu.json" in (CORDConfig.__doc__ or ""), "CORDConfig's docstring names the deciding run"


def test_table_means_over_seeds_and_questions(study: ModuleType) -> None:
    """Hand-computed: an arm's cell is the mean over its seeds and questions, the gap and EM by slot are
    means over seeds; an arm without a k = 20 sweep has no k = 20 row; interim contrasts are not shown."""
    def sweep(spreads: list[float], ems: list[float], gap: float, em_slots: list[float], k: int = 10) -> dict:
        pqm = {f"q{i}": {"spread": s, "mean_logprob": -1.0, "em": e, "psr": 0.5}
               for i, (s, e) in enumerate(zip(spreads, ems))}
        rows = [{"setting": "slot", "k": k, "slot": s, "subspan_em": v} for s, v in zip((0, 9), em_slots)]
        rows.append({"setting": "oracle", "k": None, "slot": None, "subspan_em": 1.0})
        return {"per_question_metrics": pqm, "rows": rows, "summary": {str(k): {"logprob": {"gap": gap}}}}

    base = {"evaluation-k10": sweep([0.2, 0.4], [1.0, 0.0], 0.1, [1.0, 0.0]),
            "evaluation-k20": sweep([0.5, 0.5], [0.0, 0.0], 0.3, [0.0, 0.0], k=20)}
    result = {"arms": {
        "base": {"per_seed": {"0": {"sweeps": base}}},
        "shuffle": {"per_seed": {"0": {"sweeps": {"evaluation-k10": sweep([0.1, 0.3], [1.0, 1.0], 0.2, [1.0, 0.5])}},
                                 "1": {"sweeps": {"evaluation-k10": sweep([0.3, 0.5], [0.0, 1.0], 0.4, [0.0, 0.5])}}}}},
        "contrasts_status": "interim: pending everything", "decision": {"verdict": "pending"}}
    text = study.table(result, n_boot=200)
    k10, k20 = text.split("## k = 20")
    assert "| base | 1 | 2 | 0.300 [0.200, 0.400] | -1.000 [-1.000, -1.000] | 0.500 [" in k10
    assert k10.count("| psr | gap | EM slot 1 | EM slot 10 |") == 1 and "| 0.100 | 1.000 | 0.000 |" in k10
    # two seeds x two questions: spread (0.1 + 0.3 + 0.3 + 0.5) / 4, EM 3 / 4, gap (0.2 + 0.4) / 2, slot 1 (1 + 0) / 2
    assert "| shuffle | 2 | 2 | 0.300 [0.100, 0.500] | -1.000 [-1.000, -1.000] | 0.750 [" in k10
    assert "| 0.300 | 0.500 | 0.500 |" in k10
    assert "| base | 1 | 2 | 0.500 [0.500, 0.500] |" in k20 and "| 0.300 | 0.000 | 0.000 |" in k20
    assert "shuffle" not in k20 and "psr" not in k20
    assert "Contrasts" not in text and text.rstrip().endswith("decision: pending")
