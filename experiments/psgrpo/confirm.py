"""The pre-registered PS-GRPO confirmation: every arm and seed of ``plan.json``, on fresh dev sets.

The plan (``experiments/psgrpo/plan.json``, committed before any of its results) fixes the
paraphrases, the arms, the seeds, the training and evaluation rows, the metrics, the headline
contrasts and the decision rule for ``PSGRPOConfig``'s consistency weight. This script carries it
out, resumable at every stage (the paraphrases are made once and stored in the work folder and in
``--out``, which a new machine reads them back from; trainings resume from their last checkpoint,
evaluations from their partial files (10 dev sets a chunk), finished arms and seeds are read back from
``--out``):

1. paraphrases: the strong ones, written by the base generator through
   ``ragkit.paraphrase.LLMParaphraser`` and screened by ``RewriteFilter`` (token Jaccard with the
   original below 0.8, every number and capitalised name kept, no gold answer the original lacks;
   at most 3 sampling rounds, then the rule fallback, counted), for the training rows and the dev
   rows; the template ones (``RuleParaphraser``) for the training rows of the weak arm; the
   diversity of every set (mean pairwise token Jaccard, share of pairs identical after
   normalisation);
2. per seed, per arm: train (LoRA, n = 4 wordings x g = 2 rollouts, one set per step, exact
   BLEU-2 group reward; ``grpo_accuracy``: consistency weight 0, gold-F1 weight 1; ``psgrpo`` and
   ``psgrpo_template``: 1 and 1), then evaluate on the dev sets: Con-RAG's three consistency levels
   (``ragkit.eval.consistency.evaluate_consistency``, BM25 top-5 over the pooled dev paragraphs,
   greedy answers of at most 16 tokens cut at a newline) and EM/F1 averaged over each set's
   wordings; the base model is evaluated once (one "seed");
3. the headline contrasts with two-level (seed, set) paired bootstrap intervals, Holm-adjusted
   p-values and Bonferroni-widened intervals (``ragkit.eval.stats.contrast_family``), secondary
   contrasts without correction, and the decision rule's verdict. The contrasts are written after
   every evaluation (``contrasts_status`` says "interim" until every planned arm and seed is in);
   the verdict stays "pending" until then.

    python3 experiments/psgrpo/confirm.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)" \\
        --workdir /work/runs/psgrpo-confirm --out experiments/psgrpo/results/confirm-qwen-cpu.json

Metric names in the JSON: ``consistency`` (generator level, the plan's headline),
``consistency_end_to_end``, ``consistency_retriever``, ``em`` and ``f1`` (means over the set's
wordings, the original included, as the plan defines them), ``em_original``/``f1_original``, and
``psr``, the paraphrase sensitivity rate (share of sets whose normalised greedy answers, passages
held fixed, are not all the same; not in the plan, so reported without a correction or a rule).

The decision rule reads "interval above 0" as the Bonferroni-widened interval (simultaneous over
the plan's five headline contrasts, so it implies Holm's rejection) and the F1 bound likewise.
The JSON names the plan and its commit (``"plan": {"path", "commit"}``); a plan with uncommitted
changes is refused (``--allow-uncommitted-plan`` exists for tests and smoke runs only, and is
recorded). ``--max-train-sets``, ``--max-dev-sets``, ``--max-steps`` and ``--max-new-tokens`` cut
the run for smoke tests (recorded as ``smoke``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import data_path
from ragkit.eval.harness import (
    model_record,
    pre_registered,
    pre_registered_parser,
    rel,
    same_model,
    study_config,
    study_main,
    write_result,
)
from ragkit.eval.stats import contrast_family

HERE = Path(__file__).resolve().parent
#: questions per rewriter call; the sets are stored after each (its sampling is seeded per call)
PARAPHRASE_CHUNK = 10
SCRIPT = "experiments/psgrpo/confirm.py"
#: per-set values in the JSON; every one is a per-set number, so arms compare set by set
METRICS = ("consistency", "consistency_end_to_end", "consistency_retriever", "em", "f1", "em_original",
           "f1_original", "psr")
#: the plan's metric labels in its headline contrasts
LABELS = {"generator consistency": "consistency", "end-to-end consistency": "consistency_end_to_end",
          "retriever consistency": "consistency_retriever", "f1": "f1", "em": "em"}
#: contrasts reported beside the headline family, each at its own 95% (no correction)
SECONDARY_PAIRS = ("psgrpo - base", "grpo_accuracy - base", "psgrpo - grpo_accuracy", "psgrpo_template - base",
                   "psgrpo - psgrpo_template")
SECONDARY_METRICS = ("consistency", "consistency_end_to_end", "em", "f1", "psr")
K = 5  # passages per prompt: the plan's "top-5"


def plan_rows(text: str) -> tuple[int, int]:
    """``(start, stop)`` of a plan's ``"rows A-B"`` (inclusive B) as a slice."""
    m = re.search(r"rows (\d+)-(\d+)", text)
    if not m:
        raise SystemExit(f"the plan names no row range ('rows A-B') in {text!r}")
    return int(m.group(1)), int(m.group(2)) + 1


def arm_reward(plan: Mapping[str, Any], arm: str) -> dict[str, float]:
    """``consistency_weight`` and ``gold_weight`` of a trained arm, read from the plan's reward text.

    "F1 with the gold answer only" is accuracy-only GRPO (``0``, ``1``); "group similarity ... + W *
    F1" is PS-GRPO (``1``, ``W``); "as ARM" repeats that arm's reward.
    """
    text = plan["arms"][arm]["reward"]
    m = re.match(r"as (\w+)$", text.strip())
    if m:
        return arm_reward(plan, m.group(1))
    if "only" in text and "similarity" not in text:
        return {"consistency_weight": 0.0, "gold_weight": 1.0}
    w = re.search(r"\+\s*([\d.]+)\s*\*\s*F1", text)
    if "similarity" not in text or not w:
        raise SystemExit(f"cannot read arm {arm}'s reward from the plan: {text!r}")
    return {"consistency_weight": 1.0, "gold_weight": float(w.group(1))}


def set_metrics(entry: Mapping[str, Any]) -> dict[str, float]:
    """One dev set's metrics from an ``evaluate_consistency`` per-set entry (see the module docstring)."""
    from ragkit.text import normalize_answer

    return {"consistency": float(entry["generator"]),
            "consistency_end_to_end": float(entry.get("end_to_end", float("nan"))),
            "consistency_retriever": float(entry.get("retriever", float("nan"))),
            "em": float(entry["em_paraphrases"]), "f1": float(entry["f1_paraphrases"]),
            "em_original": float(entry["em"]), "f1_original": float(entry["f1"]),
            "psr": float(len({normalize_answer(o) for o in entry["outputs_fixed"]}) > 1)}


def diversity_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over sets of the per-set diversity, and the share of rewrites from the rule fallback."""
    wordings = sum(len(r["paraphrases"]) for r in rows)
    return {"n_sets": len(rows),
            "mean_jaccard": float(np.mean([r["diversity"]["mean_jaccard"] for r in rows])) if rows else float("nan"),
            "identical_share": float(np.mean([r["diversity"]["identical_share"] for r in rows])) if rows
            else float("nan"),
            "fallback_share": sum(r.get("fallback", 0) for r in rows) / max(wordings, 1)}


def evaluated(arm: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """An arm's evaluations by seed, in seed order (a seed trained but not yet evaluated is left out)."""
    return {int(s): r["evaluation"] for s, r in sorted(arm.get("per_seed", {}).items(), key=lambda x: int(x[0]))
            if "evaluation" in r}


def per_seed_vectors(arm: Mapping[str, Any], metric: str) -> dict[str, list[float]]:
    """An arm's per-set values of one metric, by seed (sets in one sorted order)."""
    return {str(s): [e["per_set"][q][metric] for q in sorted(e["per_set"])] for s, e in evaluated(arm).items()}


def contrasts(arms: Mapping[str, Mapping[str, Any]], names: Sequence[str], n_boot: int,
              metric: str | None = None) -> dict[str, Any]:
    """Contrasts ``"a - b (label)"`` (or ``"a - b"`` of ``metric``) between evaluated arms, corrected as one family."""
    pairs = {}
    for name in names:
        m = re.match(r"^\s*(\w+)\s*-\s*(\w+)\s*(?:\((.+)\))?\s*$", name)
        if not m:
            raise SystemExit(f"cannot read the contrast {name!r}: expected 'ARM - ARM (metric)'")
        a, b, label = m.groups()
        key = LABELS.get((label or "").strip().lower(), metric) if label else metric
        if key is None:
            raise SystemExit(f"unknown metric {label!r} in contrast {name!r}; known: {sorted(LABELS)}")
        if all(per_seed_vectors(arms[x], key) if x in arms else False for x in (a, b)):
            pairs[name] = (per_seed_vectors(arms[a], key), per_seed_vectors(arms[b], key))
    return contrast_family(pairs, n_boot=n_boot, seed=0)


def missing_seeds(plan: Mapping[str, Any], arms: Mapping[str, Mapping[str, Any]]) -> dict[str, list[int]]:
    """The plan's arms and seeds not evaluated yet (``{}`` once the plan is carried out); base has one "seed", 0."""
    out = {}
    for arm, spec in plan["arms"].items():
        planned = {0} if arm == "base" else {int(s) for s in spec["seeds"]}
        todo = sorted(planned - set(evaluated(arms.get(arm, {}))))
        if todo:
            out[arm] = todo
    return out


def decide(plan: Mapping[str, Any], headline: Mapping[str, Any],
           missing: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """The plan's decision rule on the headline contrasts (Bonferroni-widened bounds; see the module docstring).

    The verdict waits for every planned arm and seed (``missing``, from :func:`missing_seeds`): contrasts
    on the seeds evaluated so far are an interim look, and a verdict read off them would be decided on
    fewer seeds than the plan fixed.
    """
    if missing:
        return {"verdict": "pending", "why": "not evaluated yet: " + "; ".join(
            f"{arm} seed(s) {', '.join(map(str, s))}" for arm, s in missing.items())}
    need = {"c_base": "psgrpo - base (generator consistency)", "f1_base": "psgrpo - base (f1)",
            "c_acc": "psgrpo - grpo_accuracy (generator consistency)"}
    got = {k: headline.get(v) for k, v in need.items()}
    if any(v is None for v in got.values()):
        return {"verdict": "pending", "why": "psgrpo, grpo_accuracy and base are not all evaluated"}
    checks = {"consistency_above_base": got["c_base"]["lo_bonferroni"] > 0,
              "f1_not_below_base_by_0.02": got["f1_base"]["lo_bonferroni"] > -0.02,
              "consistency_above_grpo_accuracy": got["c_acc"]["lo_bonferroni"] > 0}
    holds = all(checks.values())
    return {**checks, "claim_holds": holds,
            "verdict": "the claim holds: keep PSGRPOConfig's consistency weight on" if holds else
            "the claim does not hold: recommend grpo_accuracy (consistency weight 0)",
            "rule": plan["decision_rule"]}


def build_parser() -> argparse.ArgumentParser:
    """The study's options; the plan fixes everything else."""
    ap = pre_registered_parser(__doc__.split("\n")[0], HERE, script=SCRIPT,
                               gpu_args="--model Qwen/Qwen2.5-7B-Instruct --device cuda --workdir /tmp/psgrpo-confirm "
                                        "--out experiments/psgrpo/results/confirm-gpu.json",
                               workdir="/work/runs/psgrpo-confirm",
                               workdir_help="stored paraphrases, trained models and their checkpoints",
                               device_help="cpu, or cuda (training then runs on the GPU too)", passage_max_tokens=64)
    ap.add_argument("--dev-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/dev.jsonl")
    ap.add_argument("--save-steps", type=int, default=4, help="checkpoint every N training steps")
    ap.add_argument("--max-train-sets", type=int, default=None, help="cut the training rows (smoke runs only)")
    ap.add_argument("--max-dev-sets", type=int, default=None, help="cut the dev rows (smoke runs only)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="cut rollouts, answers and rewrites to N tokens (smoke runs only)")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Carry out the plan (see the module docstring)."""
    a = study_config(build_parser(), config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    import torch

    from ragkit.datasets import load_hotpotqa
    from ragkit.eval.consistency import evaluate_consistency
    from ragkit.generation import Generator
    from ragkit.io import write_json
    from ragkit.models import resolve_generator_path
    from ragkit.paraphrase import LLMParaphraser, ParaphraseSet, RewriteFilter, RuleParaphraser, set_diversity
    from ragkit.retrievers import BM25Retriever
    from ragkit.training.psgrpo import PSGRPOConfig, select_passages, train_psgrpo

    if a.device == "cpu":
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    plan, result = pre_registered(a.plan, a.out, a.allow_uncommitted_plan)
    smoke = bool(a.max_train_sets or a.max_dev_sets or a.max_steps or a.max_new_tokens or a.allow_uncommitted_plan)
    base = resolve_generator_path(a.model)
    model = model_record(a.model, base)
    out = Path(a.out)
    work = Path(a.workdir)
    tr, ev = plan["training"], plan["evaluation"]
    # the weights' dtype of the rewriter, every training and evaluation (the plan's; "auto" where it names none)
    dtype = plan.get("dtype", {}).get("value", "auto")
    n_wordings = int(plan["paraphrases"]["n_wordings"])
    max_new = min(int(tr["max_completion_length"]), a.max_new_tokens or 10 ** 9)
    settings = {"passage_max_tokens": a.passage_max_tokens, "k": K, "max_new_tokens": max_new,
                "n_wordings": n_wordings, "rollouts_g": tr["group"]["rollouts_g"], "lora_r": 16,
                "learning_rate": tr["learning_rate"], "beta": tr["beta"], "reward_similarity": "bleu2 (exact)",
                "rewrite_filter": {"max_jaccard": 0.8, "keep_terms": True, "tries": 3}, "device": a.device,
                "max_train_sets": a.max_train_sets, "max_dev_sets": a.max_dev_sets, "max_steps": a.max_steps,
                "save_steps": a.save_steps, "n_boot": a.n_boot, "dtype": dtype}
    free = ("n_boot", "save_steps")  # change no result
    if ({k: v for k, v in result.get("settings", settings).items() if k not in free}
            != {k: v for k, v in settings.items() if k not in free} or not same_model(result, model)):
        raise SystemExit(f"{a.out} was written with other settings or another model; pass another --out")
    result.update(smoke=smoke, **model,
                  command=f"python3 {SCRIPT} " + shlex.join(str(x) for x in getattr(a, "_argv", [])),
                  settings=settings, metric_names=list(METRICS))
    result.setdefault("arms", {})

    def cut(rows: tuple[int, int], limit: int | None) -> slice:
        return slice(rows[0], min(rows[1], rows[0] + limit) if limit else rows[1])

    train_recs = load_hotpotqa(a.train_file or data_path("hotpotqa", "train.jsonl"))[
        cut(plan_rows(tr["data"]), a.max_train_sets)]
    dev_all = load_hotpotqa(a.dev_file or data_path("hotpotqa", "dev.jsonl"))
    dev = dev_all[cut(plan_rows(ev["sets"]), a.max_dev_sets)]

    # 1. paraphrases, made once and stored
    para_file = work / "paraphrases.json"
    rewrite_tokens = min(48, a.max_new_tokens or 48)
    made_with = {"model": model["model"], "seed": 0, "tries": 3, "max_jaccard": 0.8, "max_new_tokens": rewrite_tokens,
                 "chunk_questions": PARAPHRASE_CHUNK}
    stored: dict[str, Any] = json.loads(para_file.read_text()) if para_file.exists() else {"made_with": made_with}
    if not para_file.exists() and result.get("paraphrases"):
        # a new machine: the sets already made are in --out (same model and settings, checked above), and
        # sampling them again would cost an hour and could word them differently from the trained arms'
        stored.update({name: v["sets"] for name, v in result["paraphrases"].items()})
        write_json(para_file, stored)
    had = stored.get("made_with") or {}
    if {k: v for k, v in had.items() if k != "model"} != {k: v for k, v in made_with.items() if k != "model"} \
            or not same_model(had, model):
        raise SystemExit(f"{para_file} was made with other settings ({stored.get('made_with')}, not {made_with}); "
                         "pass another --workdir")
    gen_base: Any = None

    def arm_summary(arm: str) -> None:
        """The arm's evaluated ``seeds``, ``n_sets`` and metrics (mean over seeds), kept current in every write."""
        v = result["arms"].setdefault(arm, {"per_seed": {}})
        done = evaluated(v)
        v["seeds"] = list(done)
        v["n_sets"] = next(iter(done.values()))["n_sets"] if done else 0
        v["metrics"] = {m: float(np.mean([e["metrics"][m] for e in done.values()])) for m in METRICS} if done else {}

    def save() -> None:
        """Write ``--out`` atomically, every arm's ``seeds``, ``n_sets`` and mean metrics brought up to date first."""
        for arm in result["arms"]:
            arm_summary(arm)
        write_result(out, result, device=a.device)

    def make(name: str, recs: list, strong: bool) -> list[dict[str, Any]]:
        """The stored sets of ``recs``, the missing ones made :data:`PARAPHRASE_CHUNK` questions at a time and
        stored after each chunk (the rewriter samples for about an hour; a stopped run keeps what it made)."""
        nonlocal gen_base
        have = {r["set_id"]: r for r in stored.get(name, [])}
        todo = [r for r in recs if r.id not in have]
        for c in range(0, len(todo), PARAPHRASE_CHUNK):
            chunk = todo[c: c + PARAPHRASE_CHUNK]
            qs, answers = [r.question for r in chunk], [list(r.answers) for r in chunk]
            if strong:
                if gen_base is None:
                    gen_base = Generator(base, device=a.device, dtype=dtype, template="auto", batch_size=8,
                                        show_progress=False)
                para = LLMParaphraser(gen_base, seed=0, tries=3, rewrite_filter=RewriteFilter(max_jaccard=0.8),
                                      max_new_tokens=rewrite_tokens)
                rep = para.paraphrase_with_report(qs, n_wordings - 1, answers=answers)
                made = [{"fallback": f, "tries": t, "rejected": rj} for f, t, rj in
                        zip(rep.fallback, rep.tries, rep.rejected)]
                texts = rep.paraphrases
            else:
                texts = RuleParaphraser(seed=0).paraphrase(qs, n_wordings - 1)
                made = [{"fallback": 0} for _ in chunk]
            for r, ps, info in zip(chunk, texts, made):
                have[r.id] = {"set_id": r.id, "original": r.question, "paraphrases": ps, "answers": list(r.answers),
                              **info, "diversity": set_diversity([r.question, *ps])}
            stored[name] = [have[k] for k in sorted(have)]
            write_json(para_file, stored)
        return [have[r.id] for r in recs]

    paras = {"train_strong": make("train_strong", train_recs, True),
             "train_weak": make("train_weak", train_recs, False),
             "dev_strong": make("dev_strong", dev, True)}
    gen_base = None  # the rewriter's copy of the model is not needed again (memory for training)
    result["paraphrases"] = {name: {"file": rel(para_file), **diversity_summary(rows), "sets": rows}
                             for name, rows in paras.items()}
    save()

    def training_sets(kind: str) -> list:
        return [ParaphraseSet(set_id=r.id, original=r.question, paraphrases=tuple(p["paraphrases"]),
                              answers=r.answers, passages=tuple(select_passages(r, K) for _ in range(n_wordings)))
                for r, p in zip(train_recs, paras[kind])]

    corpus = list({p.id: p for r in dev_all for p in r.passages}.values())
    retriever = BM25Retriever().index(corpus)
    wordings = [[p["original"], *p["paraphrases"]] for p in paras["dev_strong"]]

    def arm_rec(arm: str, seed: int) -> dict[str, Any]:
        return result["arms"].setdefault(arm, {"per_seed": {}})["per_seed"].setdefault(str(seed), {})

    def trained(arm: str, seed: int) -> str:
        if arm == "base":
            return base
        run_dir = work / f"{arm}-seed{seed}"
        spec = plan["arms"][arm]
        st = PSGRPOConfig(output_dir=str(run_dir), model=base, paraphrases=n_wordings,
                          num_generations=int(tr["group"]["rollouts_g"]), max_steps=a.max_steps or int(tr["max_steps"]),
                          lora_r=16, learning_rate=float(tr["learning_rate"]), beta=float(tr["beta"]), epsilon=0.2,
                          kappa=0, reward="bleu2", temperature=1.0, max_completion_length=max_new,
                          passage_max_tokens=a.passage_max_tokens, seed=seed, save_steps=a.save_steps,
                          logging_steps=1, use_cpu=a.device == "cpu", resume_from_checkpoint="last", dtype=dtype,
                          **arm_reward(plan, arm))
        summary = train_psgrpo(training_sets("train_strong" if spec["paraphrases"] == "strong" else "train_weak"), st)
        hist = summary.get("history", [])
        arm_rec(arm, seed)["train"] = {
            **{k: summary.get(k) for k in ("steps", "steps_this_run", "train_loss", "wall_s", "rollout_tokens",
                                           "reward_comparisons", "resumed_from")},
            "reward": arm_reward(plan, arm), "paraphrases": spec["paraphrases"],
            "reward_curve": [h.get("reward") for h in hist],
            "consistency_curve": [h.get("psgrpo/consistency") for h in hist],
            "gold_f1_curve": [h.get("psgrpo/gold_f1") for h in hist], "kl_curve": [h.get("kl") for h in hist]}
        save()
        return summary["final_dir"]

    def evaluate(arm: str, seed: int) -> None:
        rec = arm_rec(arm, seed)
        if rec.get("evaluation", {}).get("n_sets") == len(dev):
            logging.info("%s seed %d: evaluated already (%s)", arm, seed, out)
            return
        model = trained(arm, seed)
        gen = Generator(model, device=a.device, dtype=dtype, template="auto", passage_max_tokens=a.passage_max_tokens,
                        batch_size=8, show_progress=False)
        part = Path(a.workdir) / "evaluations" / f"{arm}-seed{seed}.partial.jsonl"  # a killed evaluation resumes
        rep = evaluate_consistency(gen, dev, wordings, retriever=retriever, k=K, similarity="bleu2",
                                   max_new_tokens=max_new, partial=part, show_progress=False).to_dict()
        rows = rep.pop("per_set")
        per = {e["qid"]: {**set_metrics(e), "outputs_fixed": e["outputs_fixed"], "outputs_e2e": e.get("outputs_e2e")}
               for e in rows}
        result.setdefault("retrieved", {e["qid"]: e.get("retrieved") for e in rows})  # BM25: the same for every arm
        rec["evaluation"] = {"n_sets": len(per), "summary": rep, "per_set": per,
                             "metrics": {m: float(np.nanmean([v[m] for v in per.values()])) for m in METRICS}}
        report()
        save()
        logging.info("%s seed %d: %s", arm, seed, {m: round(v, 3) for m, v in rec["evaluation"]["metrics"].items()})

    def report() -> None:
        """The contrasts among the arms and seeds evaluated so far, and the rule's verdict once all are."""
        missing = missing_seeds(plan, result["arms"])
        result["contrasts_status"] = ("final: every planned arm and seed" if not missing else
                                      "interim: on the arms and seeds evaluated so far; the verdict waits for the rest")
        result["contrasts"] = contrasts(result["arms"], plan["intervals"]["headline_contrasts"], a.n_boot)
        result["contrasts_secondary"] = {m: contrasts(result["arms"], SECONDARY_PAIRS, a.n_boot, metric=m)
                                         for m in SECONDARY_METRICS}
        result["decision"] = decide(plan, result["contrasts"], missing)

    # 2. base once, then per seed every arm that has it (seed 0 of every arm first: a complete comparison early)
    arms = list(plan["arms"])
    seeds_of = {arm: [0] if arm == "base" else [int(s) for s in plan["arms"][arm]["seeds"]] for arm in arms}
    evaluate("base", 0)
    for seed in sorted({s for arm in arms for s in seeds_of[arm]}):
        for arm in arms:
            if arm != "base" and seed in seeds_of[arm]:
                evaluate(arm, seed)

    # 3. contrasts and the decision
    report()
    save()
    print(table(result))
    return 0


def table(result: Mapping[str, Any]) -> str:
    """The study's table: one row per arm (mean over seeds), then the headline contrasts."""
    cols = ("consistency_retriever", "consistency", "consistency_end_to_end", "em", "f1", "psr")
    lines = ["| arm | seeds | sets | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 3)]
    for arm, v in result["arms"].items():
        m = v.get("metrics", {})
        lines.append(f"| {arm} | {v.get('seeds')} | {v.get('n_sets')} | "
                     + " | ".join(f"{m[c]:.3f}" if c in m else "–" for c in cols) + " |")
    lines += ["", "| contrast | mean | 95% | Bonferroni | p (Holm) |", "|---|---|---|---|---|"]
    for name, c in result.get("contrasts", {}).items():
        lines.append(f"| {name} | {c['mean']:+.3f} | [{c['lo']:+.3f}, {c['hi']:+.3f}] | "
                     f"[{c['lo_bonferroni']:+.3f}, {c['hi_bonferroni']:+.3f}] | {c['p_holm']:.3f} |")
    return ("\n".join(lines) + f"\n\ncontrasts: {result.get('contrasts_status')}"
            f"\nverdict: {result.get('decision', {}).get('verdict')}")


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
