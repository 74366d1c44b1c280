"""Run the evaluation suite's real jobs and collect their headline numbers and wall times.

Each job is a ``ragkit eval`` command line (run in-process through ``ragkit.cli.main``); its own
report JSON lands next to ``--out``, named with ``--out``'s suffix (``eval-suite-cpu.json`` ->
``eval-hotpotqa-cpu.json``, ``eval-sweep-nq-cpu.json``; ``eval-suite-gpu.json`` -> ``eval-hotpotqa-gpu.json``).
``--model`` and ``--device`` are passed to every job. The summary JSON holds the wall time and the
aggregate metrics of every job.

    nice -n 10 python3 experiments/eval_suite/eval_suite.py --out experiments/eval_suite/results/eval-suite-cpu.json \
        --jobs hotpotqa,msmarco,sweep
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result


def suffix_of(out: str | Path) -> str:
    """The job files' suffix taken from the summary's name: ``eval-suite-gpu.json`` -> ``-gpu``."""
    stem = Path(out).stem
    return stem[len("eval-suite"):] if stem.startswith("eval-suite") else f"-{stem}"


def job_args(name: str, out_dir: Path, limit: int, passage_tokens: int, suffix: str = "-cpu",
             model: str | None = None, device: str = "auto") -> list[str]:
    """The ``ragkit`` argv of a named job; its report is ``out_dir/eval-<job><suffix>.json``."""
    common = ["--passage-max-tokens", str(passage_tokens)]
    gen = ["--device", device] + (["--model", model] if model else [])
    if name == "hotpotqa":
        return ["--quiet", "eval", "--dataset", "hotpotqa", "--data-file", str(data_path("hotpotqa", "dev.jsonl")),
                "--limit", str(limit), "--methods", "none", *common, *gen,
                "--out", str(out_dir / f"eval-hotpotqa{suffix}.json")]
    if name == "msmarco":
        return ["--quiet", "eval", "--dataset", "msmarco", "--data-file",
                str(data_path("msmarco", "qna_v1.1_sample.json")), "--limit", str(limit), "--methods", "none",
                *common, *gen, "--out", str(out_dir / f"eval-msmarco{suffix}.json")]
    if name == "default":
        return ["--quiet", "eval", *gen, "--out", str(out_dir / f"eval-default{suffix}.json")]
    if name == "sweep":
        plot = "docs/img/position_sweep.png" if suffix == "-cpu" else f"docs/img/position_sweep{suffix}.png"
        return ["--quiet", "eval", "sweep", "--data-file", str(data_path("nq_open", "nq-open-oracle.jsonl.gz")),
                "--limit", str(limit), "--k", "10", *common, *gen,
                "--out", str(out_dir / f"eval-sweep-nq{suffix}.json"), "--plot", plot]
    raise ValueError(f"unknown job {name!r}; use hotpotqa, msmarco, default or sweep")


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("experiments/eval_suite/eval_suite.py", "--model Qwen/Qwen2.5-7B-Instruct --device cuda "
                                           "--jobs hotpotqa,msmarco,sweep --limit 100 "
                                           "--out experiments/eval_suite/results/eval-suite-gpu.json"))
    ap.add_argument("--out", required=True,
                    help="summary JSON; its suffix names the job reports (eval-suite-cpu.json -> eval-*-cpu.json)")
    ap.add_argument("--jobs", default="default,hotpotqa,msmarco,sweep")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--passage-tokens", type=int, default=64)
    ap.add_argument("--model", default=None,
                    help="generator: hub id, local folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)

    from ragkit.cli import main as ragkit_main

    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"model": args.model or "embedded SmolLM2-135M-Instruct", "jobs": {}}
    for name in [j.strip() for j in args.jobs.split(",") if j.strip()]:
        argv = job_args(name, out_dir, args.limit, args.passage_tokens, suffix=suffix_of(args.out), model=args.model,
                        device=args.device)
        t0 = time.perf_counter()
        rc = ragkit_main(argv)
        wall = time.perf_counter() - t0
        report_path = Path(argv[argv.index("--out") + 1])
        rep = json.loads(report_path.read_text()) if report_path.exists() else {}
        summary["jobs"][name] = {
            "argv": [rel(x) if x.startswith(("/", "~")) else x for x in argv],
            "rc": rc,
            "wall_seconds": round(wall, 1),
            "aggregate": rep.get("aggregate") or rep.get("summary"),
        }
        print(f"{name:10s} rc={rc} wall={wall:8.1f}s  -> {report_path}")
    write_result(args.out, summary, device=None if args.device == "auto" else args.device)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
