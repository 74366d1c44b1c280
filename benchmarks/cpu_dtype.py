"""Benchmark: the generator in bfloat16 against float32 on a CPU, on the pipeline protocol's work.

``device="auto"`` runs a generator in fp32 on a CPU, the safe default (every CPU has fp32 kernels;
bf16 is slow where the CPU lacks bf16 instructions). CPUs with AVX512-BF16 or AMX (Intel Cooper
Lake and later, AMD Zen 4 and later) multiply bf16 matrices several times faster, and
``Generator(dtype="bfloat16")`` uses them. This script measures what that buys and what it moves,
on the work the pipeline study does: HotpotQA dev questions, BM25 over the pooled train + dev
paragraphs -> N = 20 candidates -> each method ranks -> the top K = 3 go into the prompt -> one
answer of at most 16 tokens (``ragkit.eval.run_eval``, the same code as ``ragkit eval``).

The two dtypes run the same questions one after the other (fp32 first) with ``chunk_size=1`` and
one answer per question, so each row's seconds are that question's own; each dtype first runs
``--warmup`` other questions, not reported (the first calls pick kernels and are several times
slower). Reported per method:
seconds per question in each dtype and their ratio; the rankings' agreement (the same top K as a
set, the per-question Spearman of the two rankings) and the share of identical answers, with the
answer metric of each. Time it on idle cores: a second job on the CPU changes both columns.

``--sweep N`` adds what the CORD study's primary metric sees: the position sweep
(``ragkit.eval.sweep.position_sweep``, k = 10, the gold passage at slots 1/3/6/8/10, log-probs
only) on ``N`` NQ-open questions from row ``--sweep-offset`` in both dtypes; per context the gold
answer's mean token log-prob, and per question its spread over the slots (max - min): the mean
absolute fp32 - bf16 difference of each and the spreads' correlation, beside the mean spread
itself (the size of the effect the difference must stay small against).

``--students N`` times the one-pass students' training instead (``ragkit distill``'s three recipes,
``bf16=False`` against ``bf16=True``: bfloat16 autocast with fp32 weights) for ``--student-epochs``
on the first ``N`` questions of the committed gold-passage labels (20 BM25 candidates each), and
reports seconds, the ratio and the final training loss of each.

    python3 benchmarks/cpu_dtype.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)" \\
        --questions 3 --out benchmarks/results/cpu-dtype-cpu.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragkit.datasets import data_path, load_dataset  # noqa: E402
from ragkit.eval.harness import gpu_epilog, machine_info, write_result  # noqa: E402
from ragkit.eval.runner import EvalConfig, run_eval  # noqa: E402
from ragkit.eval.sweep import position_sweep  # noqa: E402


def spearman(a: list[str], b: list[str]) -> float:
    """Spearman's rho of two rankings of the same items (1 = the same order)."""
    n = len(a)
    if n < 2:
        return 1.0
    pos = {x: i for i, x in enumerate(b)}
    d = np.array([i - pos[x] for i, x in enumerate(a)], dtype=float)
    return float(1.0 - 6.0 * (d ** 2).sum() / (n * (n * n - 1)))


def compare(rows32: list[dict[str, Any]], rows16: list[dict[str, Any]], methods: list[str], k: int,
            metric: str) -> list[dict[str, Any]]:
    """Per method: seconds per question in each dtype, their ratio, and how far bf16 moves the outputs."""
    out = []
    for m in methods:
        a = {r["qid"]: r for r in rows32 if r["method"] == m}
        b = {r["qid"]: r for r in rows16 if r["method"] == m}
        qids = sorted(a)
        s32 = float(np.mean([a[q]["seconds"] for q in qids]))
        s16 = float(np.mean([b[q]["seconds"] for q in qids]))
        out.append({
            "method": m, "n": len(qids), "fp32_s": round(s32, 2), "bf16_s": round(s16, 2),
            "speedup": round(s32 / s16, 2) if s16 > 0 else None,
            "same_top_k_set": float(np.mean([set(a[q]["ranking"][:k]) == set(b[q]["ranking"][:k]) for q in qids])),
            "spearman": float(np.mean([spearman(a[q]["ranking"], b[q]["ranking"]) for q in qids])),
            "same_answer": float(np.mean([a[q]["prediction"].strip() == b[q]["prediction"].strip() for q in qids])),
            f"{metric}_fp32": float(np.mean([a[q]["metrics"].get(metric, np.nan) for q in qids])),
            f"{metric}_bf16": float(np.mean([b[q]["metrics"].get(metric, np.nan) for q in qids])),
        })
    return out


def sweep_agreement(a: Any, b: Any, seconds: dict[str, float]) -> dict[str, Any]:
    """How far bf16 moves the sweep's gold-answer log-probs (``a``: fp32, ``b``: bf16 :class:`SweepResult`)."""
    def by_context(res: Any) -> dict[tuple[str, int], float]:
        return {(r["qid"], r["slot"]): float(r["logprob"]) for r in res.per_question
                if r.get("setting") == "slot" and r.get("logprob") is not None}

    la, lb = by_context(a), by_context(b)
    keys = sorted(set(la) & set(lb))
    diff = np.array([la[k] - lb[k] for k in keys])
    sa, sb = a.per_question_metrics[10], b.per_question_metrics[10]
    qs = sorted(q for q in sa if q in sb and np.isfinite(sa[q]["logprob_spread"])
                and np.isfinite(sb[q]["logprob_spread"]))
    x = np.array([sa[q]["logprob_spread"] for q in qs])
    y = np.array([sb[q]["logprob_spread"] for q in qs])
    return {"contexts": len(keys), "questions": len(qs),
            "logprob_mean_abs_diff": round(float(np.abs(diff).mean()), 4),
            "logprob_max_abs_diff": round(float(np.abs(diff).max()), 4),
            "spread_fp32_mean": round(float(x.mean()), 4), "spread_bf16_mean": round(float(y.mean()), 4),
            "spread_mean_abs_diff": round(float(np.abs(x - y).mean()), 4),
            "spread_correlation": round(float(np.corrcoef(x, y)[0, 1]), 4) if len(qs) > 2 else None,
            "seconds": seconds,
            "speedup": round(seconds["float32"] / seconds["bfloat16"], 2) if seconds.get("bfloat16") else None}


def time_students(n: int, epochs: float) -> list[dict[str, Any]]:
    """Seconds of one training of each student recipe in fp32 and under bf16 autocast (same labels, seed)."""
    from ragkit.training.bi_encoder import train_bi_encoder
    from ragkit.training.distill import train_residual_student, train_student
    from ragkit.training.labels import read_labels

    labs = read_labels(ROOT / "experiments" / "distill" / "results" / "hotpotqa-train-bm25-20-passages.jsonl.gz")[:n]
    trainers = {"cross-encoder": (train_student, {}), "residual": (train_residual_student, {}),
                "bi-encoder": (train_bi_encoder, {"batch_size": 16})}
    rows = []
    for name, (fn, kw) in trainers.items():
        row: dict[str, Any] = {"recipe": name, "questions": len(labs), "epochs": epochs}
        for bf16 in (False, True):
            res = fn(labs, None, epochs=epochs, seed=0, device="cpu", show_progress=False, bf16=bf16, **kw)
            key = "bf16" if bf16 else "fp32"
            row[f"{key}_s"] = round(float(res.seconds), 1)
            row[f"{key}_final_loss"] = getattr(res, "final_loss", None)
        row["speedup"] = round(row["fp32_s"] / row["bf16_s"], 2)
        print(row)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=gpu_epilog(
        "benchmarks/cpu_dtype.py", None,
        note="GPU: not applicable. A CPU measurement: on a GPU device='auto' runs bf16 already."),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="generator (default: the embedded SmolLM2 GGUF)")
    p.add_argument("--questions", type=int, default=3,
                   help="HotpotQA dev questions (default 3; 0: only the --sweep check)")
    p.add_argument("--offset", type=int, default=0, help="skip the first dev questions")
    p.add_argument("--warmup", type=int, default=1,
                   help="questions run first in each dtype and not reported (kernel selection, caches; default 1)")
    p.add_argument("--methods", default="none,upr,moi_masked", help="comma-separated eval methods")
    p.add_argument("--sweep", type=int, default=0, help="NQ-open questions for the position-sweep check (0: none)")
    p.add_argument("--sweep-offset", type=int, default=100,
                   help="first NQ-open row of the sweep check (default 100: rows no evaluation of ragkit reports)")
    p.add_argument("--students", type=int, default=0,
                   help="time the students' training on this many labelled questions (0: not)")
    p.add_argument("--student-epochs", type=float, default=1.0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu-dtype-cpu.json"))
    args = p.parse_args(argv)

    import torch

    from ragkit.generation import Generator

    methods = [m for m in args.methods.split(",") if m]
    dev = load_dataset("hotpotqa", data_path("hotpotqa/dev.jsonl"))
    pool = [*dev, *load_dataset("hotpotqa", data_path("hotpotqa/train.jsonl"))]
    start = args.offset + args.warmup
    warm, qs = dev[args.offset:start], dev[start:start + args.questions]
    reports: dict[str, dict[str, Any]] = {}
    sweeps: dict[str, Any] = {}
    sweep_s: dict[str, float] = {}
    load_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("float32", "bfloat16") if qs or args.sweep else ():
            t0 = time.perf_counter()
            gen = Generator(args.model, device="cpu", dtype=dtype, show_progress=False)
            load_s[dtype] = round(time.perf_counter() - t0, 1)
            if qs:
                cfg = EvalConfig(dataset="hotpotqa", data_file=str(data_path("hotpotqa/dev.jsonl")),
                                 limit=args.questions, offset=start, retriever="bm25", candidates=20, k=3,
                                 methods=tuple(methods), model=args.model, max_new_tokens=16, chunk_size=1,
                                 n_bootstrap=10, device="cpu", dtype=dtype, method_kwargs={"moi_masked": {"blend": 0}})
                if warm:
                    run_eval(cfg, out=Path(tmp) / f"warmup-{dtype}.json", records=warm, pool=pool, generator=gen,
                             show_progress=False, resume=False)
                reports[dtype] = run_eval(cfg, out=Path(tmp) / f"{dtype}.json", records=qs, pool=pool,
                                          generator=gen, show_progress=False, resume=False)
            if args.sweep:
                nq = load_dataset("nq-open", data_path("nq_open/nq-open-oracle.jsonl.gz"))
                t1 = time.perf_counter()
                sweeps[dtype] = position_sweep(gen, nq[args.sweep_offset:args.sweep_offset + args.sweep], k=10,
                                               slots=[0, 2, 5, 7, 9], pool=nq, seed=0, generate=False,
                                               show_progress=False)
                sweep_s[dtype] = round(time.perf_counter() - t1, 1)
            del gen
    rows = compare(reports["float32"]["outputs"], reports["bfloat16"]["outputs"], methods, 3, "f1") if reports else []
    cols = ["method", "n", "fp32_s", "bf16_s", "speedup", "same_top_k_set", "spearman", "same_answer",
            "f1_fp32", "f1_bf16"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    students = time_students(args.students, args.student_epochs) if args.students else None
    sweep_check = sweep_agreement(sweeps["float32"], sweeps["bfloat16"], sweep_s) if sweeps else None
    if sweep_check:
        print("position sweep (k = 10, log-probs): " + ", ".join(f"{k} {v}" for k, v in sweep_check.items()
                                                              if not isinstance(v, (list, dict))))
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    write_result(args.out, {
        "benchmark": "cpu_dtype", "command": "python3 " + " ".join(sys.argv),
        "model": args.model or "embedded SmolLM2-135M-Instruct", "questions": [r.id for r in qs],
        "warmup_questions": [r.id for r in warm],
        "protocol": "HotpotQA dev, BM25 over the pooled train + dev paragraphs -> 20 -> rank -> top 3 -> "
                    "answer <= 16 tokens",
        "load_seconds": load_s, "rows": rows, "sweep": sweep_check, "students": students,
        "cpu_flags": sorted({f for f in flags if f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2")}),
        "torch_threads": torch.get_num_threads(),
        "outputs": {d: r["outputs"] for d, r in reports.items()},
        "sweep_rows": {d: r.per_question for d, r in sweeps.items()},
        "machine": machine_info("cpu"),
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
