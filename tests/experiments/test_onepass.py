"""experiments/onepass/run.py: every step of the pre-registered plan on a tiny random LM and encoder (--limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def study(load_bench):
    return load_bench("onepass/run")


def test_selection_rule_and_label_sets(study) -> None:
    def run(name, recipe, r3, mrr, passed=True):
        return {"name": name, "recipe": recipe,
                "comparison": {"passed": passed, "student": {"recall@3": r3, "mrr@10": mrr}}}

    runs = [run("a", "residual", 0.6, 0.8), run("b", "residual", 0.6, 0.9), run("c", "residual", 0.9, 0.9, False),
            run("d", "cross-encoder", 0.7, 0.1), run("e", "cross-encoder", 0.7, 0.1)]
    sel = study.select_students(runs, ["residual", "bi-encoder", "cross-encoder"])
    # recall@3 first, then MRR@10; a student below BM25 (passed False) is never chosen; ties keep the earlier
    assert sel == {"per_recipe": {"residual": "b", "cross-encoder": "d"}, "headline": "cross-encoder",
                   "no_eligible_student": ["bi-encoder"]}
    plan = json.loads((Path(study.__file__).parent / "plan.json").read_text())
    ids = [f"q{i}" for i in range(300)]
    train, held = study.split_ids(ids, plan, None)
    assert train == ids[:250] and held == ids[250:]
    assert study.split_ids(ids, plan, 12) == (ids[:10], ids[10:12])
    assert len(study.grid_points(plan, "residual", False)) == 4 and len(study.grid_points(plan, "residual", True)) == 1
    # stage 1's lead: an eligible run before any other, then recall@3, MRR@10; other label sets do not count
    runs += [run("f", "bi-encoder", 0.95, 0.95, False)]
    for r, ls in zip(runs, ["masked", "masked", "masked", "passages", "masked", "masked"]):
        r["label_set"] = ls
    assert study.stage_one_lead(runs, "masked")["name"] == "e"
    assert study.stage_one_lead([r for r in runs if not r["comparison"]["passed"]], "masked")["name"] == "f"
    assert study.stage_one_lead(runs, "both") is None


def test_dev_targets_by_hand(study) -> None:
    def row(m, q, r3, mrr, sec):
        return {"method": m, "qid": q, "metrics": {"recall@3": r3, "mrr@10": mrr}, "ranking_cost": {"seconds": sec},
                "cost": {"seconds": sec}}

    rows = []
    for i in range(10):
        q = f"q{i}"
        rows += [row("none", q, 0.5, 0.5, 0.0), row("moi_masked", q, 1.0, 1.0, 40.0), row("s", q, 0.75, 0.75, 1.0),
                 row("bad", q, 0.0, 0.0, 1.0)]
    t = study.dev_targets(rows, ["s", "bad"], n_boot=100)
    assert t["moi_gain_recall@3"] == pytest.approx(0.5)
    assert t["s"]["gain_kept"][0] == pytest.approx(0.5) and t["s"]["gain_kept_met"] is True
    assert t["s"]["never_below"] is True and t["s"]["cost_met"]
    assert t["s"]["cost_ratio_seconds"] == pytest.approx(1 / 40)
    assert t["bad"]["never_below"] is False and t["bad"]["gain_kept_met"] is False


@pytest.mark.slow
def test_every_step_on_tiny_models(study, shared_data: Path, tiny_lm_dir: Path, tiny_encoder_dir: Path,
                                   tmp_path: Path) -> None:
    out, work = tmp_path / "onepass.json", tmp_path / "work"
    base = ["--model", str(tiny_lm_dir), "--device", "cpu", "--workdir", str(work), "--out", str(out), "--limit", "4",
            "--base-model", str(tiny_encoder_dir), "--passage-tokens", "12", "--allow-uncommitted-plan", "--quiet"]
    for step in ("labels", "students", "probe", "fidelity", "dev"):
        assert study.main(["--step", step, *base]) == 0, step
    res = json.loads(out.read_text())
    assert res["plan"]["path"].endswith("onepass/plan.json") and res["smoke"]["limit"] == 4
    steps = res["steps"]
    assert steps["labels"]["questions"] == 4 and steps["labels"]["cost_per_question"]["tokens_prefilled"] > 0
    runs = steps["students"]["runs"]
    recipes = ("residual", "bi-encoder", "cross-encoder")
    # stage 1: every recipe on the masked labels; stage 2: the lead's recipe and setting on the other label sets
    lead = next(r for r in runs if r["name"] == steps["students"]["stage_one_lead"])
    assert lead["label_set"] == "masked" and lead == study.stage_one_lead(runs, "masked")
    assert [(r["recipe"], r["label_set"], r["stage"]) for r in runs] == [
        *((rc, "masked", 1) for rc in recipes), (lead["recipe"], "passages", 2), (lead["recipe"], "both", 2)]
    assert all((r["lr"], r["epochs"]) == (lead["lr"], lead["epochs"]) for r in runs if r["stage"] == 2)
    assert all(r["comparison"]["num_queries"] >= 1 for r in runs)
    sel = steps["students"]["selected"]
    for rc in sel["per_recipe"]:
        assert (work / "students" / rc).is_dir()
    assert not (work / "students" / "_candidate").exists()  # only each recipe's best is kept
    assert not any((work / "students" / "_checkpoints").glob("*"))  # each grid point's checkpoints removed
    assert all(r["resumed_from_step"] == 0 and r["train_seconds"] > 0 for r in runs)
    assert steps["probe"]["fit_questions"] == 2 and (work / "probe.json").exists()
    fid = steps["fidelity"]
    assert len(fid["rows"]) == 4 and all(len(r["exact"]) == 20 and len(r["scores"]["moi_attn"]) == 20
                                         for r in fid["rows"])
    assert fid["summary"]["moi_attn"]["top3_agreement"]["n"] == 4
    # exact leave-one-out prefills far more than the masked estimator
    assert all(r["cost"]["moi"]["tokens_prefilled"] > r["cost"]["moi_masked"]["tokens_prefilled"] for r in fid["rows"])
    dev = steps["dev"]
    ref = "bi-encoder:all-MiniLM-L6-v2"  # the untrained embedder (plan amendment: dev.reference_contrast)
    assert dev["methods"][:3] == ["none", "moi_masked", ref] and dev["methods"][-1] == "moi_attn"
    assert len(dev["methods"]) == 4 + len(sel["per_recipe"])
    assert ref in dev["targets"]
    contrasts = {r["contrast"] for r in dev["holm_table"]["rows"]}
    assert f"{ref} - none" in contrasts
    if "bi-encoder" in sel["per_recipe"]:
        assert f"student:{work / 'students' / 'bi-encoder'} - {ref}" in contrasts
    rows = json.loads((tmp_path / "onepass.dev.eval.json").read_text())["outputs"]
    assert len(rows) == 4 * len(dev["methods"])
    assert "moi_attn" in dev["targets"] and dev["targets"]["questions"] == 4
    # resumable: a finished step run again adds nothing
    assert study.main(["--step", "fidelity", *base]) == 0
    assert len(json.loads(out.read_text())["steps"]["fidelity"]["rows"]) == 4
    # a fitted probe is not refitted when a queue starts the step again (hours for the reference generator)
    from ragkit.generation.base import metered

    before = (work / "probe.json").read_bytes()
    with metered() as cost:
        assert study.main(["--step", "probe", *base]) == 0
    assert cost.forward_passes == 0 and (work / "probe.json").read_bytes() == before
    assert json.loads(out.read_text())["steps"]["probe"] == steps["probe"]
    # a new machine: the work folder's students are gone; the step trains the selected ones again from
    # their recorded settings and seed, and records that the refit scores the same
    import shutil

    for rc in sel["per_recipe"]:
        shutil.rmtree(work / "students" / rc)
    assert study.main(["--step", "students", *base]) == 0
    again = json.loads(out.read_text())["steps"]["students"]
    assert again["runs"] == runs and again["selected"] == sel
    assert [r["name"] for r in again["refits"]] == list(sel["per_recipe"].values())
    assert all(r["max_abs_difference"] == 0.0 for r in again["refits"]), again["refits"]
    assert all((work / "students" / rc).is_dir() for rc in sel["per_recipe"])
    page = out.with_suffix(".md").read_text()  # the page of tables, written with the JSON
    for section in ("## Labels", "## Students", "## The moi_attn probe", "## Fidelity", "## Dev", "Holm-corrected"):
        assert section in page, section
    assert all(r["name"] in page for r in runs)
