"""The pre-registered CORD confirmation: every arm and seed of ``plan.json``, on fresh questions.

The plan (``experiments/cord/plan.json``, committed before any of its results) fixes the arms,
the seeds, the selection and evaluation questions, the primary metric (the mean per-question
spread of the gold answer's log-prob across gold slots, k = 10) and the rule that decides
``CORDConfig``'s defaults. This script carries it out, resumable at every stage (trainings resume
from their last checkpoint, sweeps from their partial files, finished stages from ``--out``):

1. train every arm at seed 0 (LoRA, 300 steps on the 300 HotpotQA train questions);
2. sweep the CORD arms on the SELECTION questions and name ``BEST_CORD`` (lowest spread);
3. train ``shuffle`` and ``BEST_CORD`` at seeds 1 and 2;
4. sweep every arm and seed on the EVALUATION questions: k = 10 (gold at slots 1/3/6/8/10, greedy
   answers and 5 random orders for the permutation sensitivity rate), k = 20 for base, shuffle and
   BEST_CORD;
5. the headline contrasts with two-level (seed, question) bootstrap intervals, Holm-adjusted
   p-values and Bonferroni-widened intervals, and the decision rule's verdict.

The stages are what is computed, not the order of the work: each trained model is swept (selection,
then evaluation) right after its training, so a work folder lost between sessions costs at most the
model in training. ``BEST_CORD`` still reads the selection sweeps alone.

A machine lent for a few hours at a time loses its work folder: ``--partial-dir`` puts the sweeps'
rows where they are kept (a committed folder), so a sweep resumes at its next question, and
``--only ARM:SEED`` works on the named models alone, so a run trains only a model whose sweeps
it can finish. The stages a chosen model does not complete wait for a later run; until every planned
sweep is recorded the contrasts are written as ``"contrasts_status": "interim"`` and the decision
stays pending.

    python3 experiments/cord/confirm.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)" \\
        --workdir /work/runs/cord-confirm --out experiments/cord/results/confirm-qwen-cpu.json

The JSON names the plan and its commit (``"plan": {"path", "commit"}``); a plan with uncommitted
changes is refused (``--allow-uncommitted-plan`` exists for tests and smoke runs only, and is
recorded). ``--stage`` stops after a stage, ``--max-questions`` cuts every question range (smoke).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import data_path
from ragkit.eval.harness import (
    model_record,
    pre_registered,
    pre_registered_parser,
    same_model,
    study_config,
    study_main,
    write_result,
)
from ragkit.eval.stats import contrast_family

HERE = Path(__file__).resolve().parent
STAGES = ("train", "select", "seeds", "evaluate", "report")
#: primary metric first; every one is a per-question value, so arms compare question by question
METRICS = ("spread", "mean_logprob", "em", "psr")
SWEEP_KEYS = {"spread": "logprob_spread", "mean_logprob": "logprob", "em": "subspan_em", "psr": "psr"}
"""The key of ``SweepResult.per_question_metrics`` behind each of :data:`METRICS`."""


def arm_settings(plan: Mapping[str, Any], arm: str) -> dict[str, Any]:
    """``CORDConfig`` fields of a trained arm: ``loss``, ``lam`` and ``alpha`` (``None``: score-aware)."""
    spec = plan["arms"][arm]
    alpha = spec.get("alpha")
    return {"loss": spec["loss"], "lam": float(spec.get("lam", 1.0)),
            "alpha": None if alpha in (None, "score-aware") else float(alpha)}


def question_metrics(sweep: Any, k: int) -> dict[str, dict[str, float]]:
    """Per question id, the :data:`METRICS` of a :class:`ragkit.eval.sweep.SweepResult` at context size ``k``
    (the sweep's own per-question values, renamed): log-prob spread and mean over the gold slots, mean
    EM over the slots, and whether the greedy answer changed across the random orders."""
    return {qid: {m: v[SWEEP_KEYS[m]] for m in METRICS} for qid, v in sweep.per_question_metrics[k].items()}


def per_seed_vectors(arms: Mapping[str, Mapping[str, Any]], arm: str, metric: str, k: str) -> dict[str, list[float]]:
    """An arm's per-question values of one metric, by seed (questions in one sorted order)."""
    seeds = arms[arm]["per_seed"]
    qids = sorted(seeds["0"]["sweeps"][k]["per_question_metrics"])
    return {s: [v["sweeps"][k]["per_question_metrics"][q][metric] for q in qids]
            for s, v in seeds.items() if k in v.get("sweeps", {})}


def contrasts(arms: Mapping[str, Mapping[str, Any]], names: list[str], metric: str, k: str,
              n_boot: int) -> dict[str, Any]:
    """``"a - b"`` contrasts of one metric: seed-and-question intervals, Holm p, Bonferroni intervals.

    The 95% interval is per contrast; ``lo_bonferroni``/``hi_bonferroni`` are at ``1 − 0.05/m`` for
    the ``m`` contrasts given (simultaneous coverage), ``p_holm`` the Holm-adjusted p-value.
    """
    pairs = {}
    for name in names:
        a, b = (x.strip() for x in name.split(" - "))
        if all(x in arms and k in arms[x].get("per_seed", {}).get("0", {}).get("sweeps", {}) for x in (a, b)):
            pairs[name] = (per_seed_vectors(arms, a, metric, k), per_seed_vectors(arms, b, metric, k))
    return contrast_family(pairs, n_boot=n_boot, seed=0)


def decide(plan: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's decision rule applied to the evaluation contrasts (``BEST_CORD - shuffle``)."""
    best = result.get("best_cord")
    name = f"{best} - shuffle"
    primary = result.get("contrasts", {}).get("spread", {}).get(name)
    em = result.get("contrasts_secondary", {}).get("em", {}).get(name)
    if best is None or primary is None or em is None:
        return {"verdict": "pending", "why": "the evaluation of BEST_CORD and shuffle is not complete"}
    below = primary["hi_bonferroni"] < 0
    non_inferior = em["lo"] > -0.03
    adopt = below and non_inferior
    return {"best_cord": best, "primary_below_zero": below, "em_non_inferior": non_inferior,
            "verdict": "adopt BEST_CORD's settings as CORDConfig defaults" if adopt else
            "keep the paper's defaults; recommend shuffle as the baseline",
            "settings": arm_settings(plan, best) if adopt else None, "rule": plan["decision_rule"]["defaults"]}


def table(result: Mapping[str, Any], n_boot: int = 2000) -> str:
    """The study's page of tables (markdown), from its JSON alone.

    Per context size, one row per arm: each metric's mean over the arm's seeds and the evaluation
    questions with its two-level (seed, question) bootstrap 95% interval
    (:func:`ragkit.eval.stats.seed_question_bootstrap`), the best − worst gap of the slot means and
    EM at each gold slot (means over seeds). Then the headline contrasts of the primary metric (95%,
    Bonferroni-widened interval, Holm p), the secondary metrics' contrasts, ``BEST_CORD`` with the
    selection spreads that named it, and the decision.
    """
    from ragkit.eval.report import format_ci, markdown_table
    from ragkit.eval.stats import seed_question_bootstrap

    arms = result.get("arms", {})
    out: list[str] = []
    for k in (10, 20):
        key = f"evaluation-k{k}"
        have = [x for x, v in arms.items() if key in v.get("per_seed", {}).get("0", {}).get("sweeps", {})]
        if not have:
            continue
        metrics = METRICS if k == 10 else METRICS[:3]  # no random orders at k = 20: no psr
        slots: list[int] = []
        rows = []
        for arm in have:
            sweeps = [r["sweeps"][key] for r in arms[arm]["per_seed"].values() if key in r.get("sweeps", {})]
            cells = [format_ci(seed_question_bootstrap(per_seed_vectors(arms, arm, m, key), n_boot=n_boot, seed=0))
                     for m in metrics]
            gap = float(np.mean([sw["summary"][str(k)]["logprob"]["gap"] for sw in sweeps]))
            em_slot: dict[int, list[float]] = {}
            for sw in sweeps:
                for r in sw["rows"]:
                    if r["setting"] == "slot" and r["k"] == k:
                        em_slot.setdefault(int(r["slot"]), []).append(r["subspan_em"])
            slots = sorted(em_slot)
            rows.append([arm, len(sweeps), len(sweeps[0]["per_question_metrics"]), *cells, f"{gap:.3f}",
                         *(f"{np.mean(em_slot[s]):.3f}" for s in slots)])
        out += [f"## k = {k}: arms (means over seeds and questions, 95% intervals over both)\n",
                markdown_table(["arm", "seeds", "questions", *metrics, "gap", *(f"EM slot {s + 1}" for s in slots)],
                               rows)]
    for title, family in [("primary: spread", {"spread": result.get("contrasts", {}).get("spread", {})}),
                          ("secondary", result.get("contrasts_secondary", {}))]:
        rows = [[name, metric, format_ci(c), f"[{c['lo_bonferroni']:.3f}, {c['hi_bonferroni']:.3f}]",
                 f"{c['p_holm']:.3f}"] for metric, cs in family.items() for name, c in cs.items()]
        if rows:
            out += [f"## Contrasts, k = 10 ({title})\n",
                    markdown_table(["contrast", "metric", "difference [95%]", "Bonferroni", "p (Holm)"], rows)]
    if result.get("selection_spread"):
        best = result.get("best_cord")
        out += ["## BEST_CORD (selection questions, seed 0)\n", markdown_table(
            ["arm", "spread", "chosen"],
            [[x, f"{v:.3f}", "yes" if x == best else ""] for x, v in result["selection_spread"].items()])]
    decision = result.get("decision", {})
    out.append(f"contrasts: {result.get('contrasts_status', 'not computed')}; "
               f"decision: {decision.get('verdict', 'pending')}\n")
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    """The study's options; the plan fixes everything else."""
    ap = pre_registered_parser(__doc__.split("\n")[0], HERE, script="experiments/cord/confirm.py",
                               gpu_args="--model Qwen/Qwen2.5-7B-Instruct --device cuda --workdir /tmp/cord-confirm",
                               workdir="/work/runs/cord-confirm", workdir_help="trained models and partial sweeps",
                               device_help="device of the sweeps (training uses accelerate's)", passage_max_tokens=48)
    ap.add_argument("--sweep-file", default=None, help="default: $RAGKIT_DATA/nq_open/nq-open-oracle.jsonl.gz")
    ap.add_argument("--stage", choices=STAGES, default="report", help="stop after this stage")
    ap.add_argument("--max-questions", type=int, default=None, help="cut each question range (smoke runs only)")
    ap.add_argument("--partial-dir", default=None,
                    help="where each sweep appends its rows as it goes (default: <workdir>/sweeps); a committed "
                         "folder keeps them when the machine is lost; a sweep's file goes once the JSON holds it")
    ap.add_argument("--only", nargs="+", default=None, metavar="ARM:SEED",
                    help="train and sweep these models only (e.g. shuffle:0 base:0); the others wait for a later run")
    return ap


def parse_only(plan: Mapping[str, Any], only: list[str] | None) -> set[tuple[str, int]] | None:
    """``--only``'s ``ARM:SEED`` items as ``(arm, seed)`` pairs (``None``: every model).

    Raises
    ------
    SystemExit
        An item that names no arm of the plan or a seed the plan never gives that arm.
    """
    if not only:
        return None
    second = plan["seeds"]["second_round"]["seeds"]
    out = set()
    for item in only:
        arm, _, seed = item.rpartition(":")
        if arm not in plan["arms"] or not seed.isdigit():
            raise SystemExit(f"--only {item!r}: expected ARM:SEED with ARM one of {sorted(plan['arms'])}")
        seeds = [0] + (second if arm != "base" else [])  # seeds 1-2: shuffle and BEST_CORD, not named yet
        if int(seed) not in seeds:
            raise SystemExit(f"--only {item!r}: the plan trains {arm} at seeds {seeds} only")
        out.add((arm, int(seed)))
    return out


def run(config: Mapping[str, Any]) -> int:
    """Carry out the plan up to ``--stage`` (see the module docstring)."""
    a = study_config(build_parser(), config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    import torch

    from ragkit.datasets import load_dataset
    from ragkit.eval.sweep import position_sweep
    from ragkit.generation import Generator
    from ragkit.models import fast_on_cpu, resolve_generator_path
    from ragkit.training.cord import CORDConfig, train_cord
    from ragkit.training.data import load_examples

    plan, result = pre_registered(a.plan, a.out, a.allow_uncommitted_plan)
    smoke = bool(a.max_questions or a.max_steps or a.allow_uncommitted_plan)
    # the weights' dtype of every training and sweep (the plan's; fp32 where an older plan names none)
    dtype = plan.get("dtype", {}).get("value", "float32")

    def check_speed() -> None:
        """Refuse to train or sweep where the plan's dtype has no fast path (the report needs no model)."""
        if a.device == "cpu" and not (a.max_questions or a.max_steps) and not fast_on_cpu(dtype):
            raise SystemExit(f"this CPU has no fast {dtype} path (PyTorch capability "
                             f"{torch.backends.cpu.get_cpu_capability()}), and the plan runs every training and "
                             f"sweep in {dtype}: a training step would take over 20 minutes. Run the study on a CPU "
                             "with AVX512 (grep avx512 /proc/cpuinfo) or on a GPU (--device cuda)")

    base = resolve_generator_path(a.model)
    train_file = a.train_file or str(data_path("hotpotqa", "train.jsonl"))
    sweep_file = a.sweep_file or str(data_path("nq_open", "nq-open-oracle.jsonl.gz"))
    out = Path(a.out)
    config = {"max_questions": a.max_questions, "max_steps": a.max_steps, "passage_max_tokens": a.passage_max_tokens,
              "device": a.device}
    model = model_record(a.model, base)
    if result.get("config", config) != config or not same_model(result, model):
        raise SystemExit(f"{a.out} was written with other settings or another model "
                         f"({result.get('config')}, {result.get('model')}); pass another --out")
    result.update(smoke=smoke, **model, config=config)
    result.setdefault("arms", {})
    qs = plan["questions"]
    pool = load_dataset("nq-open", sweep_file)

    def rows(key: str) -> list:
        lo, hi = qs[key]["rows"]
        hi = min(hi, lo + a.max_questions) if a.max_questions else hi
        return pool[lo:hi]

    tr = plan["training"]
    result["dtype"] = dtype
    examples: list = []
    partial_dir = Path(a.partial_dir) if a.partial_dir else Path(a.workdir) / "sweeps"
    only = parse_only(plan, a.only)

    def chosen(arm: str, seed: int) -> bool:
        return only is None or (arm, seed) in only

    def recorded(arm: str, seed: int, label: str) -> bool:
        return label in result["arms"].get(arm, {}).get("per_seed", {}).get(str(seed), {}).get("sweeps", {})

    def model_dir(arm: str, seed: int) -> Path:
        return Path(a.workdir) / f"{arm.replace(':', '_')}-seed{seed}"

    def trained(arm: str, seed: int) -> str:
        if arm == "base":
            return base
        nonlocal examples
        final = model_dir(arm, seed) / "final"
        if not (final / "config.json").exists():
            check_speed()
            if not examples:
                examples = load_examples(train_file, limit=None if not a.max_questions else 4 * a.max_questions,
                                         k=tr["k"])
            steps = a.max_steps or tr["max_steps"]
            st = CORDConfig(output_dir=str(model_dir(arm, seed)), model=base, lora=True, lora_r=16,
                            per_device_train_batch_size=1, passage_max_tokens=a.passage_max_tokens,
                            learning_rate=tr["learning_rate"], max_steps=steps, seed=seed, logging_steps=5,
                            save_steps=max(1, min(25, steps)), resume_from_checkpoint="last",
                            dtype=dtype, **arm_settings(plan, arm))
            summary = train_cord(examples, st)
            rec = result["arms"].setdefault(arm, {"per_seed": {}})["per_seed"].setdefault(str(seed), {})
            rec["train"] = {k: v for k, v in summary.items() if k != "settings"}
            save()
        return str(final)

    def arm_summary(v: dict[str, Any]) -> None:
        """An arm's ``seeds`` and ``n_questions`` (its k = 10 evaluation sweeps) and per-seed metrics, kept
        current in every write."""
        seeds = sorted(int(s) for s, r in v["per_seed"].items() if "evaluation-k10" in r.get("sweeps", {}))
        v["seeds"] = seeds
        v["n_questions"] = (len(v["per_seed"][str(seeds[0])]["sweeps"]["evaluation-k10"]["per_question_metrics"])
                            if seeds else 0)
        for s in seeds:
            pqm = v["per_seed"][str(s)]["sweeps"]["evaluation-k10"]["per_question_metrics"]
            v["per_seed"][str(s)]["metrics"] = {m: float(np.nanmean([q[m] for q in pqm.values()])) for m in METRICS}

    def save() -> None:
        """Write ``--out`` atomically, every arm's ``seeds`` and ``n_questions`` brought up to date first."""
        for v in result["arms"].values():
            arm_summary(v)
        write_result(out, result)

    def sweep(arm: str, seed: int, key: str, k: int, permutations: int) -> dict[str, Any]:
        rec = result["arms"].setdefault(arm, {"per_seed": {}})["per_seed"].setdefault(str(seed), {})
        label = f"{key}-k{k}"
        part = partial_dir / f"{arm.replace(':', '_')}-seed{seed}-{label}.partial.jsonl"
        if recorded(arm, seed, label):
            part.unlink(missing_ok=True)  # its rows are in the JSON
            return rec["sweeps"][label]
        check_speed()
        gen = Generator(model=trained(arm, seed), device=a.device, dtype=dtype, passage_max_tokens=a.passage_max_tokens,
                        batch_size=8, decode_batch_size=32, show_progress=False)
        slots = [s - 1 for s in plan["sweeps"][f"k{k}"]["gold_slots_1_based"]]
        part.parent.mkdir(parents=True, exist_ok=True)
        res = position_sweep(gen, rows(key), k=k, slots=slots, pool=pool, seed=0, max_new_tokens=16,
                             generate=key == "evaluation", score=True, partial=part,
                             permutations=permutations if key == "evaluation" else 0)
        d = res.to_dict()
        entry = {"summary": d["summary"], "rows": d["rows"], "per_question": d["per_question"],
                 "per_question_metrics": question_metrics(res, k)}
        rec.setdefault("sweeps", {})[label] = entry
        save()
        part.unlink(missing_ok=True)
        return entry

    trained_arms = [x for x in plan["arms"] if x != "base"]
    cord_arms = [x for x in trained_arms if plan["arms"][x]["loss"] == "cord"]
    evaluate = a.stage in ("evaluate", "report")

    def evaluation_sweeps(arm: str) -> list[tuple[int, int]]:
        """``(k, permutations)`` of an arm's evaluation sweeps: k = 10 for all, k = 20 for base, shuffle, BEST_CORD."""
        return [(10, 5)] + ([(20, 0)] if arm in ("base", "shuffle", result.get("best_cord")) else [])

    def evaluate_model(arm: str, seed: int) -> None:
        for k, permutations in evaluation_sweeps(arm):
            sweep(arm, seed, "evaluation", k, permutations)

    # each trained model's sweeps run right after its training, so that a machine whose work folder is
    # lost between sessions retrains nothing whose sweeps are done; the evaluation sweeps of seed 0 may
    # therefore come before BEST_CORD is named, which reads the selection sweeps only
    # (a sweep trains its model when the model is missing; a recorded sweep needs no model)
    for arm in trained_arms:
        if not chosen(arm, 0):
            continue
        if a.stage != "train" and arm in cord_arms:
            sweep(arm, 0, "selection", 10, 0)
        if evaluate:
            evaluate_model(arm, 0)
        else:  # a run stopped before the evaluation still trains every arm
            trained(arm, 0)
    if a.stage == "train":
        return 0
    if all(recorded(arm, 0, "selection-k10") for arm in cord_arms):
        spreads = {arm: float(np.mean([v["spread"] for v in sweep(arm, 0, "selection", 10, 0)
                                       ["per_question_metrics"].values()])) for arm in cord_arms}
        result["best_cord"] = min(spreads, key=spreads.get)
        result["selection_spread"] = spreads
        save()
    best = result.get("best_cord")
    if a.stage == "select":
        return 0
    second = plan["seeds"]["second_round"]["seeds"]
    for arm in ("shuffle", best) if best else ("shuffle",):
        for seed in second:
            if not chosen(arm, seed):
                continue
            if evaluate:
                evaluate_model(arm, seed)
            else:
                trained(arm, seed)
    if a.stage == "seeds":
        return 0
    planned = [(arm, seed) for arm in ["base", *trained_arms]
               for seed in [0] + (second if arm in ("shuffle", best) else [])]
    for arm, seed in planned:
        if chosen(arm, seed):
            evaluate_model(arm, seed)  # BEST_CORD's k = 20 at seed 0, base's sweeps; the rest are recorded
    if only and only - set(planned):  # seeds 1-2 of a CORD arm that is not (or not yet) BEST_CORD
        logging.warning("--only %s: nothing done for them, as BEST_CORD %s",
                        sorted(f"{x}:{s}" for x, s in only - set(planned)),
                        f"is {best}" if best else "is not named yet (its selection sweeps are pending)")
    if a.stage == "evaluate":
        save()
        return 0
    missing = ([] if best else ["the selection sweeps of " + ", ".join(x for x in cord_arms
                                                                        if not recorded(x, 0, "selection-k10"))])
    missing += [f"{arm}:{seed} evaluation-k{k}" for arm, seed in planned for k, _ in evaluation_sweeps(arm)
                if not recorded(arm, seed, f"evaluation-k{k}")]
    names = plan["intervals"]["headline_contrasts"]
    result["contrasts_status"] = "final" if not missing else "interim: pending " + "; ".join(missing)
    result["contrasts"] = {"spread": contrasts(result["arms"], names, "spread", "evaluation-k10", a.n_boot)}
    secondary = names if not best or f"{best} - shuffle" in names else [*names, f"{best} - shuffle"]
    result["contrasts_secondary"] = {m: contrasts(result["arms"], secondary, m, "evaluation-k10", a.n_boot)
                                     for m in METRICS[1:]}
    result["decision"] = (decide(plan, result) if not missing else
                          {"verdict": "pending", "why": "the plan's sweeps are not all recorded"})
    save()
    logging.info("contrasts: %s; decision: %s", result["contrasts_status"], result["decision"]["verdict"])
    if not missing:  # the page's tables, once; table(json.load(...)) renders an interim JSON on request
        print(table(result, a.n_boot))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
