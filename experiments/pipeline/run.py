"""Reranking in a real RAG pipeline: retrieve N from a pooled corpus, rerank, put the top K in the prompt.

The study behind ``experiments/pipeline/README.md``. Per question the first stage (BM25 by default)
returns ``N`` candidates from a corpus pooled from every record of the data file and of the
``--pool-file`` record files (HotpotQA dev questions retrieve from the dev and train paragraphs:
5,912 of them), each method reranks the ``N`` and puts its top ``K`` into the prompt, and the
reference generator answers once (:func:`ragkit.eval.runner.run_eval`: the same protocol and the
same per-question JSON as ``ragkit eval --candidates N -k K``).

Two stages, one committed config file each (``configs/``):

* ``--stage select``: **train questions only** (HotpotQA ``train.jsonl``; NQ-open and MS MARCO
  questions disjoint from the dev ones). Runs the config's methods and names the best label-free
  reranker by ``--select-metric`` (ties: fewer tokens prefilled). Its JSON is the evidence a
  frozen dev config cites.
* ``--stage dev``: one frozen config, run once. The config file must be committed and unchanged
  (the JSON records its commit); ``--allow-uncommitted`` exists for smoke tests only.

Run from the repository root, e.g.::

    python3 experiments/pipeline/run.py --config experiments/pipeline/configs/hotpotqa-dev.json \\
        --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import data_path, load_dataset
from ragkit.eval.harness import gpu_epilog, rel, resolve_recorded, study_config, study_main, write_result
from ragkit.eval.runner import EvalConfig, run_eval, select_questions

LABEL_FREE_RERANKERS = ("upr", "icr", "moi", "moi@prune", "moi_masked", "moi_masked@prune", "moi_prior",
                        "psc_borda")
"""Methods that rerank without labels (the candidates for "the best label-free ragkit reranker")."""


def build_parser() -> argparse.ArgumentParser:
    """The study's options (a config file sets any of them; flags override it)."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("experiments/pipeline/run.py",
                          "--config experiments/pipeline/configs/hotpotqa-dev.json --model Qwen/Qwen2.5-7B-Instruct "
                          "--device cuda --out experiments/pipeline/results/hotpotqa-dev-gpu.json",
                          note="A GPU run of a frozen dev config is a dev run of that config: run it once."))
    p.add_argument("--stage", choices=("select", "dev"), default="select",
                   help="select: train questions, names the best reranker; dev: a frozen, committed config, once")
    p.add_argument("--dataset", default="hotpotqa", help="hotpotqa | nq-open | msmarco")
    p.add_argument("--data-file", default="$RAGKIT_DATA/hotpotqa/train.jsonl",
                   help="questions (a path, or relative to $RAGKIT_DATA); its every record is pooled")
    p.add_argument("--pool-file", action="append", default=[],
                   help="more record files whose passages join the corpus (repeatable; adds to a config's list)")
    p.add_argument("--corpus", action="append", default=[], help="corpus JSONL files joining the corpus")
    p.add_argument("--offset", type=int, default=0, help="skip the first N questions of --data-file")
    p.add_argument("--limit", type=int, default=20, help="questions")
    p.add_argument("--retriever", default="bm25", choices=("bm25", "dense", "hybrid"))
    p.add_argument("--candidates", type=int, default=20, help="N: first-stage depth the reranker sees")
    p.add_argument("-k", "--k", type=int, default=3, help="K: passages in the prompt")
    p.add_argument("--methods", default="none,upr,icr,moi,moi@prune",
                   help="comma-separated ragkit eval methods; the first is the baseline of the paired rows")
    p.add_argument("--method-settings", type=json.loads, default={},
                   help='JSON {"method": {"setting": value}} handed to the method (e.g. {"moi": {"blend": 0}})')
    p.add_argument("--model", default=None, help="generator (the reference generator's GGUF path)")
    p.add_argument("--passage-tokens", type=int, default=128, help="cut each passage to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chunk-size", type=int, default=1, help="questions per chunk (1: exact per-question costs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto",
                   help="the generator's weights: auto (fp32 on a CPU, bf16 on CUDA), float32, bfloat16")
    p.add_argument("--select-metric", default="f1", help="select stage: the metric that names the best reranker")
    p.add_argument("--allow-uncommitted", action="store_true",
                   help="dev stage: run a config that is not committed (smoke tests only; the JSON says so)")
    p.add_argument("--out", default=None, help="JSON result (default experiments/pipeline/results/<config>.json)")
    p.add_argument("--quiet", action="store_true")
    return p


def _file(path: str) -> str:
    """A data path: ``$RAGKIT_DATA/...`` resolved, a path as given when it exists, else inside ``$RAGKIT_DATA``."""
    p = Path(resolve_recorded(path))
    return str(p if p.exists() else data_path(*p.parts))


def config_commit(path: str | None) -> tuple[str | None, bool]:
    """``(commit, clean)``: the last commit that touched the config file and whether it is unchanged since."""
    if not path:
        return None, False
    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", path], capture_output=True, text=True,
                                check=True).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", path], capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None, False
    return commit, commit is not None and not dirty


def best_reranker(aggregate: Mapping[str, Mapping[str, Any]], metric: str) -> str | None:
    """The label-free reranker with the highest mean ``metric`` (ties: fewer tokens prefilled per question)."""
    rows = [(m, r) for m, r in aggregate.items() if m in LABEL_FREE_RERANKERS and metric in r]
    if not rows:
        return None

    def key(item: tuple[str, Mapping[str, Any]]) -> tuple[float, float]:
        m, r = item
        return (-float(r[metric]["mean"]), float((r.get("cost_per_question") or {}).get("tokens_prefilled") or 0.0))

    return min(rows, key=key)[0]


def utility_fidelity(outputs: list[dict[str, Any]], exact: str = "moi", approx: str = "moi_masked",
                     k: int = 3) -> dict[str, Any] | None:
    """How well ``approx``'s utilities track ``exact`` leave-one-out, question by question.

    Per question: Spearman's rank correlation of the two utility vectors (candidate order) and the
    top-``k`` agreement ``|top_k(exact) ∩ top_k(approx)| / k``; returns their means, the number of
    questions, and ``None`` when the rows do not hold both methods' utilities.
    """
    from scipy.stats import spearmanr

    by = {(r["method"], r["qid"]): r for r in outputs if r.get("utilities") is not None}
    qids = [q for (m, q) in by if m == exact and (approx, q) in by]
    if not qids:
        return None
    rho, agree = [], []
    for q in qids:
        a, b = by[(exact, q)]["utilities"], by[(approx, q)]["utilities"]
        r = spearmanr(a, b).statistic if len(set(a)) > 1 and len(set(b)) > 1 else float("nan")
        rho.append(float(r))
        top = [sorted(range(len(u)), key=lambda i, u=u: (-u[i], i))[:k] for u in (a, b)]
        agree.append(len(set(top[0]) & set(top[1])) / k)
    return {"exact": exact, "approx": approx, "spearman": float(np.nanmean(rho)) if any(map(np.isfinite, rho))
            else None, f"top{k}_agreement": float(np.mean(agree)), "questions": len(qids)}


STUDY_CONTRASTS = (("moi@prune", "moi"), ("moi_masked@prune", "moi_masked"), ("moi", "upr"),
                   ("moi_masked", "upr"), ("moi_masked", "moi"), ("icr", "upr"))
"""Pairs the page reports beside the headline: prune against plain top K, MoI (exact or masked) against
UPR (what the interventions add), the masked estimator against exact leave-one-out, ICR against UPR."""


def study_contrasts(outputs: list[dict[str, Any]], metrics: list[str], seed: int = 0, n_boot: int = 2000
                    ) -> dict[str, dict[str, list[float]]]:
    """``{"a - b": {metric: [mean, lo, hi]}}`` (paired bootstrap, :func:`ragkit.eval.stats.paired_ci`) for the
    :data:`STUDY_CONTRASTS` whose two methods the run holds, over the questions both answered."""
    from ragkit.eval.stats import paired_ci

    by = {(r["method"], r["qid"]): r for r in outputs}
    out: dict[str, dict[str, list[float]]] = {}
    for a, b in STUDY_CONTRASTS:
        qids = [q for (m, q) in by if m == a and (b, q) in by]
        if not qids:
            continue
        res = {}
        for name in metrics:
            pairs = [(by[(a, q)]["metrics"][name], by[(b, q)]["metrics"][name]) for q in qids
                     if name in by[(a, q)]["metrics"] and name in by[(b, q)]["metrics"]]
            if pairs:
                res[name] = paired_ci([x for x, _ in pairs], [y for _, y in pairs], seed=seed, n_boot=n_boot)
        out[f"{a} - {b}"] = res
    return out


def run(config: Mapping[str, Any]) -> int:
    """Run one stage from its settings (see :func:`build_parser`); writes the JSON and prints the table."""
    args = study_config(build_parser(), config)
    cfg_file = config.get("config")
    commit, clean = config_commit(cfg_file)
    if args.stage == "dev" and not clean and not args.allow_uncommitted:
        raise SystemExit(f"the dev stage runs a frozen config: commit {cfg_file or '(no --config)'} unchanged first "
                         "(or pass --allow-uncommitted for a smoke test, which the JSON records)")
    data_file = _file(args.data_file)
    records = load_dataset(args.dataset, data_file)
    pool = list(records)
    for f in args.pool_file:
        pool += load_dataset(args.dataset, _file(f))
    ecfg = EvalConfig(dataset=args.dataset, data_file=data_file, limit=args.limit, offset=args.offset,
                      retriever=args.retriever, candidates=args.candidates, k=args.k,
                      corpus=tuple(_file(c) for c in args.corpus),
                      methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                      model=args.model, passage_max_tokens=args.passage_tokens, max_new_tokens=args.max_new_tokens,
                      batch_size=args.batch_size, chunk_size=args.chunk_size, seed=args.seed,
                      n_bootstrap=args.bootstrap, device=args.device, method_kwargs=dict(args.method_settings),
                      dtype=args.dtype)
    name = Path(cfg_file).stem if cfg_file else f"{args.dataset}-{args.stage}"
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    eval_out = out.with_suffix(".eval.json")
    before = eval_out.read_bytes() if eval_out.is_file() else None
    t0 = time.perf_counter()
    report = run_eval(ecfg, out=eval_out, records=select_questions(ecfg, records), pool=pool,
                      show_progress=not args.quiet)
    wall, machine = round(time.perf_counter() - t0, 1), None
    if before is not None and eval_out.read_bytes() == before and out.is_file():
        # a finished run started again ran nothing: its JSON keeps the wall time and machine of the run that did
        prev = json.loads(out.read_text(encoding="utf-8"))
        wall, machine = prev.get("wall_seconds", wall), prev.get("machine")
    agg = report["aggregate"]
    result = {
        "study": "pipeline",
        "stage": args.stage,
        "config": rel(cfg_file) if cfg_file else None,
        "config_commit": commit,
        "config_frozen": clean,
        "command": "python3 experiments/pipeline/run.py " + " ".join(getattr(args, "_argv", [])),
        "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "protocol": report["protocol"],
        "generator": report["models"]["generator"],
        "n_questions": report["n_questions"],
        "aggregate": agg,
        "paired": report["paired"],
        "headline": report.get("headline"),
        "fidelity": utility_fidelity(report["outputs"], k=args.k),
        "contrasts": study_contrasts(report["outputs"], [*report["metrics"], *report["ranking_metrics"]],
                                     seed=args.seed, n_boot=args.bootstrap),
        "eval_report": rel(out.with_suffix(".eval.json")),
        "wall_seconds": wall,
    }
    if args.stage == "select":
        result["selected"] = {"metric": args.select_metric, "best_label_free": best_reranker(agg, args.select_metric)}
    if machine is not None:
        result["machine"] = machine  # last, where write_result puts it
    write_result(out, result, device=args.device)
    print(json.dumps({m: {k: (v["mean"] if isinstance(v, dict) and "mean" in v else v)
                          for k, v in r.items() if k in (*report["metrics"], *report["ranking_metrics"])}
                      for m, r in agg.items()}, indent=1))
    if args.stage == "select":
        print(f"best label-free reranker on these train questions by {args.select_metric}: "
              f"{result['selected']['best_label_free']}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python3 experiments/pipeline/run.py --config FILE [flags]``."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
