"""The one-pass reranker study: students and the attention probe against label-free MoI, as pre-registered.

The plan (``experiments/onepass/plan.json``, committed before any of its results) fixes the
labels, the train / selection / fidelity / dev questions, the students' grid and selection rule,
the probe, and the targets. This script carries it out, one resumable step at a time (``--step``),
each writing its part of ``--out`` (default ``results/onepass.json``), which names the plan and its
commit:

1. ``labels``: label-free masked leave-one-out labels (what ``moi_masked`` computes at inference)
   on all train questions' pipeline candidates (``ragkit.training.labels.generate_labels``, design
   ``masked``; appended to ``WORKDIR/labels-masked.jsonl``, resumable), then compressed into
   ``results/``;
2. ``students``: in two stages (plan.json, ``students.stages``): residual, bi-encoder and
   cross-encoder students on the masked labels over the plan's learning rates and epochs, then the
   lead of those (recipe, learning rate, epochs) on the gold-passage labels and on both; each
   trained on the first train questions and gated on the selection questions against BM25
   (:func:`ragkit.training.students.distill` with ``held_out``); each recipe's best eligible
   student is kept in ``WORKDIR/students/<recipe>``;
3. ``probe``: the ``moi_attn`` probe fitted on the train questions' masked labels
   (``WORKDIR/probe.json``), its fidelity to the selection questions' masked labels;
4. ``fidelity``: exact leave-one-out MoI, ``moi_masked`` and ``moi_attn`` on the fidelity dev
   questions' candidates: Spearman and top-3 agreement with exact leave-one-out, per question;
5. ``dev``: the plan's frozen dev config (``plan.json``, ``dev.config``: none, ``moi_masked``, the
   selected students, ``moi_attn``) through :func:`ragkit.eval.runner.run_eval`, per-question rows
   in ``<out>.dev.eval.json``, and the plan's targets.

Run from the repository root, e.g.::

    python3 experiments/onepass/run.py --config experiments/onepass/configs/labels.json \\
        --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)"

(``configs/<step>.json`` for each step: ``--step STEP --workdir /work/runs/onepass``).

``--limit N`` is a smoke run (the first ``N`` train and dev questions, one grid point per recipe,
recorded in the JSON); ``--allow-uncommitted-plan`` exists for tests only.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import load_dataset
from ragkit.eval import headline as holm_table
from ragkit.eval.harness import (
    gpu_epilog,
    pre_registered,
    rel,
    resolve_recorded,
    study_config,
    study_main,
    write_result,
)
from ragkit.io import atomic_write_text, read_appended_jsonl

HERE = Path(__file__).resolve().parent
logger = logging.getLogger(__name__)
STEPS = ("labels", "students", "probe", "fidelity", "dev")
SELECT_KEY = ("recall@3", "mrr@10")
"""The selection key of the students, in order (plan.json, students.selection)."""


def build_parser() -> argparse.ArgumentParser:
    """The study's options (the plan fixes everything else)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("experiments/onepass/run.py",
                          "--step fidelity --model Qwen/Qwen2.5-Coder-0.5B-Instruct --device cuda "
                          "--workdir runs/onepass-gpu --out experiments/onepass/results/onepass-gpu.json",
                          note="The plan is the reference generator's (its hub weights on a GPU); another model is "
                               "another study."))
    p.add_argument("--step", required=True, choices=STEPS, help="the plan's step to run (resumable)")
    p.add_argument("--plan", default=str(HERE / "plan.json"), help="the pre-registered plan")
    p.add_argument("--model", default=None, help="generator (the reference generator's GGUF path)")
    p.add_argument("--workdir", default="runs/onepass", help="labels, students and the probe (large files)")
    p.add_argument("--out", default=str(HERE / "results" / "onepass.json"), help="the study's JSON")
    p.add_argument("--device", default="auto")
    p.add_argument("--limit", type=int, default=None,
                   help="smoke run: the first N train questions (the last sixth of them for selection) and the first "
                        "N dev questions, one grid point per recipe")
    p.add_argument("--base-model", default=None, help="smoke runs only: the students' encoder instead of the plan's")
    p.add_argument("--passage-tokens", type=int, default=None, help="smoke runs only: cut passages to N tokens")
    p.add_argument("--allow-uncommitted-plan", action="store_true", help="tests and smoke runs only (recorded)")
    p.add_argument("--quiet", action="store_true")
    return p


# ----------------------------------------------------------------------------- questions and labels
def split_ids(train_ids: Sequence[str], plan: Mapping[str, Any], limit: int | None) -> tuple[list[str], list[str]]:
    """``(train, selection)`` question ids: the plan's row ranges, or with ``limit`` the first ``limit``
    questions, the last sixth of them (at least 2) for selection."""
    if limit is None:
        (a, b), (c, d) = plan["questions"]["train"]["rows"], plan["questions"]["selection"]["rows"]
        return list(train_ids[a:b]), list(train_ids[c:d])
    ids = list(train_ids[:limit])
    n_sel = max(2, len(ids) // 6)
    return ids[:-n_sel], ids[-n_sel:]


def label_sets(masked: Sequence[Any], passages: Sequence[Any], train: Sequence[str]) -> dict[str, list[Any]]:
    """The plan's three training label sets over the ``train`` question ids (file order)."""
    keep = set(train)
    m = [lab for lab in masked if lab.qid in keep]
    g = [lab for lab in passages if lab.qid in keep]
    both = ([dataclasses.replace(lab, qid=f"{lab.qid}#masked") for lab in m]
            + [dataclasses.replace(lab, qid=f"{lab.qid}#passages") for lab in g])
    return {"masked": m, "passages": g, "both": both}


def grid_points(plan: Mapping[str, Any], recipe: str, smoke: bool) -> list[dict[str, float]]:
    """The recipe's (lr, epochs) points in the plan's order; a smoke run keeps the first."""
    g = plan["students"]["grid"][recipe]
    pts = [{"lr": float(lr), "epochs": float(ep)} for lr in g["lr"] for ep in g["epochs"]]
    return pts[:1] if smoke else pts


def selection_key(comparison: Mapping[str, Any]) -> tuple[float, ...]:
    """Higher is better: the student's selection recall@3, then MRR@10."""
    return tuple(float(comparison["student"][m]) for m in SELECT_KEY)


def select_students(runs: Sequence[Mapping[str, Any]], recipes: Sequence[str]) -> dict[str, Any]:
    """Per recipe the eligible run (passed the gate) with the best :func:`selection_key` (ties: the earlier run),
    and the headline recipe, the best of those (plan.json, students.selection)."""
    best: dict[str, Mapping[str, Any]] = {}
    for r in runs:
        c = r.get("comparison")
        if not c or not c["passed"]:
            continue
        cur = best.get(r["recipe"])
        if cur is None or selection_key(c) > selection_key(cur["comparison"]):
            best[r["recipe"]] = r
    per = {rc: best[rc]["name"] for rc in recipes if rc in best}
    headline = None
    for rc in recipes:
        if rc in best and (headline is None or selection_key(best[rc]["comparison"])
                           > selection_key(best[headline]["comparison"])):
            headline = rc
    return {"per_recipe": per, "headline": headline, "no_eligible_student": [rc for rc in recipes if rc not in best]}


def stage_one_lead(runs: Sequence[Mapping[str, Any]], label_set: str) -> Mapping[str, Any] | None:
    """The lead of stage 1 (plan.json, students.stages): among the runs on ``label_set``, an eligible one
    before any other, then the best :func:`selection_key`; ties keep the earlier run (``max`` returns the
    first maximum). ``None`` without runs."""
    judged = [r for r in runs if r["label_set"] == label_set and r.get("comparison")]
    return max(judged, key=lambda r: (bool(r["comparison"]["passed"]), *selection_key(r["comparison"])),
               default=None)


# ----------------------------------------------------------------------------- fidelity and targets
def fidelity_summary(rows: Sequence[Mapping[str, Any]], methods: Sequence[str], seed: int = 0,
                     n_boot: int = 1000) -> dict[str, Any]:
    """Mean Spearman and top-3 agreement of each method's scores with the exact utilities, with bootstrap intervals."""
    from ragkit.debias.attention_probe import spearman_fidelity, top_k_agreement
    from ragkit.eval.stats import bootstrap_ci

    out: dict[str, Any] = {"questions": len(rows)}
    for m in methods:
        pairs = [(r["scores"][m], r["exact"]) for r in rows if m in r["scores"]]
        rho = [spearman_fidelity([a], [b]) for a, b in pairs]
        top = [top_k_agreement([a], [b], 3) for a, b in pairs]
        out[m] = {"spearman": bootstrap_ci(rho, n_boot, seed),  # NaN (a constant score list) is left out
                  "top3_agreement": bootstrap_ci(top, n_boot, seed), "questions": len(pairs)}
    return out


def dev_targets(rows: Sequence[Mapping[str, Any]], candidates: Sequence[str], masked: str = "moi_masked",
                base: str = "none", seed: int = 0, n_boot: int = 1000) -> dict[str, Any]:
    """The plan's targets for each one-pass method of ``candidates``, from the dev run's per-question rows."""
    from ragkit.eval.stats import paired_ci

    by: dict[str, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["method"], {})[r["qid"]] = r
    qids = [q for q in by.get(base, {}) if q in by.get(masked, {})]

    def metric(m: str, name: str) -> np.ndarray:
        return np.array([float(by[m][q]["metrics"][name]) for q in qids])

    def rank_seconds(m: str) -> float:
        return float(np.mean([float((by[m][q].get("ranking_cost") or by[m][q]["cost"])["seconds"]) for q in qids]))

    rng = np.random.default_rng(seed)
    boots = rng.integers(0, len(qids), size=(n_boot, len(qids))) if qids else np.zeros((0, 0), dtype=int)
    r_base, r_masked = metric(base, "recall@3"), metric(masked, "recall@3")
    out: dict[str, Any] = {"questions": len(qids), "baseline": base, "moi": masked,
                           "moi_gain_recall@3": float(r_masked.mean() - r_base.mean()) if qids else None}
    for m in candidates:
        if m not in by or not all(q in by[m] for q in qids) or not qids:
            continue
        res: dict[str, Any] = {}
        for name in ("mrr@10", "recall@3"):
            ci = paired_ci(metric(m, name).tolist(), metric(base, name).tolist(), seed=seed, n_boot=n_boot)
            res[f"{name} - {base}"] = ci
        res["never_below"] = all(res[f"{n} - {base}"][1] >= -0.01 for n in ("mrr@10", "recall@3"))
        r_m = metric(m, "recall@3")
        gain = r_masked.mean() - r_base.mean()
        if gain > 0:
            kept = float((r_m.mean() - r_base.mean()) / gain)
            bk = [(r_m[b].mean() - r_base[b].mean()) / d for b in boots
                  if (d := r_masked[b].mean() - r_base[b].mean()) > 0]
            res["gain_kept"] = [kept, *(np.percentile(bk, [2.5, 97.5]).tolist() if bk else [float("nan")] * 2)]
            res["gain_kept_met"] = kept >= 0.5
        else:
            res["gain_kept"], res["gain_kept_met"] = None, None  # not evaluable: MoI gains nothing here
        ratio = rank_seconds(m) / rank_seconds(masked) if rank_seconds(masked) > 0 else float("nan")
        res["cost_ratio_seconds"] = ratio
        res["cost_met"] = bool(ratio <= 1 / 20)
        out[m] = res
    return out


# ----------------------------------------------------------------------------- the page of tables
def _ci(v: Any, digits: int = 3, signed: bool = False) -> str:
    """``mean [lo, hi]`` of a ``[mean, lo, hi]`` list (paired intervals; bootstrap dicts and numbers go
    through :func:`ragkit.eval.report.format_ci`)."""
    if not v or v[0] is None or (isinstance(v[0], float) and not np.isfinite(v[0])):
        return "-"
    fmt = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    if len(v) < 3 or v[1] is None or (isinstance(v[1], float) and not np.isfinite(v[1])):
        return fmt.format(v[0])
    return f"{fmt.format(v[0])} [{fmt.format(v[1])}, {fmt.format(v[2])}]"


def _label(method: str) -> str:
    """``student:<workdir>/students/residual`` -> ``student:residual`` (the page names a student by its recipe)."""
    if method.startswith("student:"):
        return "student:" + method.rstrip("/").rsplit("/", 1)[-1]
    return method


def tables(result: Mapping[str, Any]) -> str:
    """The study's page of tables (markdown), from its JSON alone: one section per finished step."""
    from ragkit.eval.report import format_ci, markdown_table

    steps = result.get("steps") or {}
    plan = result.get("plan") or {}
    smoke = f"; a SMOKE run: {json.dumps(result['smoke'])}" if result.get("smoke") else ""
    earlier = ", ".join(f"`{c[:12]}`" for c in plan.get("earlier_commits", []))
    amended = f"; the steps before its amendment ran under {earlier}" if earlier else ""
    out = ["# One-pass rerankers: the tables\n",
           f"Written by `experiments/onepass/run.py` with the JSON beside it (plan `{plan.get('path')}` at commit "
           f"`{str(plan.get('commit'))[:12]}`{amended}{smoke}). Every number below is in the JSON, with its "
           "per-question rows.\n"]
    if (lab := steps.get("labels")):
        c = lab.get("cost_per_question") or {}
        out += ["## Labels (label-free masked leave-one-out, train questions)\n", markdown_table(
            ["questions", "seconds / q", "forwards / q", "tokens prefilled / q", "fallback rate", "file"],
            [[lab.get("questions"), format_ci(c.get("seconds"), 1), format_ci(c.get("forwards"), 1),
              format_ci(c.get("tokens_prefilled"), 0), format_ci(lab.get("fallback_rate")),
              lab.get("committed_as") or lab.get("file")]])]
    if (st := steps.get("students")):
        rows = []
        for r in st.get("runs", []):
            c = r.get("comparison") or {}
            stu, fs = c.get("student") or {}, c.get("first_stage") or {}
            rows.append([r["name"], r["stage"], r["recipe"], r["label_set"], f"{r['lr']:g}", f"{r['epochs']:g}",
                         format_ci(stu.get("recall@3")), format_ci(fs.get("recall@3")),
                         format_ci(stu.get("mrr@10")), format_ci(fs.get("mrr@10")), "yes" if c.get("passed") else "no",
                         format_ci(r.get("train_seconds", r.get("seconds")), 0)])
        sel = st.get("selected") or {}
        out += [f"## Students ({st.get('train_questions')} training questions, {st.get('selection_questions')} "
                "selection questions; gate: not below BM25 on recall@3 and MRR@10)\n", markdown_table(
                    ["run", "stage", "recipe", "labels", "lr", "epochs", "recall@3", "BM25 recall@3", "MRR@10",
                     "BM25 MRR@10", "eligible", "train s"], rows),
                f"\nSelected per recipe: {json.dumps(sel.get('per_recipe', {}))}; headline: {sel.get('headline')}; "
                f"no eligible student: {sel.get('no_eligible_student') or 'none'}.\n",
                "\n`train s`: the training's wall seconds, summed over the sessions a resumed run spans, with the "
                "machine's other work at the time included: a record, not a cost measure (the plan's costs: "
                "`benchmarks/results/cpu-dtype-students-cpu.json`).\n"]
    if (pr := steps.get("probe")):
        tr, ho = pr.get("train_fidelity") or {}, pr.get("held_out_fidelity") or {}
        out += ["## The moi_attn probe (fidelity to the masked labels)\n", markdown_table(
            ["questions", "Spearman", "top-3 agreement"],
            [[f"{pr.get('fit_questions')} (fitted on)", format_ci(tr.get("spearman")),
              format_ci(tr.get("top3_agreement"))],
             [f"{ho.get('num_queries')} (held out)", format_ci(ho.get("spearman")),
              format_ci(ho.get("top3_agreement"))]])]
    if (fd := steps.get("fidelity")):
        summ, rows = fd.get("summary") or {}, []
        for m in ("moi_attn", "moi_masked"):
            if m in summ:
                costs = [r["cost"][m] for r in fd.get("rows", []) if m in r.get("cost", {})]
                rows.append([m, format_ci(summ[m].get("spearman")), format_ci(summ[m].get("top3_agreement")),
                             summ[m].get("questions"), format_ci(float(np.mean([c["seconds"] for c in costs])), 1)
                             if costs else "-"])
        ex = [r["cost"]["moi"]["seconds"] for r in fd.get("rows", []) if "moi" in r.get("cost", {})]
        out += [f"## Fidelity to exact leave-one-out ({summ.get('questions')} dev questions)\n",
                markdown_table(["scores", "Spearman [95%]", "top-3 agreement [95%]", "questions", "seconds / q"],
                               rows),
                f"\nExact leave-one-out: {format_ci(float(np.mean(ex)), 1) if ex else '-'} s per question. Target: "
                f"moi_attn's mean Spearman >= 0.7: {fd.get('target_spearman_0.7_met')}.\n"]
    if (dv := steps.get("dev")):
        agg, rows = dv.get("aggregate") or {}, []
        for m in dv.get("methods", []):
            a = agg.get(m) or {}
            rc = a.get("ranking_cost_per_question") or {}
            rows.append([_label(m), *[format_ci(a.get(k)) for k in ("ndcg@10", "mrr@10", "recall@3", "em", "f1")],
                         format_ci(rc.get("seconds"), 2), format_ci(rc.get("model_passes"), 1),
                         format_ci(a.get("seconds_per_question"), 2)])
        out += [f"## Dev ({dv.get('n_questions')} HotpotQA dev questions, BM25 -> 20 -> rerank -> 3)\n",
                markdown_table(["method", "nDCG@10", "MRR@10", "recall@3", "EM", "F1", "ranking s / q",
                                "reranker passes / q", "total s / q"], rows),
                "\nReranker passes: encoder passes for a student (one per question-passage pair, or per text "
                "embedded), generator forwards for moi_masked and moi_attn.\n"]
        tg, trows = dv.get("targets") or {}, []
        for m, t in tg.items():
            if not isinstance(t, Mapping):
                continue
            trows.append([_label(m) + (" (headline)" if m == dv.get("headline") else ""),
                          _ci(t.get("mrr@10 - none"), signed=True), _ci(t.get("recall@3 - none"), signed=True),
                          t.get("never_below"), _ci(t.get("gain_kept")), t.get("gain_kept_met"),
                          format_ci(t.get("cost_ratio_seconds"), 4), t.get("cost_met")])
        out += [f"\nTargets (MoI's recall@3 gain over BM25: {format_ci(tg.get('moi_gain_recall@3'))}):\n",
                markdown_table(["reranker", "MRR@10 - BM25", "recall@3 - BM25", "never below", "gain kept",
                                ">= 50%", "cost / MoI's", "<= 1/20"], trows)]
        hr = (dv.get("holm_table") or {}).get("rows") or []
        if hr:
            out += [f"\nAll contrasts, Holm-corrected as one family ({len(hr)} rows, alpha 0.05):\n",
                    markdown_table(["contrast", "metric", "difference [95%]", "Holm interval", "p (Holm)", "holds"],
                                   [[" - ".join(_label(x) for x in r["contrast"].split(" - ")), r["metric"],
                                     _ci([r["mean"], r["lo"], r["hi"]], signed=True),
                                     _ci([r["mean"], r.get("holm_lo"), r.get("holm_hi")], signed=True),
                                     format_ci(r.get("p_holm")), "yes" if r.get("holds") else "no"] for r in hr])]
    return "\n".join(out)


# ----------------------------------------------------------------------------- the steps
class Study:
    """One run of the plan: settings, the result being extended, and where files go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.plan, self.result = pre_registered(args.plan, self.out, allow_uncommitted=args.allow_uncommitted_plan)
        self.result.setdefault("study", "onepass")
        self.result.setdefault("steps", {})
        if args.limit is not None or args.base_model or args.passage_tokens:
            self.result["smoke"] = {"limit": args.limit, "base_model": args.base_model,
                                    "passage_tokens": args.passage_tokens}
        if args.allow_uncommitted_plan:
            self.result["plan_uncommitted_allowed"] = True
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        q = self.plan["questions"]
        self.train_file = resolve_recorded(q["train_file"])
        self.dev_file = resolve_recorded(q["dev_file"])
        self._gen: Any = None

    # ------------------------------------------------------------------ helpers
    def save(self) -> None:
        write_result(self.out, self.result, device=self.args.device)
        atomic_write_text(self.out.with_suffix(".md"), tables(self.result))  # the page of tables, beside its JSON

    def generator(self) -> Any:
        if self._gen is None:
            from ragkit.generation import load_generator

            kw: dict[str, Any] = {"device": self.args.device, "show_progress": False,
                                  "dtype": self.plan["protocol"].get("dtype", "auto")}
            tokens = self.args.passage_tokens if self.args.passage_tokens else self.plan["protocol"]["passage_tokens"]
            if tokens:
                kw["passage_max_tokens"] = int(tokens)
            self._gen = load_generator(self.args.model, **kw)
        return self._gen

    def records_with_candidates(self, questions_file: str, pool_file: str, limit: int | None) -> list[Any]:
        """The first ``limit`` questions of ``questions_file`` with their pipeline candidates (both files pooled)."""
        from ragkit.eval.runner import EvalConfig, records_with_candidates

        recs = load_dataset("hotpotqa", questions_file)
        pool = [*recs, *load_dataset("hotpotqa", pool_file)]
        pr = self.plan["protocol"]
        cfg = EvalConfig(dataset="hotpotqa", retriever=pr["retriever"], candidates=int(pr["candidates"]),
                         k=int(pr["k"]), device=self.args.device)
        return records_with_candidates(cfg, recs[:limit] if limit else recs, pool=pool)

    def train_ids(self) -> list[str]:
        return [r.id for r in load_dataset("hotpotqa", self.train_file)]

    def masked_labels(self) -> list[Any]:
        from ragkit.training.labels import read_labels

        path = self.work / "labels-masked.jsonl"
        committed = HERE / self.plan["labels"]["masked"]["committed_as"]
        if not path.exists() and committed.exists() and self.args.limit is None:
            return read_labels(committed)
        return read_labels(path)

    def probe_file(self) -> Path | None:
        """The fitted probe: the work folder's, else the copy committed under ``ragkit/data/probes`` (the
        step's ``install`` target), so a new machine with an empty work folder neither refits it for hours
        nor loses it. ``None`` before the probe step has run."""
        path = self.work / "probe.json"
        if path.exists():
            return path
        rec = self.result["steps"].get("probe") or {}
        committed = HERE.parents[1] / rec["install"].split()[-1] if rec.get("install") else None
        return committed if committed is not None and committed.exists() else None

    def passage_labels(self) -> list[Any]:
        from ragkit.training.labels import read_labels

        return read_labels(HERE.parents[1] / self.plan["labels"]["passages"]["file"])

    # ------------------------------------------------------------------ 1. labels
    def labels(self) -> None:
        from ragkit.training.labels import generate_labels

        done = self.result["steps"].get("labels") or {}
        if self.args.limit is None and done.get("committed_as") \
                and (HERE / self.plan["labels"]["masked"]["committed_as"]).exists():
            logger.info("labels: finished (%s); the step's record is left as it is", done["committed_as"])
            return
        recs = self.records_with_candidates(self.train_file, self.dev_file, self.args.limit or None)
        path = self.work / "labels-masked.jsonl"
        stats = generate_labels(self.generator(), recs, path, design="masked", outcome="question",
                                batch_queries=1, show_progress=not self.args.quiet)
        from ragkit.training.labels import read_labels

        labs = read_labels(path)
        costs = [lab.metadata.get("cost", {}) for lab in labs]
        step = {"command": self.plan["labels"]["masked"]["command"], "file": rel(path), "questions": len(labs),
                "this_call": stats.to_dict(),
                "cost_per_question": {k: float(np.mean([c[k] for c in costs if k in c]))
                                      for k in ("seconds", "forwards", "tokens_prefilled")
                                      if any(k in c for c in costs)},
                "fallback_rate": float(np.mean([bool(lab.metadata.get("fallback")) for lab in labs]))}
        if len(labs) == len(recs) and self.args.limit is None:  # finished: the committed, compressed copy
            gz = HERE / self.plan["labels"]["masked"]["committed_as"]
            gz.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb") as f, gzip.open(gz, "wb") as g:
                shutil.copyfileobj(f, g)
            step["committed_as"] = rel(gz)
        self.result["steps"]["labels"] = step
        self.save()

    # ------------------------------------------------------------------ 2. students
    def students(self) -> None:
        from ragkit.training.students import distill

        train, sel = split_ids(self.train_ids(), self.plan, self.args.limit)
        masked, gold = self.masked_labels(), self.passage_labels()
        sets = label_sets(masked, gold, train)
        sel_set = set(sel)
        held = [lab for lab in masked if lab.qid in sel_set] or [lab for lab in gold if lab.qid in sel_set]
        step = self.result["steps"].setdefault("students", {"runs": []})
        step.update(train_questions=len(train), selection_questions=len(held),
                    label_set_sizes={k: len(v) for k, v in sets.items()})
        done = {r["name"] for r in step["runs"]}
        sdir = self.work / "students"
        recipes = self.plan["students"]["recipes"]
        first_set = self.plan["students"]["stages"]["recipe"]["label_set"]

        cand = sdir / "_candidate"

        def fit(recipe: str, set_name: str, pt: Mapping[str, float], name: str) -> Any:
            return distill(sets[set_name], cand, recipe, holdout=0.0, held_out=held, relevance="gold",
                           force=True, seed=int(self.plan["protocol"]["seed"]), overwrite=True,
                           base_model=self.args.base_model or self.plan["students"]["base_model"],
                           lr=pt["lr"], epochs=pt["epochs"], device=self.args.device, show_progress=False,
                           bf16=bool(self.plan["students"].get("bf16", False)),
                           checkpoint_dir=sdir / "_checkpoints" / name)  # a killed grid point resumes mid-training

        def train(recipe: str, set_name: str, pt: Mapping[str, float], stage: int) -> None:
            name = f"{recipe}-{set_name}-lr{pt['lr']:g}-ep{pt['epochs']:g}"
            if name in done or not sets[set_name]:
                return
            t0 = time.perf_counter()
            res = fit(recipe, set_name, pt, name)
            comp = res.reranker.metadata["comparison"]
            run = {"name": name, "recipe": recipe, "label_set": set_name, "stage": stage,
                   "lr": float(pt["lr"]), "epochs": float(pt["epochs"]),
                   "train_questions": res.num_queries, "seconds": round(time.perf_counter() - t0, 1),
                   "train_seconds": round(float(res.seconds), 1),
                   "resumed_from_step": res.reranker.metadata.get("resumed_from_step", 0),
                   "initial_loss": getattr(res, "initial_loss", None),
                   "final_loss": getattr(res, "final_loss", None),
                   "comparison": {k: comp[k] for k in ("num_queries", "relevance", "first_stage", "student",
                                                       "delta", "passed")}}
            step["runs"].append(run)
            sel_now = select_students(step["runs"], recipes)
            if sel_now["per_recipe"].get(recipe) == name:  # the recipe's best so far: keep its folder
                keep = sdir / recipe
                if keep.exists():
                    shutil.rmtree(keep)
                cand.rename(keep)
            elif cand.exists():
                shutil.rmtree(cand)
            step["selected"] = sel_now
            self.save()

        # stage 1: every recipe over its grid on the first label set
        for recipe in recipes:
            for pt in grid_points(self.plan, recipe, self.args.limit is not None):
                train(recipe, first_set, pt, 1)
        # stage 2: stage 1's lead (recipe, lr, epochs) on the other label sets
        lead = stage_one_lead(step["runs"], first_set)
        step["stage_one_lead"] = lead["name"] if lead else None
        if lead is not None:
            for set_name in self.plan["students"]["label_sets"]:
                if set_name != first_set:
                    train(lead["recipe"], set_name, lead, 2)
        step["selected"] = select_students(step["runs"], recipes)
        # a selected student whose folder is gone (a new machine: the work folder is not committed) is
        # trained again from its recorded settings and seed; the refit's selection scores are recorded
        # beside the original's, so a reader sees whether the dev row evaluates the same student
        for rc, name in step["selected"]["per_recipe"].items():
            if (sdir / rc).is_dir():
                continue
            r = next(r for r in step["runs"] if r["name"] == name)
            t0 = time.perf_counter()
            comp = fit(r["recipe"], r["label_set"], r, name).reranker.metadata["comparison"]
            was = r["comparison"]["student"]
            diff = max(abs(float(comp["student"][m]) - float(was[m])) for m in was)
            step.setdefault("refits", []).append(
                {"name": name, "seconds": round(time.perf_counter() - t0, 1), "student": comp["student"],
                 "max_abs_difference": diff})
            cand.rename(sdir / rc)
            self.save()
        step["folders"] = {rc: rel(sdir / rc) for rc in step["selected"]["per_recipe"]}
        self.save()

    # ------------------------------------------------------------------ 3. probe
    def probe(self) -> None:
        from ragkit.debias.attention_probe import (
            attention_feature_table,
            default_probe_path,
            fit_attention_probe,
            spearman_fidelity,
            top_k_agreement,
        )

        train, sel = split_ids(self.train_ids(), self.plan, self.args.limit)
        masked = self.masked_labels()
        tr = [lab for lab in masked if lab.qid in set(train)]
        ho = [lab for lab in masked if lab.qid in set(sel)]
        pc = self.plan["probe"]
        path = self.work / "probe.json"
        fitted = self.probe_file()
        if "probe" in self.result["steps"] and fitted is not None:  # a restart must not refit for hours
            logger.info("probe: fitted already (%s); delete it to fit again", fitted)
            return
        gen = self.generator()
        # each question's features are kept as computed (hours of CPU): a restart reads them back
        cache = self.work / "probe-features.jsonl"
        read_back = len(read_appended_jsonl(cache))  # questions computed by an earlier, interrupted run
        t0 = time.perf_counter()
        probe = fit_attention_probe(gen, [lab.question for lab in tr], [lab.passages() for lab in tr],
                                    [lab.u for lab in tr], ridge=float(pc["ridge"]), target=pc["target"],
                                    calibrated=bool(pc["calibrated"]), show_progress=not self.args.quiet,
                                    metadata={"labels": "masked", "study": "onepass", "plan": self.result["plan"]},
                                    cache=cache)
        fit_s = time.perf_counter() - t0
        pred = attention_feature_table(gen, [lab.question for lab in ho], [lab.passages() for lab in ho],
                                       calibrated=probe.calibrated, cache=cache, show_progress=not self.args.quiet)
        scores = [probe.score(x) for x in pred]
        probe.metadata["held_out_fidelity"] = {"num_queries": len(ho), "against": "masked labels",
                                               "spearman": spearman_fidelity(scores, [lab.u for lab in ho]),
                                               "top3_agreement": top_k_agreement(scores, [lab.u for lab in ho], 3)}
        probe.save(path)
        self.result["steps"]["probe"] = {
            "file": rel(path), "fit_questions": len(tr), "fit_seconds": round(fit_s, 1),
            "feature_rows_from_an_earlier_run": read_back,
            "train_fidelity": probe.metadata["train_fidelity"],
            "held_out_fidelity": probe.metadata["held_out_fidelity"],
            "install": f"cp {rel(path)} {rel(default_probe_path(gen))}"}
        self.save()

    # ------------------------------------------------------------------ 4. fidelity
    def fidelity(self) -> None:
        from ragkit.debias import get_reranker
        from ragkit.generation.base import metered

        a, b = self.plan["questions"]["fidelity"]["rows"]
        n = min(b - a, self.args.limit) if self.args.limit else b - a
        recs = self.records_with_candidates(self.dev_file, self.train_file, a + n)[a:a + n]
        step = self.result["steps"].setdefault("fidelity", {"rows": []})
        done = {r["qid"] for r in step["rows"]}
        gen = self.generator()
        probe = self.probe_file()
        if probe is None:
            raise SystemExit("no fitted probe: run --step probe first")
        rerankers = {"moi": get_reranker("moi", gen, blend=0), "moi_masked": get_reranker("moi_masked", gen, blend=0),
                     "moi_attn": get_reranker("moi_attn", gen, probe=str(probe))}
        for rec in recs:
            if rec.id in done:
                continue
            ps = list(rec.passages)
            row: dict[str, Any] = {"qid": rec.id, "candidates": [p.id for p in ps], "scores": {}, "cost": {}}
            for name, rr in rerankers.items():
                t0 = time.perf_counter()
                with metered() as cost:
                    ranked = rr.rank(rec.question, ps)
                raw = ranked.info.details.get("raw_utilities")
                if raw is None:  # a scoring reranker: its scores in candidate order
                    by = {id(h.passage): h.score for h in ranked}
                    raw = [float(by[id(p)]) for p in ps]
                vals = [float(x) for x in raw]
                if name == "moi":
                    row["exact"] = vals
                else:
                    row["scores"][name] = vals
                row["cost"][name] = {"seconds": round(time.perf_counter() - t0, 2), "forwards": cost.forward_passes,
                                     "tokens_prefilled": cost.tokens_prefilled}
            step["rows"].append(row)
            step["summary"] = fidelity_summary(step["rows"], ["moi_attn", "moi_masked"])
            self.save()
        step["summary"] = fidelity_summary(step["rows"], ["moi_attn", "moi_masked"])
        att = step["summary"].get("moi_attn", {}).get("spearman", {}).get("mean", float("nan"))
        step["target_spearman_0.7_met"] = bool(att >= 0.7) if np.isfinite(att) else None
        self.save()

    # ------------------------------------------------------------------ 5. dev
    def dev(self) -> None:
        from ragkit.eval.runner import EvalConfig, run_eval, select_questions

        cfg = self.plan["dev"]["config"]  # frozen with the plan: pre_registered checked its commit
        sel = (self.result["steps"].get("students") or {}).get("selected")
        if sel is None:
            raise SystemExit("no students selected yet: run --step students first")
        probe = self.probe_file()
        if probe is None:
            raise SystemExit("no fitted probe: run --step probe first")
        student_of = {rc: f"student:{self.work / 'students' / rc}" for rc in sel["per_recipe"]}
        students = list(student_of.values())
        for s in students:
            if not Path(s.partition(":")[2]).is_dir():
                raise SystemExit(f"the selected student {s} is missing: run --step students again (it retrains it)")
        methods: list[str] = []
        for m in cfg["methods"].split(","):
            methods += students if m == "STUDENTS" else [m]
        settings = {**cfg.get("method_settings", {}), "moi_attn": {"probe": str(probe)}}
        data_file = resolve_recorded(cfg["data_file"])
        recs = load_dataset(cfg["dataset"], data_file)
        pool = [*recs, *(r for f in cfg["pool_file"] for r in load_dataset(cfg["dataset"], resolve_recorded(f)))]
        ecfg = EvalConfig(dataset=cfg["dataset"], data_file=data_file, limit=self.args.limit or cfg["limit"],
                          offset=cfg["offset"], retriever=cfg["retriever"], candidates=cfg["candidates"], k=cfg["k"],
                          methods=tuple(methods), model=self.args.model,
                          passage_max_tokens=self.args.passage_tokens or cfg["passage_tokens"],
                          max_new_tokens=cfg["max_new_tokens"], chunk_size=cfg["chunk_size"], seed=cfg["seed"],
                          n_bootstrap=cfg["bootstrap"], device=self.args.device, method_kwargs=settings,
                          dtype=cfg.get("dtype", "auto"))
        eval_out = self.out.with_suffix(".dev.eval.json")
        report = run_eval(ecfg, out=eval_out, records=select_questions(ecfg, recs), pool=pool,
                          show_progress=not self.args.quiet)
        one_pass = [*students, "moi_attn"]
        headline = sel["headline"]
        # every contrast the page reports, Holm-corrected as one family: each one-pass reranker and
        # moi_masked against BM25, each one-pass reranker against moi_masked
        pairs = [(m, "none") for m in ["moi_masked", *one_pass]] + [(m, "moi_masked") for m in one_pass]
        # the untrained embedder a bi-encoder student starts from (plan: dev.reference_contrast): against BM25,
        # and the student against it, so the page separates what the labels taught from what the embedder knew
        ref = next((m for m in methods if m.startswith("bi-encoder:")), None)
        if ref is not None:
            pairs.append((ref, "none"))
            if "bi-encoder" in student_of:
                pairs.append((student_of["bi-encoder"], ref))
        self.result["steps"]["dev"] = {
            "config": "plan.json: dev.config", "methods": methods,
            "headline": student_of[headline] if headline else None,
            "eval_report": rel(eval_out), "n_questions": report["n_questions"],
            "aggregate": report["aggregate"], "paired": report["paired"],
            "targets": dev_targets(report["outputs"], [*one_pass, *([ref] if ref else [])], seed=cfg["seed"],
                                   n_boot=cfg["bootstrap"]),
            "holm_table": holm_table(report["outputs"], cfg["dataset"], [], pairs=pairs, k=cfg["k"],
                                     n_bootstrap=cfg["bootstrap"], seed=cfg["seed"]),
        }
        self.save()


def run(config: Mapping[str, Any]) -> int:
    """Run one step of the plan (see :func:`build_parser`)."""
    args = study_config(build_parser(), config)
    study = Study(args)
    getattr(study, args.step)()
    print(json.dumps(study.result["steps"].get(args.step, {}).get("summary")
                     or study.result["steps"].get(args.step, {}).get("selected")
                     or {k: v for k, v in study.result["steps"].get(args.step, {}).items()
                         if k in ("questions", "cost_per_question", "held_out_fidelity", "targets")}, indent=1,
                     default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python3 experiments/onepass/run.py --step STEP --model GGUF --workdir DIR``."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
