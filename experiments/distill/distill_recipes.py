"""Choose the student's training recipe on held-out train labels (never on dev questions).

The last ``--holdout`` questions of a label file (``ragkit distill labels``) are set aside; each
recipe (loss, learning rate, epochs) trains a student on the rest, then ranks the held-out
questions' paragraphs (in the dataset's given order). For each recipe the table gives the gold-
paragraph MRR@10 and recall@2 of the student's ranking, its mean Spearman correlation with the
teacher's utilities ``u``, and the training time; beside them the teacher's own label rankings and a
random order on the same questions (what the student can reach, and what "learned nothing" looks
like). Every recipe starts from the same base encoder and seed.

    python3 experiments/distill/distill_recipes.py --labels labels.jsonl --holdout 50 \\
        --recipes ranknet:3e-5:3,ranknet:1e-4:3,listnet:1e-4:3 \\
        --out experiments/distill/results/distill_recipes-qwen-cpu.json

``--save-dir`` keeps each student (trained without the held-out questions) for
``experiments/distill/distill.py --student``. The JSON is written after each recipe; a re-run with the same
``--labels`` and ``--holdout`` keeps the recipes already there and trains only the others.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result
from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci
from ragkit.training.labels import label_references

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("benchmarks.distill_recipes")


def parse_recipe(text: str) -> dict[str, Any]:
    """``"listnet:1e-4:3"`` -> ``{"loss": "listnet", "lr": 1e-4, "epochs": 3.0}``."""
    from ragkit.training.distill import LOSSES

    parts = text.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"recipe {text!r}: write it as LOSS:LR:EPOCHS, e.g. listnet:1e-4:3")
    loss, lr, epochs = parts[0], float(parts[1]), float(parts[2])
    if loss not in LOSSES:
        raise ValueError(f"recipe {text!r}: unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    return {"loss": loss, "lr": lr, "epochs": epochs}


def heldout_scores(labs: Sequence[Any], rankings: Sequence[Any]) -> dict[str, list[float]]:
    """Per-question MRR@10, recall@2 (against the gold paragraphs) and Spearman's rho with ``u``.

    ``rankings[i]`` is the student's :class:`~ragkit.types.RankedList` of ``labs[i]``'s passages.
    """
    out: dict[str, list[float]] = {"mrr@10": [], "recall@2": [], "spearman_u": []}
    for lab, rl in zip(labs, rankings):
        rr, r2 = rank_metrics(rl.ids(), lab.gold_ids)
        score = {h.passage.id: h.score for h in rl}
        rho = spearmanr([score[p] for p in lab.passage_ids], list(lab.u)).statistic
        out["mrr@10"].append(rr)
        out["recall@2"].append(r2)
        out["spearman_u"].append(0.0 if not np.isfinite(rho) else float(rho))
    return out


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog("experiments/distill/distill_recipes.py", "--labels labels.jsonl --device cuda --out "
                        "experiments/distill/results/distill_recipes-gpu.json", generator=False,
                        note="Only the student trains here (the labels come from `ragkit distill labels`).")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labels", required=True, help="label file from `ragkit distill labels`")
    ap.add_argument("--holdout", type=int, default=50, help="the last N questions are held out (default 50)")
    ap.add_argument("--recipes", default="ranknet:3e-5:3,ranknet:1e-4:3,listnet:1e-4:3",
                    help="comma-separated LOSS:LR:EPOCHS")
    ap.add_argument("--base-model", default=None,
                    help="encoder every student starts from (default: the embedded all-MiniLM-L6-v2)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dir", default=None,
                    help="also save each recipe's student in SAVE_DIR/LOSS-LR-EPOCHS (for "
                         "experiments/distill/distill.py --student)")
    ap.add_argument("--out", required=True, help="result JSON")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        recipes = [parse_recipe(r) for r in args.recipes.split(",") if r.strip()]
    except ValueError as e:
        ap.error(str(e))

    from ragkit.training.distill import train_student
    from ragkit.training.labels import read_labels

    labs = [x for x in read_labels(args.labels) if x.gold_ids]
    if not 0 < args.holdout < len(labs):
        ap.error(f"--holdout must be between 1 and {len(labs) - 1} (the label file has {len(labs)} questions "
                 "with gold paragraphs)")
    train, held = labs[: -args.holdout], labs[-args.holdout:]
    config = {"labels": rel(args.labels), "num_labels": len(labs), "holdout": args.holdout, "seed": args.seed,
              "base_model": args.base_model or "all-MiniLM-L6-v2 (embedded)"}
    result: dict[str, Any] = {"benchmark": "distill_recipes", "config": config, "recipes": {}}
    out = Path(args.out)
    if out.exists():
        prev = json.loads(out.read_text(encoding="utf-8"))
        if prev.get("config") == config:
            result["recipes"] = prev.get("recipes", {})
            logger.info("resuming %s: recipes done %s", out, sorted(result["recipes"]))
    refs = label_references(held, args.seed)
    result["reference"] = {name: {m: float(np.mean(v)) for m, v in rows.items()} for name, rows in refs.items()}
    for rec in recipes:
        name = f"{rec['loss']}:{rec['lr']:g}:{rec['epochs']:g}"
        if name in result["recipes"]:
            continue
        save = None if args.save_dir is None else Path(args.save_dir) / name.replace(":", "-")
        res = train_student(train, save, base_model=args.base_model, loss=rec["loss"], epochs=rec["epochs"],
                            lr=rec["lr"], seed=args.seed, device=args.device)
        per_q = heldout_scores(held, res.reranker.rank_many([x.question for x in held],
                                                            [x.passages() for x in held]))
        result["recipes"][name] = {
            **rec,
            **{m: float(np.mean(v)) for m, v in per_q.items()},
            "mrr@10_minus_random": paired_ci(per_q["mrr@10"], refs["random"]["mrr@10"]),
            "student_dir": None if save is None else str(save), "train_seconds": res.seconds,
            "initial_loss": res.initial_loss, "final_loss": res.final_loss,
            "per_question": per_q,
        }
        write_result(out, result, device=args.device)
    write_result(out, result, device=args.device)

    print(f"held-out train questions: {len(held)} (trained on {len(train)})")
    print(f"{'recipe':<22}{'MRR@10':>9}{'recall@2':>10}{'rho(u)':>8}{'train s':>9}  MRR - random [95% CI]")
    for name, r in result["recipes"].items():
        d = r["mrr@10_minus_random"]
        print(f"{name:<22}{r['mrr@10']:>9.3f}{r['recall@2']:>10.3f}{r['spearman_u']:>8.3f}"
              f"{r['train_seconds']:>9.0f}  {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]")
    for name, r in result["reference"].items():
        print(f"{name + ' (labels)' if name == 'teacher' else name:<22}{r['mrr@10']:>9.3f}{r['recall@2']:>10.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
