"""The cost of the position sweep: its contexts as orderings with a shared prefix, against one by one.

``ragkit.eval.sweep.position_sweep`` runs each question's contexts of one ``k`` (the gold passage
at each slot among the same distractors, and the random orders of the permutation sensitivity
rate) as the orderings of one :meth:`~ragkit.generation.Generator.run_orderings` query: the
prompt prefix they share is computed once, each context's rest once, its greedy answer decoded
from that cache and the gold answer scored as a continuation of it. The reference (``apart``) is
what a user writes without it: ``Generator.answer`` over every context, then ``Generator.score``
of the gold answer over the scored ones (length-bucketed batches; every prompt prefilled whole,
twice when it is both answered and scored).

The workloads are the CORD confirmation's (``experiments/cord/plan.json``), on ``--questions``
NQ-open questions from row ``--offset`` (300 by default: rows that no study reads), after one
untimed warm-up question through both paths:

* ``evaluation k=10``: gold at slots 1/3/6/8/10, greedy answers (16 tokens), 5 random orders, log-probs;
* ``evaluation k=20``: gold at slots 1/5/10/15/20, greedy answers, log-probs;
* ``selection k=10``: log-probs only (``score_orderings`` against ``score``).

``--decode-batch-size N`` also times the shared path with ``Generator.decode_batch_size = N``
(greedy decoding stacks prefill batches up to ``N`` rows) and reports its speed-up over the default
(``batch_size`` rows a step) and whether the answers and log-probs are the same; ``--no-apart``
skips the one-by-one reference.

Reported per workload: seconds per question of each path and the speed-up ``apart / shared``
measured in the same run, prompt tokens through multi-token forwards (``prefill_tokens``), the
share of identical answers, and the largest differences of a context's log-prob and of a
question's spread over the slots (the CORD study's primary metric). Time it on idle cores.

    python3 benchmarks/sweep_prefix.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)" \\
        --dtype bfloat16 --out benchmarks/results/sweep-prefix-cpu.json
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

import numpy as np
from _shapes import add_generator_args, bench_generator

from ragkit.datasets import data_path, load_dataset
from ragkit.eval.harness import gpu_epilog, rel, write_result
from ragkit.eval.sweep import position_sweep

WORKLOADS = {  # name: (k, 1-based gold slots, generate, permutations)
    "evaluation k=10": (10, [1, 3, 6, 8, 10], True, 5),
    "evaluation k=20": (20, [1, 5, 10, 15, 20], True, 0),
    "selection k=10": (10, [1, 3, 6, 8, 10], False, 0),
}


def spreads(rows: list[dict[str, Any]], values: list[float]) -> dict[str, float]:
    """Per question: max - min of ``values`` over its slot contexts."""
    by_q: dict[str, list[float]] = {}
    for r, v in zip(rows, values):
        if r["setting"] == "slot":
            by_q.setdefault(r["qid"], []).append(v)
    return {q: max(v) - min(v) for q, v in by_q.items()}


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/sweep_prefix.py", "--model Qwen/Qwen2.5-7B-Instruct --device cuda "
                                                      "--out benchmarks/results/sweep-prefix-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--questions", type=int, default=3, help="timed questions per workload")
    ap.add_argument("--offset", type=int, default=300, help="first row of the NQ-open oracle file")
    ap.add_argument("--passage-max-tokens", type=int, default=48, help="the CORD plan's cut of each passage")
    ap.add_argument("--dtype", default="auto", help="the weights' dtype (the CORD plan runs bfloat16)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of the workloads")
    ap.add_argument("--sweep-file", default=None, help="default: $RAGKIT_DATA/nq_open/nq-open-oracle.jsonl.gz")
    ap.add_argument("--decode-batch-size", type=int, default=None,
                    help="also time the shared path with this many rows per decoding step")
    ap.add_argument("--no-apart", action="store_true", help="skip the one-by-one reference path")
    add_generator_args(ap)
    args = ap.parse_args(argv)
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workloads {unknown}: choose from {', '.join(WORKLOADS)}")

    import torch

    logging.basicConfig(level=logging.ERROR)
    sweep_file = args.sweep_file or str(data_path("nq_open", "nq-open-oracle.jsonl.gz"))
    pool = load_dataset("nq-open", sweep_file)
    warm = pool[args.offset - 1: args.offset]
    recs = pool[args.offset: args.offset + args.questions]
    gen = bench_generator(args.model, device=args.device, dtype=args.dtype, passage_max_tokens=args.passage_max_tokens,
                          batch_size=8, show_progress=False)
    by_id = {p.id: p for r in pool for p in r.passages}
    by_q = {r.id: r for r in pool}

    def sync() -> None:
        if gen.device.startswith("cuda"):
            torch.cuda.synchronize()

    def shared(records: list, k: int, slots: list[int], generate: bool, perms: int) -> Any:
        return position_sweep(gen, records, k=k, slots=[s - 1 for s in slots], pool=pool, seed=0, max_new_tokens=16,
                              generate=generate, score=True, permutations=perms, show_progress=False)

    def apart(rows: list[dict[str, Any]], generate: bool) -> tuple[list[str], list[float]]:
        qs = [by_q[r["qid"]].question for r in rows]
        ctxs = [[by_id[i] for i in r["passage_ids"]] for r in rows]
        answers = gen.answer(qs, ctxs, max_new_tokens=16) if generate else [""] * len(rows)
        sc = [j for j, r in enumerate(rows) if r["setting"] != "permutation"]
        res = gen.score([gen.build_prompt(qs[j], ctxs[j]) for j in sc], [by_q[rows[j]["qid"]].answers[0] for j in sc])
        lps = [float("nan")] * len(rows)
        for j, v in zip(sc, res.mean):
            lps[j] = float(v)
        return answers, lps

    def timed(fn: Any, *fn_args: Any) -> tuple[float, Any, int]:
        gen.reset_counters()
        sync()
        t0 = time.perf_counter()
        out = fn(*fn_args)
        sync()
        return time.perf_counter() - t0, out, gen.reset_counters()["prefill_tokens"]

    rows_out = []
    for name in names:
        k, slots, generate, perms = WORKLOADS[name]
        warm_rows = shared(warm, k, slots, generate, perms).per_question  # warm-up, untimed
        if not args.no_apart:
            apart(warm_rows, generate)
        t_sh, res, tok_sh = timed(shared, recs, k, slots, generate, perms)
        rows = res.per_question
        lp_sh = [r["logprob"] for r in rows]
        scored = [j for j, r in enumerate(rows) if r["setting"] != "permutation"]
        row: dict[str, Any] = {"workload": name, "k": k, "gold_slots": slots, "generate": generate,
                               "permutations": perms, "contexts_per_question": len(rows) / len(recs),
                               "shared_seconds_per_question": t_sh / len(recs), "shared_prefill_tokens": tok_sh}
        if not args.no_apart:
            t_ap, (ans, lps), tok_ap = timed(apart, rows, generate)
            s_sh, s_ap = spreads(rows, lp_sh), spreads(rows, lps)
            row.update({
                "apart_seconds_per_question": t_ap / len(recs), "speedup": t_ap / t_sh, "apart_prefill_tokens": tok_ap,
                "identical_answers": (float(np.mean([r["prediction"] == a for r, a in zip(rows, ans)]))
                                      if generate else None),
                "max_abs_logprob_diff": float(max(abs(lp_sh[j] - lps[j]) for j in scored)),
                "max_abs_spread_diff": float(max(abs(s_sh[q] - s_ap[q]) for q in s_sh))})
        if args.decode_batch_size:
            gen.decode_batch_size = args.decode_batch_size
            t_dec, res_dec, _ = timed(shared, recs, k, slots, generate, perms)
            gen.decode_batch_size = None
            dec = res_dec.per_question
            row.update({"decode_batch_size": args.decode_batch_size,
                        "stacked_seconds_per_question": t_dec / len(recs), "stacked_speedup": t_sh / t_dec,
                        "stacked_identical_answers": float(np.mean([a["prediction"] == b["prediction"]
                                                                    for a, b in zip(rows, dec)])),
                        "stacked_max_abs_logprob_diff": float(max(abs(rows[j]["logprob"] - dec[j]["logprob"])
                                                                  for j in scored))})
        rows_out.append(row)
    print(f"{'workload':<17}{'ctx/q':>6}{'shared s/q':>11}{'apart s/q':>10}{'speed-up':>9}{'shared tok':>11}"
          f"{'apart tok':>10}{'same ans':>9}{'max|dlp|':>9}{'max|dspr|':>10}{'stacked s/q':>12}{'speed-up':>9}"
          f"   n={len(recs)}, {gen.name}, {gen.device}")

    def cell(r: dict[str, Any], key: str, fmt: str, width: int) -> str:
        return f"{'-' if r.get(key) is None else format(r[key], fmt):>{width}}"

    for r in rows_out:
        print(f"{r['workload']:<17}{r['contexts_per_question']:>6.0f}{r['shared_seconds_per_question']:>11.2f}"
              + cell(r, "apart_seconds_per_question", ".2f", 10) + cell(r, "speedup", ".2f", 9)
              + f"{r['shared_prefill_tokens']:>11}" + cell(r, "apart_prefill_tokens", "d", 10)
              + cell(r, "identical_answers", ".2f", 9) + cell(r, "max_abs_logprob_diff", ".3f", 9)
              + cell(r, "max_abs_spread_diff", ".3f", 10) + cell(r, "stacked_seconds_per_question", ".2f", 12)
              + cell(r, "stacked_speedup", ".2f", 9))
    write_result(args.out, {"benchmark": "sweep_prefix", "data": rel(sweep_file), "offset": args.offset,
                            "n_questions": len(recs), "model": rel(gen.name), "dtype": str(gen.model.dtype),
                            "passage_max_tokens": args.passage_max_tokens, "batch_size": gen.batch_size,
                            "threads": torch.get_num_threads(), "rows": rows_out}, device=gen.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
