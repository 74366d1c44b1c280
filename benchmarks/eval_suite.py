"""Run the evaluation suite's real jobs and collect their headline numbers and wall times.

Each job is a ``ragkit eval`` command line (run in-process through ``ragkit.cli.main``); its own
report JSON lands next to ``--out`` (``eval-<job>-cpu.json``). The summary JSON holds the wall
time and the aggregate metrics of every job.

    nice -n 10 python3 benchmarks/eval_suite.py --out benchmarks/results/eval-suite-cpu.json \
        --jobs hotpotqa,msmarco,sweep
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from _harness import rel, shared_data, write_result


def job_args(name: str, out_dir: Path, limit: int, passage_tokens: int) -> list[str]:
    """The ``ragkit`` argv of a named job."""
    common = ["--passage-max-tokens", str(passage_tokens)]
    if name == "hotpotqa":
        return ["--quiet", "eval", "--dataset", "hotpotqa", "--data-file", str(shared_data("hotpotqa", "dev.jsonl")),
                "--limit", str(limit), "--methods", "none", *common, "--out", str(out_dir / "eval-hotpotqa-cpu.json")]
    if name == "msmarco":
        return ["--quiet", "eval", "--dataset", "msmarco", "--data-file",
                str(shared_data("msmarco", "qna_v1.1_sample.json")),
                "--limit", str(limit), "--methods", "none", *common, "--out", str(out_dir / "eval-msmarco-cpu.json")]
    if name == "default":
        return ["--quiet", "eval", "--out", str(out_dir / "eval-default-cpu.json")]
    if name == "sweep":
        return ["--quiet", "eval", "sweep", "--data-file", str(shared_data("nq_open", "nq-open-oracle.jsonl.gz")),
                "--limit", str(limit), "--k", "10", *common, "--out", str(out_dir / "eval-sweep-nq-cpu.json"),
                "--plot", "docs/img/position_sweep.png"]
    raise ValueError(f"unknown job {name!r}; use hotpotqa, msmarco, default or sweep")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="summary JSON")
    ap.add_argument("--jobs", default="default,hotpotqa,msmarco,sweep")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--passage-tokens", type=int, default=64)
    args = ap.parse_args()

    from ragkit.cli import main as ragkit_main

    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"machine": "shared CPU", "jobs": {}}
    for name in [j.strip() for j in args.jobs.split(",") if j.strip()]:
        argv = job_args(name, out_dir, args.limit, args.passage_tokens)
        t0 = time.perf_counter()
        rc = ragkit_main(argv)
        wall = time.perf_counter() - t0
        report_path = Path(argv[argv.index("--out") + 1])
        rep = json.loads(report_path.read_text()) if report_path.exists() else {}
        summary["jobs"][name] = {
            "argv": [rel(x) if x.startswith("/") else x for x in argv],
            "rc": rc,
            "wall_seconds": round(wall, 1),
            "aggregate": rep.get("aggregate") or rep.get("summary"),
        }
        print(f"{name:10s} rc={rc} wall={wall:8.1f}s  -> {report_path}")
    write_result(args.out, summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
