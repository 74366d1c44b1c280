"""MoI vs. baselines on HotpotQA: gold-paragraph ranking quality, answer quality, cost.

For each question the dataset's 10 paragraphs in their given order play the retriever's list.
Every method (retriever order, reverse, both ends, random, answer voting, permutation
self-consistency, MoI with each outcome and design) produces a ranking and a final answer:

- ranking: gold-paragraph MRR@10 and recall@2 (ragkit.eval.metrics.ir_metrics_per_query / ranx);
- answer: EM / F1 (ragkit.eval.metrics, SQuAD normalisation) of the final generation;
- cost: generator sequences per question and wall seconds per question.

Questions are processed one at a time (every method on question i before question i+1) and the
JSON is rewritten after each question, so a run stopped by ``--time-budget`` still reports every
method on the same completed questions.

    nice -n 10 python3 benchmarks/moi_quality.py --data ../shared/data/hotpotqa/dev.jsonl \
        --limit 20 --time-budget 1200 --out benchmarks/results/moi_quality-cpu.json
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

import numpy as np
from _harness import rel, shared_data, write_result

DEFAULT_METHODS = ("none", "reverse", "both_ends", "random", "voting", "psc_borda", "psc_rrf", "moi", "moi_prior",
                   "moi_confidence", "moi_gold")


class SharedGenerations:
    """Delegates to a Generator but memoises ``generate`` by (prompt, settings).

    Greedy decoding is deterministic, so voting, PSC and MoI (same cyclic orderings, same
    prompts) get identical per-ordering answers whether or not they are shared; sharing only
    saves wall time on a loaded CPU. ``generator_calls`` still count every sequence a method
    needs on its own; the seconds of later methods exclude the shared generations.
    """

    def __init__(self, gen: Any) -> None:
        self._gen = gen
        self._memo: dict[tuple[Any, ...], str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gen, name)

    def generate(self, prompts: list[str], max_new_tokens: int = 32, stop: Any = None,
                 temperature: float = 0.0, **kw: Any) -> list[str]:
        if temperature != 0.0 or kw.get("n", 1) != 1:
            return self._gen.generate(prompts, max_new_tokens=max_new_tokens, stop=stop,
                                      temperature=temperature, **kw)
        key = (max_new_tokens, tuple(stop or ()))
        todo = list(dict.fromkeys(p for p in prompts if (p, *key) not in self._memo))
        if todo:
            for p, o in zip(todo, self._gen.generate(todo, max_new_tokens=max_new_tokens, stop=stop)):
                self._memo[(p, *key)] = o
        return [self._memo[(p, *key)] for p in prompts]


def summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, float]]:
    """Mean of every per-question metric, per method, over the questions all methods finished."""
    done = [r for r in rows if all(m in r["methods"] for m in methods)]
    out: dict[str, dict[str, float]] = {}
    for m in methods:
        vals = [r["methods"][m] for r in done]
        if not vals:
            continue
        out[m] = {key: float(np.mean([v[key] for v in vals]))
                  for key in ("mrr@10", "recall@2", "em", "f1", "generator_calls", "seconds")}
        out[m]["n"] = len(vals)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="default: ../shared/data/hotpotqa/dev.jsonl")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--offset", type=int, default=0, help="skip the first N records")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--passage-tokens", type=int, default=60)
    ap.add_argument("--profile", default=None, help="profile JSON (default: the recency-heavy default)")
    ap.add_argument("--calibrate", type=int, default=0,
                    help="calibrate the profile on N questions of --calib-data first (0: use the default)")
    ap.add_argument("--calib-data", default=None, help="default: ../shared/data/hotpotqa/train.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--no-share", action="store_true",
                    help="do not share identical greedy generations between methods (slower, same results)")
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    args.data = str(args.data or shared_data("hotpotqa", "dev.jsonl"))
    if args.calibrate > 0 and args.calib_data is None:
        args.calib_data = str(shared_data("hotpotqa", "train.jsonl"))
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")

    import torch

    from ragkit.datasets import load_hotpotqa
    from ragkit.debias import PositionProfile, get_method
    from ragkit.eval.metrics import exact_match_max, f1_max, ir_metrics_per_query
    from ragkit.generation import Generator

    t_start = time.perf_counter()
    records = load_hotpotqa(args.data, args.offset + args.limit)[args.offset:]
    gen = Generator(args.model, passage_max_tokens=args.passage_tokens, batch_size=args.batch_size,
                    show_progress=False)
    calib_s = 0.0
    if args.profile:
        profile = PositionProfile.load(args.profile)
    elif args.calibrate > 0:
        t0 = time.perf_counter()
        profile = PositionProfile.calibrate(gen, load_hotpotqa(args.calib_data, args.calibrate), k=10)
        calib_s = time.perf_counter() - t0
    else:
        profile = PositionProfile.recency(10, model=gen.name)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    shared = gen if args.no_share else SharedGenerations(gen)
    runners = {m: get_method(m, shared, max_new_tokens=args.max_new_tokens,
                             **({"profile": profile} if m.startswith("moi") else {})) for m in methods}
    rows: list[dict[str, Any]] = []

    def write(final: bool) -> dict[str, Any]:
        result = {
            "benchmark": "moi_quality",
            "data": rel(args.data), "offset": args.offset, "limit": args.limit,
            "questions_done": sum(all(m in r["methods"] for m in methods) for r in rows),
            "generator": gen.name, "template": gen.template.name, "passage_tokens": args.passage_tokens,
            "k": 10, "max_new_tokens": args.max_new_tokens, "shared_generations": not args.no_share,
            "profile": profile.to_dict(), "calibration_seconds": calib_s,
            "machine": {"torch_threads": torch.get_num_threads()},
            "wall_seconds": time.perf_counter() - t_start, "finished": final,
            "summary": summarise(rows, methods), "per_question": rows,
        }
        write_result(args.out, result)
        return result

    for i, rec in enumerate(records):
        if args.time_budget and time.perf_counter() - t_start > args.time_budget:
            logging.warning("time budget reached after %d questions", i)
            break
        row: dict[str, Any] = {"id": rec.id, "question": rec.question, "answers": list(rec.answers),
                               "gold_ids": list(rec.gold_ids), "methods": {}}
        for m in methods:
            t0 = time.perf_counter()
            (o,) = runners[m].run_many([rec.question], [list(rec.passages)], answers=[list(rec.answers)])
            dt = time.perf_counter() - t0
            ir = ir_metrics_per_query({rec.id: list(rec.gold_ids)}, {rec.id: o.ranking}, ("mrr@10", "recall@2"))
            row["methods"][m] = {
                "mrr@10": ir["mrr@10"].get(rec.id, 0.0), "recall@2": ir["recall@2"].get(rec.id, 0.0),
                "em": exact_match_max(o.answer or "", rec.answers), "f1": f1_max(o.answer or "", rec.answers),
                "answer": o.answer, "ranking": o.ranking.ids(), "order": o.order,
                "generator_calls": o.generator_calls, "seconds": dt,
            }
        rows.append(row)
        write(False)
        print(f"[{i + 1}/{len(records)}] {time.perf_counter() - t_start:.0f}s", file=sys.stderr, flush=True)
    result = write(True)
    head = f"{'method':<16}{'MRR@10':>8}{'R@2':>7}{'EM':>7}{'F1':>7}{'calls/q':>9}{'s/q':>8}"
    print(f"{head}   n={result['questions_done']}")
    for m, s in result["summary"].items():
        print(f"{m:<16}{s['mrr@10']:>8.3f}{s['recall@2']:>7.3f}{s['em']:>7.3f}{s['f1']:>7.3f}"
              f"{s['generator_calls']:>9.1f}{s['seconds']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
