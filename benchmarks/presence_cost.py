"""The cost of presence interventions: scoring them one by one against the shared-prefix path.

For each HotpotQA dev question (its first ``k`` paragraphs, bodies cut to ``--passage-max-tokens``)
and each design (``loo``: the full prompt and the ``k`` prompts that each leave one passage out;
``ablate``: ``2k`` random keep-masks, seed 0), the same answer is scored under every intervention
twice:

* ``plain``: ``Generator.score`` over the interventions' full prompts (each prompt prefilled whole,
  length-bucketed batches);
* ``shared``: ``Generator.score_orderings`` (:func:`ragkit.generation.scoring.prefix_plan`: one
  reference row's prefix cached, every row reuses the part it shares with it, rows cut into length
  buckets by the tokens they still compute; AttriBoT, Liu et al., ICLR 2025, arXiv 2411.15102).

Reported per design: seconds (median of ``--repeats`` after one untimed warm-up), real prompt
tokens sent through multi-token forwards (``prefill_tokens``), the speed-up ``plain / shared``
measured in the same run, and the largest log-prob difference between the two paths.

Usage::

    python3 benchmarks/presence_cost.py --out benchmarks/results/presence_cost-cpu.json
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from typing import Any

from _shapes import add_generator_args, bench_generator, bench_records

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, rel, write_result


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/presence_cost.py",
        "--model random:llama-3-8b --device cuda --out benchmarks/results/presence_cost-gpu.json",
        note="random:<shape> builds random weights in a model's shape; a hub id works the same.")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--n-questions", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passage-max-tokens", type=int, default=64)
    ap.add_argument("--designs", default="loo,ablate", help="comma-separated subset of loo,ablate")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per path (after one warm-up)")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    ap.add_argument("--data-file", default=None,
                    help="HotpotQA JSONL (default: $RAGKIT_DATA/hotpotqa/dev.jsonl, or $RAGKIT_SHARED_DATA)")
    add_generator_args(ap)
    args = ap.parse_args(argv)
    args.data_file = str(args.data_file or data_path("hotpotqa", "dev.jsonl"))

    import numpy as np
    import torch

    from ragkit.debias.designs import ablate, loo
    from ragkit.generation.layout import ordering_prompts

    logging.basicConfig(level=logging.ERROR)
    gen = bench_generator(args.model, device=args.device, passage_max_tokens=args.passage_max_tokens,
                          batch_size=args.batch_size, show_progress=False)
    recs = bench_records(args.data_file, args.n_questions, args.k)
    qs = [r.question for r in recs]
    ps = [list(r.passages[: args.k]) for r in recs]
    answers = [r.answers[0] for r in recs]
    make = {"loo": lambda: loo(args.k), "ablate": lambda: ablate(args.k, rng=0)}

    def sync() -> None:
        if gen.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(fn: Any) -> tuple[float, Any, int]:
        fn()  # warm-up, untimed
        secs, out = [], None
        for _ in range(args.repeats):
            gen.reset_counters()
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            secs.append(time.perf_counter() - t0)
            tokens = gen.reset_counters()["prefill_tokens"]
        return statistics.median(secs), out, tokens

    rows = []
    for name in [d for d in args.designs.split(",") if d]:
        ods = [make[name]() for _ in recs]
        prompts = ordering_prompts(gen, qs, ps, ods)
        flat_p = [p for pq in prompts for p in pq]
        flat_a = [a for a, pq in zip(answers, prompts) for _ in pq]
        t_plain, plain, tok_plain = timed(lambda fp=flat_p, fa=flat_a: gen.score(fp, fa).sum)
        t_shared, shared, tok_shared = timed(
            lambda o=ods: np.concatenate([r.sum for r in gen.score_orderings(qs, ps, o, answers)]))
        rows.append({"design": name, "interventions_per_q": len(ods[0]), "plain_seconds": t_plain,
                     "shared_seconds": t_shared, "speedup": t_plain / t_shared, "plain_prefill_tokens": tok_plain,
                     "shared_prefill_tokens": tok_shared,
                     "max_abs_logprob_diff": float(np.max(np.abs(plain - shared)))})
    print(f"{'design':<8}{'M/q':>5}{'plain s':>9}{'shared s':>10}{'speed-up':>10}{'plain tok':>11}{'shared tok':>12}"
          f"{'max |diff|':>12}   n={len(recs)}, k={args.k}, {gen.name}, {gen.device}")
    for r in rows:
        print(f"{r['design']:<8}{r['interventions_per_q']:>5}{r['plain_seconds']:>9.2f}{r['shared_seconds']:>10.2f}"
              f"{r['speedup']:>9.2f}x{r['plain_prefill_tokens']:>11}{r['shared_prefill_tokens']:>12}"
              f"{r['max_abs_logprob_diff']:>12.1e}")
    write_result(args.out, {"benchmark": "presence_cost", "data": rel(args.data_file), "n_questions": len(recs),
                            "k": args.k, "passage_max_tokens": args.passage_max_tokens, "model": gen.name,
                            "batch_size": args.batch_size, "repeats": args.repeats,
                            "threads": torch.get_num_threads(), "rows": rows}, device=gen.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
