"""Where should the ranked passages go? Answers from a ``moi_quality.py`` run's rankings, re-placed.

A ``moi_quality.py`` result stores, per question, each method's ranking (passage ids, best first)
and the answer it gave with its own placement (MoI: ``bias_aware``, the calibrated profile's
slot weights ``a_j``: the ``r``-th best passage into the slot with the ``r``-th largest ``a_j``; Lee
et al., NAACL Findings 2025, arXiv 2412.10684). This script takes one method's stored rankings
and answers each question again with every placement in ``--placements``
(``ragkit.debias.placement``: ``none`` = best first, ``reverse``, ``both_ends`` = "lost in the
middle" order of Liu et al., TACL 2024, ``bias_aware``), one greedy answer per (question,
placement), batched, with the run's generator settings (``passage_tokens``, ``max_new_tokens``,
template). No reranking is redone: only the answers change, so each row isolates the placement.

Reported per placement: EM, F1 (and on MS MARCO ROUGE-L, rouge-score and the official protocol),
paired 95% bootstrap intervals against the stored answers of the retriever order (the method
``none``) and
of the method with its own placement, overall and split by MoI's per-query fallback (the
questions where MoI kept the retriever's ranking, so a difference there is placement alone).

Resumable (per question, ``--out`` is rewritten after every batch). Example (the README rows)::

    python3 experiments/moi_lab/placement.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)" \\
        --run experiments/moi_lab/results/moi_quality-qwen-dev-cpu.json --placements none,both_ends \\
        --out experiments/moi_lab/results/placement-qwen-dev-cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from _lab import answer_scores

from ragkit.eval.harness import (
    gpu_epilog,
    model_label,
    rel,
    resolve_recorded,
    study_config,
    study_main,
    write_result,
)
from ragkit.eval.stats import paired_ci

PAIRED = ("em", "f1", "rouge_l", "rouge_l_official")


def summarise(rows: list[dict[str, Any]], placements: list[str]) -> dict[str, Any]:
    """Per group of questions (``all``, ``fallback``: MoI kept the retriever's ranking, ``reranked``):
    the stored answers' means (``retriever``: the method ``none``; ``stored``: the method with its
    own placement) and, per placement, the mean of each answer metric and its paired differences
    against both (``minus_retriever``, ``minus_stored``)."""
    out: dict[str, Any] = {}
    groups = {"all": rows, "fallback": [r for r in rows if r.get("fallback")],
              "reranked": [r for r in rows if not r.get("fallback")]}
    for name, got in groups.items():
        if not got:
            continue
        g: dict[str, Any] = {"n": len(got), "placements": {}}
        for ref in ("retriever", "stored"):
            g[ref] = {key: float(np.mean([r[ref][key] for r in got])) for key in PAIRED
                      if got[0][ref].get(key) is not None}
        for pl in placements:
            vals = [r["placements"][pl] for r in got]
            keys = [key for key in PAIRED if vals[0].get(key) is not None]
            g["placements"][pl] = entry = {key: float(np.mean([v[key] for v in vals])) for key in keys}
            for ref in ("retriever", "stored"):
                entry[f"minus_{ref}"] = {key: paired_ci([v[key] for v in vals], [r[ref][key] for r in got])
                                         for key in keys if got[0][ref].get(key) is not None}
        out[name] = g
    return out


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/moi_lab/placement.py",
        "--model Qwen/Qwen2.5-7B-Instruct --device cuda --run experiments/moi_lab/results/moi_quality-gpu.json "
        "--out experiments/moi_lab/results/placement-gpu.json",
        note="The --run file must come from moi_quality.py with the same --model.")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a moi_quality.py result JSON (its rankings and settings)")
    ap.add_argument("--method", default="moi_loo_q", help="whose stored rankings to re-place (default moi_loo_q)")
    ap.add_argument("--placements", default="none,both_ends",
                    help="comma-separated: none (best first), reverse, both_ends, bias_aware")
    ap.add_argument("--model", default=None, help="the run's generator (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="auto", help="auto (CUDA with bf16 when present, else CPU fp32), cpu, cuda")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=8, help="questions per batched answer call and per checkpoint")
    ap.add_argument("--limit", type=int, default=None, help="only the run's first N questions")
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")

    from ragkit.datasets import detect_format, load_dataset
    from ragkit.debias import PositionProfile
    from ragkit.debias.answerers import SingleAnswerer
    from ragkit.debias.placement import check_placement, place
    from ragkit.generation import Generator

    placements = [check_placement(p.strip()) for p in args.placements.split(",") if p.strip()]
    run = json.loads(open(args.run, encoding="utf-8").read())
    if run.get("benchmark") != "moi_quality":
        raise SystemExit(f"{args.run} is not a moi_quality.py result (benchmark={run.get('benchmark')!r})")
    todo_rows = [r for r in run["per_question"] if args.method in r["methods"] and "none" in r["methods"]]
    if not todo_rows:
        raise SystemExit(f"{args.run} has no question with both 'none' and {args.method!r}; "
                         f"its methods: {sorted({m for r in run['per_question'] for m in r['methods']})}")
    todo_rows = todo_rows[: args.limit]
    data = resolve_recorded(run["data"])
    fmt = detect_format(data)
    records = {r.id: r for r in load_dataset(fmt, data, limit=None)}
    gen = Generator(args.model, device=args.device, passage_max_tokens=run["passage_tokens"],
                    batch_size=args.batch_size, show_progress=False)
    if model_label(gen.name) != run["generator"]:
        raise SystemExit(f"{args.run} was answered by {run['generator']}, not {model_label(gen.name)}: "
                         "pass the run's --model")
    prof = run.get("profile") or {}
    profile = PositionProfile(weights=tuple(prof["weights"]), model=prof.get("model", ""),
                              template=prof.get("template", ""), k=len(prof["weights"])) if prof else None
    if "bias_aware" in placements and profile is None:
        raise SystemExit(f"{args.run} stores no profile: leave bias_aware out of --placements")
    answerer = SingleAnswerer(gen, max_new_tokens=run["max_new_tokens"])

    rows: dict[str, dict[str, Any]] = {}
    if args.resume and os.path.isfile(args.out):
        old = json.loads(open(args.out, encoding="utf-8").read())
        if old.get("run") == rel(args.run) and old.get("method") == args.method:
            rows = {r["id"]: r for r in old["per_question"]}
            print(f"resuming: {len(rows)} questions kept from {args.out}", file=sys.stderr)
    t0 = time.perf_counter()

    def write() -> None:
        done = [rows[r["id"]] for r in todo_rows if r["id"] in rows
                and all(p in rows[r["id"]]["placements"] for p in placements)]
        write_result(args.out, {
            "benchmark": "placement", "run": rel(args.run), "method": args.method, "data": run["data"],
            "order": run.get("order", "given"), "generator": run["generator"],
            "passage_tokens": run["passage_tokens"], "max_new_tokens": run["max_new_tokens"],
            "placements": placements, "questions_done": len(done), "questions": len(todo_rows),
            "seconds": time.perf_counter() - t0, "summary": summarise(done, placements), "per_question": done})

    pending = [r for r in todo_rows if not all(p in rows.get(r["id"], {}).get("placements", {}) for p in placements)]
    for start in range(0, len(pending), args.chunk):
        chunk = pending[start: start + args.chunk]
        jobs: list[tuple[dict[str, Any], str, list[Any]]] = []
        for r in chunk:
            rec = records[r["id"]]
            by_id = {p.id: p for p in rec.passages}
            ranked = [by_id[i] for i in r["methods"][args.method]["ranking"]]
            row = rows.setdefault(r["id"], {
                "id": r["id"], "fallback": bool(r["methods"][args.method].get("fallback")),
                "retriever": {k: r["methods"]["none"].get(k) for k in ("answer", *PAIRED)},
                "stored": {k: r["methods"][args.method].get(k) for k in ("answer", *PAIRED)}, "placements": {}})
            for pl in placements:
                if pl not in row["placements"]:
                    order = place(list(range(len(ranked))), pl, profile)
                    jobs.append((row, pl, [ranked[j] for j in order]))
        results = answerer.answer_many([records[row["id"]].question for row, *_ in jobs], [p for *_, p in jobs])
        for (row, pl, _), res in zip(jobs, results):
            answer = res.answer or ""
            row["placements"][pl] = {"answer": answer, **answer_scores(fmt, answer, list(records[row["id"]].answers))}
        write()
        print(f"{min(start + args.chunk, len(pending))}/{len(pending)} questions", file=sys.stderr)
    write()
    res = json.loads(open(args.out, encoding="utf-8").read())
    for group, g in res["summary"].items():
        print(f"{group} (n={g['n']}): retriever order F1 {g['retriever']['f1']:.3f}, "
              f"{args.method} as stored F1 {g['stored']['f1']:.3f}")
        for pl, e in g["placements"].items():
            parts = []
            for key in ("f1", "rouge_l_official"):
                if key in e:
                    d, s = e["minus_retriever"][key], e["minus_stored"][key]
                    parts.append(f"{key} {e[key]:.3f} (minus retriever order {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}], "
                                 f"minus stored {s[0]:+.3f} [{s[1]:+.3f}, {s[2]:+.3f}])")
            print(f"  {pl:<11}" + "; ".join(parts))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
