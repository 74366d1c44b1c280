"""Which MoI design ranks the gold paragraphs best? Measured on HotpotQA TRAIN questions (never dev).

For each question the dataset's k paragraphs in their given order (random in HotpotQA) play the
retriever's list. Each MoI design (permutation: cyclic, prior; presence: loo, ablate, mixed) with
each outcome (``gold``: the reference answer's log-prob, an oracle; label-free: ``full_answer``
when the library has it, else ``consensus``) ranks the paragraphs; the ranking is scored against
the supporting-fact paragraphs: MRR@k (reciprocal rank of the first gold paragraph) and
recall@2. ``design@auto`` rows use the adaptive budget (issue 15.3: quality against calls beside
the fixed budgets on the same questions). Also: sequences per question, seconds per question,
the fallback rate (queries kept in the given order by the separation test), and the paired MRR
difference to the given order with a percentile-bootstrap 95% interval (2000 resamples, seeded).

Used to pick MoI's default design on training questions only (issue 20), and the blend with the
retriever order: ``--order bm25`` starts from each question's own BM25 order, and every row also
reports, for each ``β`` of ``--blends``, the MRR of the ranking MoI returns with ``blend=β``
(``(1 − β) z(u) + β z(prior)``, :func:`ragkit.debias.estimators.blend_with_retriever`, the
separation-test fallback kept), computed from the stored utilities without running the model again.

    nice -n 10 python3 experiments/moi_lab/moi_designs.py --limit 10 \\
        --out experiments/moi_lab/results/moi_designs_train-cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from _lab import blend_table, reorder

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, model_label, rel, study_config, study_main, write_result
from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci

ROOT = Path(__file__).resolve().parents[2]


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/moi_lab/moi_designs.py",
        "--model Qwen/Qwen2.5-7B-Instruct --device cuda --batch-size 64 --limit 100 --out "
        "experiments/moi_lab/results/moi_designs_train-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, 
                    help="HotpotQA JSONL (train split; default: $RAGKIT_DATA/hotpotqa/train.jsonl)")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--designs", default="loo,prior,ablate,ablate@auto,cyclic,mixed",
                    help="comma-separated designs, each optionally with @BUDGET (an integer or auto)")
    ap.add_argument("--outcomes", default="gold,label_free")
    ap.add_argument("--passage-max-tokens", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--model", default=None, help="generator (default: the embedded SmolLM2)")
    ap.add_argument("--device", default="auto", help="auto (CUDA with bf16 when present, else CPU fp32), cpu, cuda")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "moi_lab" / "results" / "moi_designs_train-cpu.json"))
    ap.add_argument("--order", choices=("given", "bm25", "dense"), default="given",
                    help="the retriever order MoI starts from (bm25/dense: each question's own passages)")
    ap.add_argument("--orders", default=None,
                    help="JSON of precomputed orders (experiments/moi_lab/question_orders.py)")
    ap.add_argument("--profile", default=None,
                    help="position-profile JSON (default: the generator's cached profile, else calibrated)")
    ap.add_argument("--blends", default="0,0.1,0.25,0.5,0.75",
                    help="retriever-order weights β evaluated from the stored utilities")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the (design, outcome) rows already in --out for the same questions")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    args.data = str(args.data or data_path("hotpotqa", "train.jsonl"))
    logging.basicConfig(level=logging.WARNING)


    from ragkit.datasets import load_hotpotqa
    from ragkit.debias import PositionProfile
    from ragkit.debias.estimators import blend_with_retriever
    from ragkit.debias.moi import MoI
    from ragkit.debias.outcomes import OUTCOMES
    from ragkit.generation import Generator

    if "dev" in Path(args.data).name:
        raise SystemExit("moi_designs picks a default: run it on training questions (train.jsonl), never dev")
    recs = [r for r in load_hotpotqa(args.data, None) if r.gold_ids and r.answers and len(r.passages) >= args.k]
    recs = reorder(recs[: args.limit], args.order, args.orders)
    blends = [float(b) for b in args.blends.split(",") if b.strip()]
    profile = PositionProfile.load(args.profile) if args.profile else None
    gen = Generator(model=args.model, device=args.device, batch_size=args.batch_size,
                    passage_max_tokens=args.passage_max_tokens, show_progress=False)
    label_free = "full_answer" if "full_answer" in OUTCOMES else "consensus"
    qs = [r.question for r in recs]
    ps = [list(r.passages[: args.k]) for r in recs]
    golds = [set(r.gold_ids) for r in recs]
    answers = [list(r.answers) for r in recs]

    def dump(rows: list[dict[str, Any]]) -> None:
        write_result(args.out, {
            "benchmark": "moi_designs", "data": rel(args.data), "n_questions": len(recs),
            "question_ids": [r.id for r in recs], "k": args.k, "model": model_label(gen.name),
            "template": gen.template.name, "passage_max_tokens": args.passage_max_tokens,
            "label_free_outcome": label_free, "order": args.order,
            "profile": rel(args.profile) if args.profile else "cached or calibrated", "rows": rows,
            "note": "seconds_per_q measured on a shared, loaded 2-core CPU at low priority: compare sequences_per_q",
        })

    given = [rank_metrics([p.id for p in pl], g, args.k) for pl, g in zip(ps, golds)]
    given_mrr = np.array([m for m, _ in given])
    base = f"{args.order}_order"
    rows: list[dict[str, Any]] = [{"design": base, "outcome": None, "mrr@10": float(given_mrr.mean()),
                                   "recall@2": float(np.mean([r for _, r in given])), "sequences_per_q": 0.0,
                                   "seconds_per_q": 0.0, "fallback_rate": None,
                                   "per_question_mrr": given_mrr.tolist()}]
    done: set[tuple[str, str]] = set()
    if args.resume and Path(args.out).is_file():
        old = json.loads(Path(args.out).read_text())
        if (old.get("question_ids") == [r.id for r in recs] and old.get("passage_max_tokens") == args.passage_max_tokens
                and old.get("model") in (gen.name, model_label(gen.name)) and old.get("order", "given") == args.order):
            rows = old["rows"]
            done = {(r["design"], r["outcome"]) for r in rows if r["outcome"] is not None}
            for r in rows:  # kept rows: the blend table for this run's --blends, from their stored utilities
                if "per_question_utilities" in r:
                    r["blends"] = blend_table(r, [[p.id for p in pl] for pl in ps], golds, args.k, blends, given_mrr,
                                              blend_with_retriever)
    print(f"{'design':<12} {'outcome':<12} {'MRR@10':>7} {'R@2':>6} {'seq/q':>6} {'s/q':>7} {'fallb':>6}"
          "  dMRR [95% CI]   MRR(no fallback)")
    for r in rows:
        print(f"{r['design']:<12} {str(r['outcome']):<12} {r['mrr@10']:7.3f} {r['recall@2']:6.3f}" + (
            "  blend " + " ".join(f"{b['beta']:g}:{b['mrr@10']:.3f}" for b in r["blends"]) if "blends" in r else ""))
    for spec in args.designs.split(","):
        design, _, b = spec.partition("@")  # "ablate@auto", "cyclic@5": a budget after "@"
        budget: int | str | None = None if not b else (b if b == "auto" else int(b))
        for outcome in args.outcomes.split(","):
            oc = label_free if outcome == "label_free" else outcome
            if (spec, oc) in done:
                continue
            moi = MoI.from_settings(gen, design=design, budget=budget, outcome=oc, max_new_tokens=args.max_new_tokens,
                      **({"profile": profile} if profile is not None else {}))
            t0 = time.perf_counter()
            res = moi.run_batch(qs, ps, answers_list=answers if oc == "gold" else None, generate_answer=False)
            dt = time.perf_counter() - t0
            mets = [rank_metrics(r.ranking.ids(), g, args.k) for r, g in zip(res, golds)]
            mrr = np.array([m for m, _ in mets])
            raw = [[ps[i][j].id for j in sorted(range(args.k), key=lambda j: (-float(r.raw_utilities[j]), j))]
                   for i, r in enumerate(res)]
            mrr_raw = np.array([rank_metrics(ids, g, args.k)[0] for ids, g in zip(raw, golds)])
            row = {"design": spec, "outcome": oc, "mrr@10": float(mrr.mean()),
                   "recall@2": float(np.mean([r for _, r in mets])),
                   "sequences_per_q": float(np.mean([r.generator_calls for r in res])),
                   "seconds_per_q": dt / len(res), "fallback_rate": float(np.mean([r.fallback for r in res])),
                   "mrr_minus_given": paired_ci(mrr, given_mrr), "per_question_mrr": mrr.tolist(),
                   "mrr@10_no_fallback": float(mrr_raw.mean()),
                   "no_fallback_minus_given": paired_ci(mrr_raw, given_mrr),
                   "mean_rounds": float(np.mean([r.rounds for r in res])),
                   "per_question_utilities": [[round(float(x), 6) for x in r.raw_utilities] for r in res],
                   "per_question_fallback": [bool(r.fallback) for r in res]}
            row["blends"] = blend_table(row, [[p.id for p in pl] for pl in ps], golds, args.k, blends, given_mrr,
                                        blend_with_retriever)
            rows.append(row)
            d = row["mrr_minus_given"]
            print(f"{spec:<12} {oc:<12} {row['mrr@10']:7.3f} {row['recall@2']:6.3f} {row['sequences_per_q']:6.1f} "
                  f"{row['seconds_per_q']:7.2f} {row['fallback_rate']:6.2f}  {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
                  f"  {row['mrr@10_no_fallback']:.3f}  blend " + " ".join(
                      f"{b['beta']:g}:{b['mrr@10']:.3f}" for b in row["blends"]), flush=True)
            dump(rows)
    dump(rows)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
