"""experiments/psgrpo/confirm.py: the pre-registered plan carried out end to end on a tiny model, then resumed."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def study(load_bench) -> ModuleType:
    """The script as a module (``psgrpo/...``: the CORD study has a ``confirm.py`` too)."""
    return load_bench("psgrpo/confirm")


def test_arm_rewards_and_rows_come_from_the_plan(study: ModuleType) -> None:
    plan = json.loads((ROOT / "experiments" / "psgrpo" / "plan.json").read_text())
    assert study.arm_reward(plan, "grpo_accuracy") == {"consistency_weight": 0.0, "gold_weight": 1.0}
    assert study.arm_reward(plan, "psgrpo") == {"consistency_weight": 1.0, "gold_weight": 1.0}
    assert study.arm_reward(plan, "psgrpo_template") == study.arm_reward(plan, "psgrpo")
    assert study.plan_rows(plan["training"]["data"]) == (0, 48)
    assert study.plan_rows(plan["evaluation"]["sets"]) == (200, 300)


def test_the_verdict_waits_for_every_planned_seed(study: ModuleType) -> None:
    """Interim contrasts (seed 0 of every arm) get no verdict, even when they would pass the rule."""
    plan = json.loads((ROOT / "experiments" / "psgrpo" / "plan.json").read_text())
    passing = {"mean": 0.2, "lo": 0.1, "hi": 0.3, "lo_bonferroni": 0.05, "hi_bonferroni": 0.35}
    headline = {name: passing for name in plan["intervals"]["headline_contrasts"]}
    arms = {arm: {"per_seed": {"0": {"evaluation": {}}}} for arm in ("base", "grpo_accuracy", "psgrpo",
                                                                     "psgrpo_template")}
    missing = study.missing_seeds(plan, arms)
    assert missing == {"grpo_accuracy": [1], "psgrpo": [1]}
    d = study.decide(plan, headline, missing)
    assert d["verdict"] == "pending" and "grpo_accuracy seed(s) 1" in d["why"] and "claim_holds" not in d
    arms["grpo_accuracy"]["per_seed"]["1"] = arms["psgrpo"]["per_seed"]["1"] = {"evaluation": {}}
    assert study.missing_seeds(plan, arms) == {}
    assert study.decide(plan, headline, {})["claim_holds"] is True
    assert study.missing_seeds(plan, {})["base"] == [0]


def _small_plan(tmp_path: Path) -> Path:
    """The committed plan with one seed for psgrpo (the structure the script reads is the same)."""
    plan = json.loads((ROOT / "experiments" / "psgrpo" / "plan.json").read_text())
    plan["arms"]["psgrpo"]["seeds"] = [0]
    plan["arms"]["grpo_accuracy"]["seeds"] = [0, 1]
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    return p


@pytest.mark.slow
@pytest.mark.usefixtures("shared_data")
def test_plan_carried_out_on_a_tiny_model_then_resumed(study: ModuleType, tiny_lm_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    plan = _small_plan(tmp_path)
    out = tmp_path / "confirm.json"
    args = ["--plan", str(plan), "--out", str(out), "--model", str(tiny_lm_dir), "--workdir", str(tmp_path / "w"),
            "--max-train-sets", "2", "--max-dev-sets", "2", "--max-steps", "1", "--max-new-tokens", "3",
            "--passage-max-tokens", "8", "--n-boot", "200", "--save-steps", "1"]
    with pytest.raises(SystemExit, match="commit the plan"):
        study.main(args)  # an untracked plan is refused
    assert study.main([*args, "--allow-uncommitted-plan"]) == 0
    r = json.loads(out.read_text())
    assert r["plan"] == {"path": str(plan), "commit": None} and r["smoke"] is True
    assert r["command"].startswith("python3 experiments/psgrpo/confirm.py --plan")
    assert r["settings"]["max_new_tokens"] == 3 and r["settings"]["n_wordings"] == 4
    # paraphrases: stored once, n = 4 wordings, diversity per set and per kind
    stored = json.loads((tmp_path / "w" / "paraphrases.json").read_text())
    assert set(r["paraphrases"]) == {"train_strong", "train_weak", "dev_strong"}
    for kind, v in r["paraphrases"].items():
        assert v["n_sets"] == 2 and len(stored[kind]) == 2
        assert 0 <= v["mean_jaccard"] <= 1 and 0 <= v["identical_share"] <= 1 and 0 <= v["fallback_share"] <= 1
        for s in v["sets"]:
            assert len(s["paraphrases"]) == 3 and set(s["diversity"]) == {"mean_jaccard", "identical_share"}
    assert r["paraphrases"]["train_weak"]["fallback_share"] == 0
    assert all(1 <= s["tries"] <= 3 for s in r["paraphrases"]["dev_strong"]["sets"])
    # arms: seeds as lists, n_sets, per-seed results and per-set rows with the plan's metric names
    arms = r["arms"]
    assert set(arms) == {"base", "grpo_accuracy", "psgrpo", "psgrpo_template"}
    assert arms["base"]["seeds"] == [0] and arms["grpo_accuracy"]["seeds"] == [0, 1]
    assert arms["psgrpo"]["seeds"] == [0] and arms["psgrpo_template"]["seeds"] == [0]
    assert all(v["n_sets"] == 2 for v in arms.values())
    assert set(r["retrieved"]) == set(arms["base"]["per_seed"]["0"]["evaluation"]["per_set"])  # stored once
    for arm, v in arms.items():
        for seed in v["seeds"]:
            ev = v["per_seed"][str(seed)]["evaluation"]
            assert len(ev["per_set"]) == 2 and set(study.METRICS) <= set(ev["metrics"])
            for row in ev["per_set"].values():
                assert {"em", "f1", "consistency", "psr"} <= set(row) and 0 <= row["consistency"] <= 1
            if arm != "base":
                t = v["per_seed"][str(seed)]["train"]
                assert t["steps"] == 1 and t["paraphrases"] == ("weak" if arm == "psgrpo_template" else "strong")
    assert arms["grpo_accuracy"]["per_seed"]["0"]["train"]["reward"]["consistency_weight"] == 0.0
    assert (tmp_path / "w" / "grpo_accuracy-seed1" / "final").is_dir()
    # the plan's five headline contrasts, Holm-adjusted, and the rule's verdict
    c = r["contrasts"]
    assert set(c) == set(json.loads(plan.read_text())["intervals"]["headline_contrasts"])
    for v in c.values():
        assert v["lo_bonferroni"] <= v["lo"] <= v["mean"] <= v["hi"] <= v["hi_bonferroni"] and v["p_holm"] >= v["p"]
    assert c["psgrpo - base (f1)"]["mean"] == pytest.approx(arms["psgrpo"]["metrics"]["f1"]
                                                            - arms["base"]["metrics"]["f1"])
    assert set(r["contrasts_secondary"]["psr"]) == set(study.SECONDARY_PAIRS)
    assert r["decision"]["verdict"].startswith(("the claim holds", "the claim does not hold"))
    assert r["contrasts_status"].startswith("final")
    # a re-run resumes: nothing is paraphrased, trained or evaluated again
    calls: list = []
    monkeypatch.setattr("ragkit.training.psgrpo.train_psgrpo", lambda *a, **k: calls.append("train"))
    monkeypatch.setattr("ragkit.eval.consistency.evaluate_consistency", lambda *a, **k: calls.append("eval"))
    monkeypatch.setattr("ragkit.paraphrase.LLMParaphraser.paraphrase_with_report",
                        lambda *a, **k: calls.append("paraphrase"))
    assert study.main([*args, "--allow-uncommitted-plan"]) == 0 and calls == []
    assert json.loads(out.read_text())["arms"] == arms
    # a new machine, its work folder gone: the paraphrases are read back from --out, not sampled again
    (tmp_path / "w" / "paraphrases.json").unlink()
    assert study.main([*args, "--allow-uncommitted-plan"]) == 0 and calls == []
    assert json.loads(out.read_text())["paraphrases"] == r["paraphrases"]
    again = json.loads((tmp_path / "w" / "paraphrases.json").read_text())  # and stored again for the next run

    def by_id(d: dict) -> dict:
        return {k: v if k == "made_with" else {r["set_id"]: r for r in v} for k, v in d.items()}

    assert by_id(again) == by_id(stored)
    # every write keeps each arm's summary current, not only the arm just evaluated: a file from before the
    # summaries existed, stopped while the next arm evaluates, already has them for all the others
    old = json.loads(out.read_text())
    for v in old["arms"].values():
        for key in ("seeds", "n_sets", "metrics"):
            v.pop(key)
    del old["arms"]["psgrpo_template"]["per_seed"]["0"]["evaluation"]
    out.write_text(json.dumps(old))

    def stop(*a, **k):
        raise RuntimeError("stopped")

    monkeypatch.setattr("ragkit.training.psgrpo.train_psgrpo",
                        lambda sets, cfg: {"final_dir": str(Path(cfg.output_dir) / "final"), "steps": 1})
    monkeypatch.setattr("ragkit.eval.consistency.evaluate_consistency", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        study.main([*args, "--allow-uncommitted-plan"])
    stopped = json.loads(out.read_text())["arms"]
    for arm in ("base", "grpo_accuracy", "psgrpo"):
        assert {k: stopped[arm][k] for k in ("seeds", "n_sets", "metrics")} == \
               {k: arms[arm][k] for k in ("seeds", "n_sets", "metrics")}
    assert stopped["psgrpo_template"]["seeds"] == [] and stopped["psgrpo_template"]["n_sets"] == 0
    # other settings into the same JSON or work folder are refused, not mixed in
    with pytest.raises(SystemExit, match="other settings"):
        study.main([*args, "--max-new-tokens", "4", "--allow-uncommitted-plan"])
    with pytest.raises(SystemExit, match="made with other settings"):
        study.main([*args, "--max-new-tokens", "4", "--out", str(tmp_path / "other.json"), "--allow-uncommitted-plan"])


@pytest.mark.usefixtures("shared_data")
def test_a_stopped_rewriter_keeps_the_sets_it_made(study: ModuleType, tiny_lm_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The paraphrases are stored chunk by chunk: a run stopped while they are sampled resumes after the last chunk."""
    from ragkit.paraphrase import LLMParaphraser

    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    monkeypatch.setattr(study, "PARAPHRASE_CHUNK", 1)
    real, calls = LLMParaphraser.paraphrase_with_report, []

    def stopping(self, questions, n, answers=None):
        calls.append(list(questions))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the session ends while the second question is sampled
        return real(self, questions, n, answers=answers)

    monkeypatch.setattr(LLMParaphraser, "paraphrase_with_report", stopping)
    args = ["--plan", str(_small_plan(tmp_path)), "--out", str(tmp_path / "confirm.json"), "--model", str(tiny_lm_dir),
            "--workdir", str(tmp_path / "w"), "--max-train-sets", "2", "--max-dev-sets", "2", "--max-steps", "1",
            "--max-new-tokens", "3", "--passage-max-tokens", "8", "--allow-uncommitted-plan"]
    with pytest.raises(KeyboardInterrupt):
        study.main(args)
    stored = json.loads((tmp_path / "w" / "paraphrases.json").read_text())
    assert [len(q) for q in calls] == [1, 1] and len(stored["train_strong"]) == 1
    assert stored["made_with"]["chunk_questions"] == 1
    first = stored["train_strong"][0]
    # started again: only the questions not stored yet are sampled, then the arms would start
    calls.clear()
    monkeypatch.setattr(LLMParaphraser, "paraphrase_with_report",
                        lambda self, questions, n, answers=None: calls.append(list(questions)) or real(
                            self, questions, n, answers=answers))

    def stop(*a, **k):
        raise KeyboardInterrupt  # the first evaluation: the paraphrases are all made by then

    monkeypatch.setattr("ragkit.eval.consistency.evaluate_consistency", stop)
    with pytest.raises(KeyboardInterrupt):
        study.main(args)
    stored = json.loads((tmp_path / "w" / "paraphrases.json").read_text())
    assert len(calls) == 3 and first["original"] not in [q for c in calls for q in c]  # 1 train + 2 dev questions
    assert first in stored["train_strong"] and len(stored["train_strong"]) == len(stored["dev_strong"]) == 2
    # the same model under another cache digest (a re-assembled .gguf) reuses the sets; another setting refuses them
    stored["made_with"]["model"] += "-0123456789abcdef"
    (tmp_path / "w" / "paraphrases.json").write_text(json.dumps(stored))
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        study.main(args)
    assert calls == []
    stored["made_with"]["tries"] = 5
    (tmp_path / "w" / "paraphrases.json").write_text(json.dumps(stored))
    with pytest.raises(SystemExit, match="another --workdir"):
        study.main(args)
