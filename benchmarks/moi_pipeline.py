"""End-to-end MoI cost: the default consensus MoI before (former path) and after one prefill per ordering.

For each HotpotQA dev question (k passages, bodies cut to ``--passage-max-tokens``), the default
MoI (``consensus`` outcome, bias-aware placement, final answer) runs with the cyclic design
(M = k) and the prior design (M = 3), twice:

* ``before`` (the generic ``run_orderings_by_parts``): each ordering's prompt is generated from (one
  batched ``generate``), then prefilled again to score the consensus answer (``score``);
* ``after`` (the local ``Generator.run_orderings``): each ordering's prompt is prefilled once
  (``Generator.run_orderings``: shared prefix once, the answer decoded from that cache, the
  consensus answer scored as a continuation of it), and the final answer is reused when the chosen
  order is one of the orderings run.

Reported per design: seconds per query, real (non-pad) tokens sent through multi-token forwards
(``prefill_tokens``; decode steps are counted apart), and

    prefill_tokens_ratio = prefill_tokens / (shared prefix + Σ_m distinct tokens of ordering m + final prompt)

(the floor: the instruction + question once, each ordering's own passage tokens once, the final
prompt once), whether both paths give identical outputs (rankings, final order, final answer,
per-ordering answers) and the largest utility difference.

Usage::

    python benchmarks/moi_pipeline.py --out benchmarks/results/moi_pipeline-cpu.json --n-questions 5 --k 10
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from _shapes import add_generator_args, bench_generator, bench_records

from ragkit.datasets import data_path
from ragkit.eval.harness import cpu_name, gpu_epilog, rel, write_result


class _ByParts:
    """A generator with the generic ``run_orderings`` (generate, then score): the path before one
    prefill per ordering."""

    def __init__(self, gen: Any) -> None:
        self._gen = gen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gen, name)

    def run_orderings(self, *args: Any, **kwargs: Any) -> Any:
        from ragkit.generation.layout import run_orderings_by_parts

        return run_orderings_by_parts(self, *args, **kwargs)


def floor_tokens(gen: Any, question: str, passages: list, orderings: list[list[int]], order: list[int]) -> int:
    """Shared prefix + each ordering's distinct tokens + the final prompt."""
    from ragkit.generation.fitting import encode_prompts
    from ragkit.generation.layout import ordering_prompts
    from ragkit.generation.scoring import common_prefix_len

    prompts = ordering_prompts(gen, [question], [passages], [orderings])[0]
    ids = encode_prompts(gen.tokenizer, prompts)
    lcp = common_prefix_len(ids) if len(ids) > 1 else 0
    final = encode_prompts(gen.tokenizer, [gen.build_prompt(question, [passages[i] for i in order])])[0]
    return lcp + sum(len(p) - lcp for p in ids) + len(final)


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/moi_pipeline.py",
        "--model random:llama-3-8b --device cuda --n-questions 5 --out "
        "benchmarks/results/moi_pipeline-gpu.json",
        note="random:<shape> builds random weights in a model's shape; a hub id works the same.")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--n-questions", type=int, default=5)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passage-max-tokens", type=int, default=60)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--data-file", default=None,
                    help="HotpotQA JSONL (default: $RAGKIT_DATA/hotpotqa/dev.jsonl from the repository root, "
                         "or $RAGKIT_SHARED_DATA/hotpotqa/dev.jsonl)")
    add_generator_args(ap)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--designs", default="cyclic,prior", help="comma-separated subset of cyclic,prior")
    ap.add_argument("--max-seconds", type=float, default=480.0,
                    help="stop adding questions once this much time is spent (at least one question runs)")
    args = ap.parse_args(argv)
    args.data_file = str(args.data_file or data_path("hotpotqa", "dev.jsonl"))

    import numpy as np
    import torch

    from ragkit.debias.moi import MoI
    from ragkit.debias.profile import PositionProfile

    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(args.threads)
    gen = bench_generator(args.model, device=args.device, passage_max_tokens=args.passage_max_tokens,
                          batch_size=args.k, show_progress=False)
    records = bench_records(args.data_file, args.n_questions, args.k)
    profile = PositionProfile.recency(args.k)  # the same fixed profile for both paths (no calibration)
    all_designs = {"cyclic": {"design": "cyclic", "budget": None}, "prior": {"design": "prior", "budget": 3}}
    designs = {d: all_designs[d] for d in args.designs.split(",") if d}

    def run(path: str, kw: dict[str, Any], rec: Any) -> tuple[Any, float, dict[str, int]]:
        moi = MoI.from_settings(gen if path == "after" else _ByParts(gen), profile=profile,
                                max_new_tokens=args.max_new_tokens, **kw)
        gen.reset_counters()
        if gen.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = moi.run(rec.question, list(rec.passages[: args.k]))
        if gen.device.startswith("cuda"):
            torch.cuda.synchronize()
        return res, time.perf_counter() - t0, gen.reset_counters()

    gen.answer([records[0].question], [list(records[0].passages[:2])], max_new_tokens=2)  # warm-up, not timed
    if gen.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    out: dict[str, Any] = {
        "benchmark": "moi_pipeline",
        "model": gen.name,
        "device": f"cpu: {cpu_name()}" if gen.device == "cpu" else f"{gen.device}: {torch.cuda.get_device_name()}",
        "torch_threads": args.threads,
        "data": rel(args.data_file),
        "n_questions": 0,
        "k": args.k,
        "passage_max_tokens": args.passage_max_tokens,
        "max_new_tokens": args.max_new_tokens,
        "outcome": "consensus",
        "placement": "bias_aware",
        "profile": "recency (fixed, both paths)",
        "prefill_tokens": "real (non-pad) input tokens of multi-token forwards (prompt prefills and answer scoring)",
        "floor_tokens": "shared prefix + each ordering's distinct tokens + the final prompt",
        "designs": {},
    }
    def summarise(done: int, final: bool) -> None:
        out["n_questions"] = done
        for name, acc in accs.items():
            n = done
            out["designs"][name] = {
                "M": acc["M"],
                "before_s_per_query": acc["before_s"] / n,
                "after_s_per_query": acc["after_s"] / n,
                "speedup_vs_before": acc["before_s"] / acc["after_s"],
                "prefill_tokens_before_per_query": acc["before_tokens"] / n,
                "prefill_tokens_after_per_query": acc["after_tokens"] / n,
                "decode_tokens_before_per_query": acc["before_decode"] / n,
                "decode_tokens_after_per_query": acc["after_decode"] / n,
                "floor_tokens_per_query": acc["floor"] / n,
                "prefill_tokens_ratio_before": acc["before_tokens"] / acc["floor"],
                "prefill_tokens_ratio": acc["after_tokens"] / acc["floor"],
                "generator_calls_before_per_query": acc["before_calls"] / n,
                "generator_calls_after_per_query": acc["after_calls"] / n,
                "final_answer_reused": acc["final_reused"],
                "identical_outputs": acc["identical"] == n,
                "n_identical": acc["identical"],
                "max_abs_utility_diff": acc["max_utility_diff"],
            }
        cyc = out["designs"].get("cyclic") or next(iter(out["designs"].values()))
        out["consensus_speedup_vs_before"] = cyc["speedup_vs_before"]
        out["prefill_tokens_ratio"] = max(d["prefill_tokens_ratio"] for d in out["designs"].values())
        if gen.device.startswith("cuda"):
            out["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["identical_outputs"] = all(d["identical_outputs"] for d in out["designs"].values())
        out["targets"] = {"prefill_tokens_ratio <= 1.15": out["prefill_tokens_ratio"] <= 1.15,
                          "consensus_speedup_vs_before >= 1.7": out["consensus_speedup_vs_before"] >= 1.7}
        if not final:
            write_result(args.out, out)
            return
        print(f"moi_pipeline: {gen.name}, {out['device']}, {args.threads} threads, n={done}, k={args.k}")
        print(f"{'design':7} {'M':>3} {'before s/q':>10} {'after s/q':>9} {'speedup':>8} {'prefill before':>14} "
              f"{'prefill after':>13} {'floor':>7} {'ratio':>6} {'identical':>9}")
        for name, d in out["designs"].items():
            print(f"{name:7} {d['M']:>3} {d['before_s_per_query']:>10.2f} {d['after_s_per_query']:>9.2f} "
                  f"{d['speedup_vs_before']:>8.2f} {d['prefill_tokens_before_per_query']:>14.0f} "
                  f"{d['prefill_tokens_after_per_query']:>13.0f} {d['floor_tokens_per_query']:>7.0f} "
                  f"{d['prefill_tokens_ratio']:>6.3f} {d['n_identical']:>6}/{done}")
        write_result(args.out, out)

    t_all = time.perf_counter()
    accs: dict[str, dict[str, Any]] = {
        name: {"before_s": 0.0, "after_s": 0.0, "before_tokens": 0, "after_tokens": 0, "before_decode": 0,
               "after_decode": 0, "floor": 0, "identical": 0, "max_utility_diff": 0.0, "final_reused": 0,
               "before_calls": 0, "after_calls": 0, "M": 0}
        for name in designs}
    done = 0
    for qi, rec in enumerate(records):
        if done and time.perf_counter() - t_all > args.max_seconds:
            break
        for name, kw in designs.items():
            acc = accs[name]
            # alternate which path runs first so that warm caches favour neither
            paths = ("before", "after") if qi % 2 == 0 else ("after", "before")
            got = {p: run(p, kw, rec) for p in paths}
            (rb, tb, cb), (ra, ta, ca) = got["before"], got["after"]
            acc["M"] = len(ra.orderings)
            acc["before_s"] += tb
            acc["after_s"] += ta
            acc["before_tokens"] += cb["prefill_tokens"]
            acc["after_tokens"] += ca["prefill_tokens"]
            acc["before_decode"] += cb["decode_tokens"]
            acc["after_decode"] += ca["decode_tokens"]
            acc["before_calls"] += rb.generator_calls
            acc["after_calls"] += ra.generator_calls
            acc["floor"] += floor_tokens(gen, rec.question, list(rec.passages[: args.k]), ra.orderings, ra.order)
            same = ([h.passage.id for h in rb.ranking] == [h.passage.id for h in ra.ranking]
                    and rb.order == ra.order and rb.answer == ra.answer
                    and rb.ordering_answers == ra.ordering_answers and rb.target == ra.target)
            acc["identical"] += int(same)
            acc["max_utility_diff"] = max(acc["max_utility_diff"],
                                          float(np.max(np.abs(np.asarray(rb.utilities) - np.asarray(ra.utilities)))))
            acc["final_reused"] += int(ra.generator_calls < rb.generator_calls)
            print(f"{name} question {qi + 1}/{len(records)}: before {tb:.2f} s, after {ta:.2f} s, "
                  f"identical={same} ({time.perf_counter() - t_all:.0f} s)", file=sys.stderr)
        done += 1
        summarise(done, False)  # partial results survive an interrupted run
    summarise(done, True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
