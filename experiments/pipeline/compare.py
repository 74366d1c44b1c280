"""The headline of the pipeline study: the chosen reranker against every first stage and against UPR.

``run.py`` compares each method with the first stage of its own run (BM25). A user choosing a
reranker compares it with the **best** first stage they could run instead (BM25, dense or hybrid
alone) and with the standard LLM reranker (UPR). This script pairs the per-question rows of
several finished runs on the same questions (each ``results/<config>.eval.json``), and writes one
table: ``reranker - baseline`` for every baseline, on recall@K, nDCG@10 and the dataset's answer
metrics, with paired bootstrap intervals Holm-corrected across **all** of the table's rows
(:func:`ragkit.eval.headline` with explicit pairs), plus each method's cost per question.

The config names the runs (``{"label": "results/....eval.json"}``), the reranker
(``"label:method"``, the one the train-side selection chose) and the baselines. It reads results
only, so it may run after the dev runs; it adds no setting that could be tuned on them: the
reranker was fixed by the selection, and comparing it with every first stage, the best included,
can only make the test harder.

    python3 experiments/pipeline/compare.py --config experiments/pipeline/configs/hotpotqa-headline.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.eval import headline
from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result

HERE = Path(__file__).parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("experiments/pipeline/compare.py", None,
                          note="GPU: not applicable: it reads finished runs' per-question rows and runs no model."))
    p.add_argument("--dataset", default="hotpotqa", help="hotpotqa | nq-open | msmarco (its answer metrics)")
    p.add_argument("--k", type=int, default=3, help="passages in the prompt (recall@K)")
    p.add_argument("--runs", type=json.loads, default={},
                   help='JSON object {"label": "path/to/run.eval.json"} (paths relative to the repository root)')
    p.add_argument("--reranker", default="bm25:moi_masked", help="label:method of the headline reranker")
    p.add_argument("--against", default="bm25:none,dense:none,hybrid:none,bm25:upr",
                   help="comma-separated label:method baselines")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="result JSON (default: results/<config name>.json)")
    return p


def load_rows(runs: Mapping[str, str]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every run's per-question rows, their method renamed ``label:method``, and each method's summary.

    The summary is read from the run's own ``aggregate``: its metric means, cost per question,
    fallback rate and number of questions.
    """
    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, Any]] = {}
    for label, path in runs.items():
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        for r in report["outputs"]:
            rows.append({**r, "method": f"{label}:{r['method']}"})
        for m, agg in report["aggregate"].items():
            summary[f"{label}:{m}"] = {
                "means": {**{k: v["mean"] for k, v in agg.items() if isinstance(v, dict) and "mean" in v},
                          "questions": agg.get("questions")},
                "cost": {"cost_per_question": agg.get("cost_per_question"),
                         "generator_calls_per_question": agg.get("generator_calls_per_question"),
                         "seconds_per_question": agg.get("seconds_per_question"),
                         "fallback_rate": agg.get("fallback_rate"), "questions": agg.get("questions")}}
    return rows, summary


def run(config: Mapping[str, Any]) -> int:
    """Write the headline JSON and print its rows."""
    args = study_config(build_parser(), config)
    against = [a.strip() for a in args.against.split(",") if a.strip()]
    if not args.runs:
        raise SystemExit("no runs: pass --runs '{\"bm25\": \"experiments/pipeline/results/hotpotqa-dev.eval.json\"}'")
    missing = [p for p in args.runs.values() if not Path(p).is_file()]
    if missing:
        raise SystemExit(f"run report(s) not found: {', '.join(missing)}; run their configs first (README: Commands)")
    rows, summary = load_rows(args.runs)
    present = {r["method"] for r in rows}
    absent = [m for m in (args.reranker, *against) if m not in present]
    if absent:
        raise SystemExit(f"no rows for {', '.join(absent)}; the runs hold {', '.join(sorted(present))}")
    qsets = {m: {r["qid"] for r in rows if r["method"] == m} for m in (args.reranker, *against)}
    common = set.intersection(*qsets.values())
    table = headline(rows, args.dataset, [], k=args.k, n_bootstrap=args.bootstrap, seed=args.seed,
                     pairs=[(args.reranker, b) for b in against])
    cfg_file = config.get("config")
    name = Path(cfg_file).stem if cfg_file else f"{args.dataset}-headline"
    out = Path(args.out or HERE / "results" / f"{name}.json")
    result = {"study": "pipeline", "stage": "headline", "config": rel(cfg_file) if cfg_file else None,
              "runs": {k: rel(v) for k, v in args.runs.items()}, "reranker": args.reranker, "against": against,
              "questions_in_common": len(common), "questions_per_method": {m: len(q) for m, q in qsets.items()},
              "means": {m: summary[m]["means"] for m in (args.reranker, *against)},
              "cost": {m: summary[m]["cost"] for m in (args.reranker, *against)}, "headline": table}
    write_result(out, result)
    for r in table["rows"]:
        print(f"{r['contrast']:<32} {r['metric']:<10} {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
              f"Holm [{r['holm_lo']:+.3f}, {r['holm_hi']:+.3f}] p_holm {r['p_holm']:.3f}"
              f"{'  holds' if r['holds'] else ''}")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python3 experiments/pipeline/compare.py --config FILE [flags]``."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
