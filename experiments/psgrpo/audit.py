"""The PS-GRPO confirmation read through a hand audit of its paraphrases: which wordings ask the same question.

The confirmation's strong paraphrases are the reference generator's own rewrites, screened
automatically (not a copy, names and numbers kept, no gold answer the original lacks). A screen of
that kind cannot tell a rewrite that keeps the question from one that asks something else ("What
year did the father of X die?" -> "What year did X die?"). ``paraphrase_audit.json`` labels every
rewrite ``same``, ``changed`` or ``template`` (the rule fallback), by hand, before any trained arm
was evaluated. This script splits the confirmation's per-set answers (passages held fixed, the
generator level) by those labels:

- ``consistency_same``: the plan's consistency (mean pairwise symmetrised BLEU-2,
  :func:`ragkit.eval.generator_consistency`) over the wordings that ask the original question (the
  original, ``same`` and ``template``); defined for the sets with at least one such rewrite.
  Agreement here is what robustness to wording should raise.
- ``agreement_changed``: the mean similarity of the original's answer to each ``changed``
  wording's answer (:func:`ragkit.eval.consistency.output_similarity`); defined for the sets with a
  changed rewrite. These wordings ask other questions, so a rise here is agreement that ignores
  the question, not robustness.
- ``em_same`` / ``f1_same``: EM and F1 against the gold answers over the wordings that ask the
  original question (a changed wording's gold answer is unknown).

Contrasts between the evaluated arms use the plan's interval (two-level paired bootstrap over
seeds and sets, :func:`ragkit.eval.stats.contrast_family`), Holm-corrected within this family. It is
exploratory: the audit is not in ``plan.json``, one reader labelled it, and no default rests on it.
It reads finished results only and runs no model.

    python3 experiments/psgrpo/audit.py   # reads results/confirm-qwen-cpu.json, writes results/audit-qwen-cpu.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.eval import exact_match_max, f1_max, generator_consistency
from ragkit.eval.consistency import output_similarity
from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result
from ragkit.eval.stats import contrast_family

HERE = Path(__file__).resolve().parent
SCRIPT = "experiments/psgrpo/audit.py"
#: per-set values this script derives; each is NaN where a set has no wording of the kind it needs
METRICS = ("consistency_same", "agreement_changed", "em_same", "f1_same")
PAIRS = ("psgrpo - base", "grpo_accuracy - base", "psgrpo - grpo_accuracy", "psgrpo_template - base")
LABELS = ("same", "changed", "template")


def build_parser() -> argparse.ArgumentParser:
    """The script's options: where the confirmation's JSON and the audit are, and where to write."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog(SCRIPT, None, note="GPU: not applicable: it reads a finished run's per-set answers and "
                                               "runs no model."))
    p.add_argument("--results", default=str(HERE / "results" / "confirm-qwen-cpu.json"),
                   help="the confirmation's JSON (experiments/psgrpo/confirm.py --out)")
    p.add_argument("--audit", default=str(HERE / "paraphrase_audit.json"), help="the hand labels")
    p.add_argument("--out", default=str(HERE / "results" / "audit-qwen-cpu.json"), help="result JSON")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples")
    return p


def label_counts(labels: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Counts of each label, the share of the generator's own rewrites that keep the question, and set counts."""
    flat = [x for v in labels.values() for x in v]
    n = {k: flat.count(k) for k in LABELS}
    own = n["same"] + n["changed"]
    return {"n_sets": len(labels), "n_rewrites": len(flat), **{f"n_{k}": v for k, v in n.items()},
            "same_share_of_generated": n["same"] / own if own else float("nan"),
            "sets_all_same_question": sum(all(x != "changed" for x in v) for v in labels.values()),
            "sets_with_changed": sum(any(x == "changed" for x in v) for v in labels.values())}


def set_values(outputs: Sequence[str], labels: Sequence[str], answers: Sequence[str]) -> dict[str, float]:
    """One set's :data:`METRICS` from its answers (the original's first, then one per rewrite) and labels.

    Raises
    ------
    ValueError
        When the set has another number of answers than 1 + its labels.
    """
    if len(outputs) != len(labels) + 1:
        raise ValueError(f"{len(outputs)} answers for {len(labels)} labelled rewrites + the original; "
                         "the audit and the results JSON are of different paraphrase sets")
    same = [outputs[0]] + [o for o, lab in zip(outputs[1:], labels) if lab != "changed"]
    changed = [o for o, lab in zip(outputs[1:], labels) if lab == "changed"]
    nan = float("nan")
    return {"consistency_same": generator_consistency([same]) if len(same) > 1 else nan,
            "agreement_changed": float(np.mean([output_similarity(outputs[0], o) for o in changed])) if changed
            else nan,
            "em_same": float(np.mean([exact_match_max(o, answers) for o in same])),
            "f1_same": float(np.mean([f1_max(o, answers) for o in same]))}


def arm_values(result: Mapping[str, Any], labels: Mapping[str, Sequence[str]],
               answers: Mapping[str, Sequence[str]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """``{arm: {seed: {set_id: values}}}`` for every evaluated arm and seed of the confirmation."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for arm, v in result.get("arms", {}).items():
        for seed, rec in v.get("per_seed", {}).items():
            per = rec.get("evaluation", {}).get("per_set")
            if per:
                missing = sorted(set(per) - set(labels))
                if missing:
                    raise SystemExit(f"the audit has no labels for {len(missing)} set(s) of {arm} seed {seed} "
                                     f"(e.g. {missing[0]}); is it the audit of these paraphrases?")
                out.setdefault(arm, {})[seed] = {q: set_values(e["outputs_fixed"], labels[q], answers[q])
                                                 for q, e in per.items()}
    return out


def vectors(values: Mapping[str, Mapping[str, Mapping[str, float]]], metric: str,
            sets: Sequence[str]) -> dict[str, list[float]]:
    """One arm's per-set values of ``metric`` on ``sets`` (in that order), by seed."""
    return {s: [v[q][metric] for q in sets] for s, v in values.items()}


def run(config: Mapping[str, Any]) -> int:
    """Read the confirmation and the audit, write the split metrics and the contrasts, print the table."""
    a = study_config(build_parser(), config)
    result = json.loads(Path(a.results).read_text(encoding="utf-8"))
    audit = json.loads(Path(a.audit).read_text(encoding="utf-8"))
    labels = audit["labels"]["dev_strong"]
    answers = {r["set_id"]: r["answers"] for r in result["paraphrases"]["dev_strong"]["sets"]}
    vals = arm_values(result, labels, answers)
    arms: dict[str, Any] = {}
    for arm, by_seed in vals.items():
        first = next(iter(by_seed.values()))
        arms[arm] = {"seeds": sorted(int(s) for s in by_seed), "n_sets": len(first),
                     "metrics": {m: float(np.nanmean([np.nanmean([v[m] for v in per.values()])
                                                      for per in by_seed.values()])) for m in METRICS},
                     "n_sets_defined": {m: int(sum(not np.isnan(v[m]) for v in first.values())) for m in METRICS},
                     "per_seed": by_seed}
    pairs = {}
    for name in PAIRS:
        x, y = (s.strip() for s in name.split(" - "))
        if x in vals and y in vals:
            for m in METRICS:
                sets = sorted(q for q in labels if q in next(iter(vals[x].values())) and all(
                    not np.isnan(per[q][m]) for arm in (x, y) for per in vals[arm].values()))
                pairs[f"{name} ({m})"] = (vectors(vals[x], m, sets), vectors(vals[y], m, sets))
    contrasts = contrast_family(pairs, n_boot=a.n_boot, seed=0) if pairs else {}
    out = {"what": __doc__.split("\n\n")[0], "status": audit["status"],
           "results": {"path": rel(Path(a.results)), "plan": result.get("plan")},
           "audit": {"path": rel(Path(a.audit)), "labelled_by": audit["labelled_by"], "when": audit["when"],
                     "dev_strong": label_counts(labels),
                     "train_strong": label_counts(audit["labels"].get("train_strong", {}))},
           "metric_names": list(METRICS), "arms": arms, "contrasts": contrasts,
           "command": f"python3 {SCRIPT}"}
    write_result(Path(a.out), out)
    print(table(out))
    return 0


def table(out: Mapping[str, Any]) -> str:
    """The label counts, one row per arm (mean over seeds), then the contrasts."""
    lines = ["| split | rewrites | same | changed | template | same / generated | sets with a changed wording |",
             "|---|---|---|---|---|---|---|"]
    for split in ("train_strong", "dev_strong"):
        c = out["audit"][split]
        if c["n_rewrites"]:
            lines.append(f"| {split} | {c['n_rewrites']} | {c['n_same']} | {c['n_changed']} | {c['n_template']} | "
                         f"{c['same_share_of_generated']:.2f} | {c['sets_with_changed']} of {c['n_sets']} |")
    lines += ["", "| arm | seeds | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
    for arm, v in out["arms"].items():
        lines.append(f"| {arm} | {v['seeds']} | " + " | ".join(f"{v['metrics'][m]:.3f}" for m in METRICS) + " |")
    if out["contrasts"]:
        lines += ["", "| contrast | sets | mean | 95% | Bonferroni | p (Holm) |", "|---|---|---|---|---|---|"]
        for name, c in out["contrasts"].items():
            lines.append(f"| {name} | {c.get('n_questions', '')} | {c['mean']:+.3f} | "
                         f"[{c['lo']:+.3f}, {c['hi']:+.3f}] | "
                         f"[{c['lo_bonferroni']:+.3f}, {c['hi_bonferroni']:+.3f}] | {c['p_holm']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
