"""Benchmark: MoI distilled into a one-pass cross-encoder, on HotpotQA dev.

For each dev question the 10 distractor-setting paragraphs are first ordered by BM25 (a
per-question index; the "retriever order"). Then each method reranks them, the generator
answers once from the method's prompt order, and we record:

* gold-paragraph MRR@10 and recall@2 of the method's ranking;
* answer EM / F1 (SQuAD normalisation, HotpotQA convention) of the single final answer;
* forward passes per query (generator sequences; encoder passes for the student) and seconds
  per query, split into reranking and the final answer.

Methods: ``retriever`` (BM25 order), ``moi`` (MoI's default: leave-one-out interventions, the
label-free question-likelihood outcome, blended with the BM25 scores), ``moi_cyclic`` (MoI, cyclic
design, label-free consensus outcome, M = k), ``moi_prior`` (MoI, prior design, M = 3, consensus)
and ``student`` (the distilled cross-encoder). MoI and the student both place passages with MoI's
bias-aware placement (best passage into the heaviest slot of ``--profile``, default the recency
profile). "Gain kept" compares the student with ``--teacher`` (the MoI method it stands in for).
``--ranking-only-n`` also scores the dataset's given order, which the student ranks exactly as it
ranks the BM25 order (a cross-encoder scores each passage alone).

Per-(method, question) results are cached in a JSONL file, so the script is resumable and
methods can be run in separate invocations (e.g. MoI while the labels are still being made)::

    python experiments/distill/distill.py --methods retriever,moi_cyclic,moi_prior --n-dev 12 \\
        --cache /tmp/distill-cache.jsonl --out /tmp/partial.json
    python experiments/distill/distill.py --methods student --student students/minilm-moi \\
        --labels labels.jsonl --n-dev 12 --cache /tmp/distill-cache.jsonl \\
        --out experiments/distill/results/distill-cpu.json

With ``--train`` the student is trained on ``--labels`` first (and saved to ``--student``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result
from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci
from ragkit.training.labels import label_references

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ragkit.datasets import load_hotpotqa  # noqa: E402
from ragkit.eval.metrics import exact_match_max, f1_max, ir_metrics  # noqa: E402
from ragkit.io import append_jsonl, read_appended_jsonl  # noqa: E402
from ragkit.types import Passage, QARecord, RankedList  # noqa: E402

logger = logging.getLogger("benchmarks.distill")

METHODS = ("retriever", "moi", "moi_cyclic", "moi_prior", "student")


def bm25_order(rec: QARecord) -> RankedList:
    """The question's paragraphs ordered by a per-question BM25 index (ties: given order)."""
    from ragkit.retrievers import BM25Retriever

    r = BM25Retriever(show_progress=False).index(list(rec.passages))
    return r.search([rec.question], k=len(rec.passages))[0]


def _cached(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    if not path.exists():
        return {}
    return {(r["method"], r["qid"]): r for r in read_appended_jsonl(path)}


def _answer(generator: Any, recs: list[QARecord], orders: list[list[Passage]]) -> tuple[list[str], float]:
    t0 = time.perf_counter()
    answers = generator.answer([r.question for r in recs], orders)
    return answers, time.perf_counter() - t0


def run_method(
    method: str,
    recs: list[QARecord],
    retr: dict[str, RankedList],
    generator: Any,
    student: Any,
    batch: int,
    profile: Any = None,
) -> list[dict[str, Any]]:
    """Run one method on ``recs`` in batches; one result row per question (``profile``: the
    :class:`~ragkit.debias.PositionProfile` of MoI and of the student's placement; None: recency)."""
    from ragkit.debias import MoI, PositionProfile
    from ragkit.debias.placement import place
    from ragkit.debias.presets import moi_settings

    rows: list[dict[str, Any]] = []
    for i in range(0, len(recs), batch):
        part = recs[i : i + batch]
        ps = [retr[r.id].passages() for r in part]
        sc = [retr[r.id].scores() for r in part]
        t0 = time.perf_counter()
        if method == "retriever":
            rankings = [retr[r.id] for r in part]
            orders = ps
            calls = [0] * len(part)
            enc = [0] * len(part)
        elif method in ("moi", "moi_cyclic", "moi_prior"):
            moi = MoI.from_settings(generator, profile=profile, **moi_settings(method))  # the library's presets
            res = moi.run_batch([r.question for r in part], ps, sc, None, generate_answer=False)
            rankings = [x.ranking for x in res]
            orders = [[p[j] for j in x.order] for p, x in zip(ps, res)]
            calls = [int(x.generator_calls) for x in res]
            enc = [0] * len(part)
        elif method == "student":
            rankings = student.rank_many([r.question for r in part], ps)
            orders = []
            for p, rl in zip(ps, rankings):
                pos = {q.id: j for j, q in enumerate(p)}
                # a question may have fewer passages than the profile's k: place() resizes a profile
                prof = profile if profile is not None else PositionProfile.recency(len(p))
                order = place([pos[h.passage.id] for h in rl], "bias_aware", prof)
                orders.append([p[j] for j in order])
            calls = [0] * len(part)
            enc = [len(p) for p in ps]
        else:
            raise ValueError(f"unknown method {method!r}; choose from {METHODS}")
        rerank_s = time.perf_counter() - t0
        answers, answer_s = _answer(generator, part, orders)
        for r, rl, order, a, c, e in zip(part, rankings, orders, answers, calls, enc):
            rows.append(
                {
                    "method": method,
                    "qid": r.id,
                    "ranking": rl.ids(),
                    "order": [p.id for p in order],
                    "answer": a,
                    "rerank_s": rerank_s / len(part),
                    "answer_s": answer_s / len(part),
                    "generator_calls": c + 1,  # + the final answer
                    "encoder_passes": e,
                }
            )
        logger.info("%s: %d/%d questions", method, i + len(part), len(recs))
    return rows


def summarise(method: str, rows: list[dict[str, Any]], recs: dict[str, QARecord]) -> dict[str, Any]:
    """Mean metrics and costs of one method."""
    qrels = {r["qid"]: list(recs[r["qid"]].gold_ids) for r in rows}
    run = {r["qid"]: {pid: float(len(r["ranking"]) - i) for i, pid in enumerate(r["ranking"])} for r in rows}
    ir = ir_metrics(qrels, run, ("mrr@10", "recall@2"))
    em = [exact_match_max(r["answer"], recs[r["qid"]].answers) for r in rows]
    f1 = [f1_max(r["answer"], recs[r["qid"]].answers) for r in rows]
    return {
        "method": method,
        "n": len(rows),
        "mrr@10": ir["mrr@10"],
        "recall@2": ir["recall@2"],
        "em": float(np.mean(em)),
        "f1": float(np.mean(f1)),
        "generator_calls_per_query": float(np.mean([r["generator_calls"] for r in rows])),
        "encoder_passes_per_query": float(np.mean([r["encoder_passes"] for r in rows])),
        "rerank_s_per_query": float(np.mean([r["rerank_s"] for r in rows])),
        "answer_s_per_query": float(np.mean([r["answer_s"] for r in rows])),
        "total_s_per_query": float(np.mean([r["rerank_s"] + r["answer_s"] for r in rows])),
    }


def per_question(rows: list[dict[str, Any]], recs: dict[str, QARecord]) -> dict[str, list[float]]:
    """Per-question MRR@10 and F1 of one method's rows (for paired intervals between methods)."""
    return {
        "mrr@10": [rank_metrics(r["ranking"], recs[r["qid"]].gold_ids)[0] for r in rows],
        "f1": [f1_max(r["answer"], recs[r["qid"]].answers) for r in rows],
    }


def paired_comparisons(per_q: dict[str, dict[str, list[float]]], teacher: str) -> dict[str, dict[str, list[float]]]:
    """``"a - b" -> {metric: [mean difference, low, high]}`` (paired 95% bootstrap) for the
    teacher and the student against the retriever's order, and the student against the teacher."""
    pairs = [(teacher, "retriever"), ("student", "retriever"), ("student", teacher)]
    return {f"{a} - {b}": {m: paired_ci(per_q[a][m], per_q[b][m]) for m in per_q[a]}
            for a, b in pairs if a in per_q and b in per_q and a != b}


def _kept(student: float, base: float, teacher: float) -> float | None:
    """Share of the teacher's gain over the base kept by the student, ``(s - b) / (t - b)``.

    ``None`` when the teacher did not beat the base (``t <= b``): there is no gain to keep, and
    the ratio of two negative differences would read as a large "kept" share.
    """
    gain = teacher - base
    return None if gain <= 1e-12 else (student - base) / gain


def label_quality(labs: Sequence[Any], seed: int = 0) -> dict[str, float]:
    """MRR@10 and recall@2 of the teacher's label rankings against the gold paragraphs.

    Beside them the expected values of a random order (Monte Carlo, 200 permutations per
    question): how much gold-paragraph signal the student can learn from the labels at all.
    """
    refs = label_references([x for x in labs if x.gold_ids], seed)
    return {f"{name}_{m}": float(np.mean(v)) for name, rows in refs.items() for m, v in rows.items()}


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/distill/distill.py",
        "--model Qwen/Qwen2.5-7B-Instruct --device cuda --n-dev 100 --out experiments/distill/results/distill-gpu.json",
        note="The student trains on the same device.")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="result JSON")
    ap.add_argument("--dev-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/dev.jsonl")
    ap.add_argument("--n-dev", type=int, default=12, help="first N dev questions")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--cache", default="/tmp/ragkit-distill/bench-cache.jsonl", help="resumable per-question rows")
    ap.add_argument("--labels", default=None, help="label file (for --train and the report)")
    ap.add_argument("--labels-run", default=None, help="JSON summary of the labelling run (for the report)")
    ap.add_argument("--student", default=None, help="student folder (loaded, or written with --train)")
    ap.add_argument("--train", action="store_true", help="train the student on --labels first")
    ap.add_argument("--loss", default="listnet", help="student loss (default: the held-out winner, ListNet)")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch", type=int, default=4, help="questions per batched method call")
    ap.add_argument("--passage-max-tokens", type=int, default=60)
    ap.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="cpu", help="device of the generator and the student: cpu, cuda, auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ranking-only-n", type=int, default=0,
                    help="also rank the first N dev questions with BM25 and the student only (no generator)")
    ap.add_argument("--profile", default=None,
                    help="position profile JSON of the generator, for MoI and the student's placement (default: "
                         "the recency profile); the reference generator's: "
                         "experiments/profiles/qwen2.5-coder-0.5b-instruct-chat-k10-shrunk.json")
    ap.add_argument("--teacher", default="moi_cyclic", choices=[m for m in METHODS if m.startswith("moi")],
                    help="the MoI method whose gain over the retriever the student's 'gain kept' is measured "
                         "against (the labels' teacher; default moi_cyclic)")
    ap.add_argument("--machine-note", default="2-core CPU; ratios within one run only",
                    help="how the machine was loaded during the run (stored in the JSON)")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    args.dev_file = str(args.dev_file or data_path("hotpotqa", "dev.jsonl"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r}; choose from {METHODS}")
    recs = load_hotpotqa(args.dev_file, args.n_dev)
    by_id = {r.id: r for r in recs}
    retr = {r.id: bm25_order(r) for r in recs}

    train_info: dict[str, Any] | None = None
    student = None
    if "student" in methods or args.train:
        from ragkit.training.distill import DistilledReranker, train_student

        if args.train:
            if not args.labels:
                ap.error("--train needs --labels")
            res = train_student(args.labels, args.student, loss=args.loss, epochs=args.epochs, lr=args.lr,
                                seed=args.seed, device=args.device)
            student = res.reranker
            train_info = res.to_dict()
            train_info.pop("loss_history", None)
        else:
            if not args.student:
                ap.error("method 'student' needs --student DIR (or --train --labels FILE)")
            student = DistilledReranker.load(args.student, device=args.device)
            train_info = {"metadata": student.metadata}

    cache_path = Path(args.cache)
    cache = _cached(cache_path)
    generator = None
    profile = None
    if args.profile:
        from ragkit.debias import PositionProfile

        profile = PositionProfile.load(args.profile)
    # question batches outer, methods inner: an interrupted run leaves complete rows for the
    # questions it finished (the summary uses the questions every method has).
    for i in range(0, len(recs), args.batch):
        part = recs[i : i + args.batch]
        for m in methods:
            todo = [r for r in part if (m, r.id) not in cache]
            if not todo:
                continue
            if generator is None:
                from ragkit.generation import Generator

                generator = Generator(args.model, device=args.device, passage_max_tokens=args.passage_max_tokens,
                                      show_progress=False)
            rows = run_method(m, todo, retr, generator, student, args.batch, profile)
            append_jsonl(cache_path, rows)
            for row in rows:
                cache[(m, row["qid"])] = row

    present = [m for m in METHODS if any((m, r.id) in cache for r in recs)]
    common = [r for r in recs if all((m, r.id) in cache for m in present)]
    table: dict[str, dict[str, Any]] = {}
    for m in present:
        if common:
            table[m] = summarise(m, [cache[(m, r.id)] for r in common], by_id)

    comparison: dict[str, Any] = {}
    if common:
        per_q = {m: per_question([cache[(m, r.id)] for r in common], by_id) for m in present}
        comparison["paired_ci95"] = paired_comparisons(per_q, args.teacher)
    if {"retriever", args.teacher, "student"} <= table.keys():
        b, t, s = table["retriever"], table[args.teacher], table["student"]
        comparison |= {
            "teacher": args.teacher,
            "gain_kept_mrr@10": _kept(s["mrr@10"], b["mrr@10"], t["mrr@10"]),
            "gain_kept_f1": _kept(s["f1"], b["f1"], t["f1"]),
            "gain_kept_em": _kept(s["em"], b["em"], t["em"]),
            "rerank_speedup_vs_teacher": t["rerank_s_per_query"] / max(s["rerank_s_per_query"], 1e-9),
            "total_speedup_vs_teacher": t["total_s_per_query"] / max(s["total_s_per_query"], 1e-9),
            "student_rerank_at_least_10x_cheaper": t["rerank_s_per_query"] >= 10 * s["rerank_s_per_query"],
        }
    ranking_only: dict[str, Any] | None = None
    if args.ranking_only_n > 0 and student is not None:
        more = load_hotpotqa(args.dev_file, args.ranking_only_n)
        more_retr = {r.id: bm25_order(r) for r in more}
        qrels = {r.id: list(r.gold_ids) for r in more}
        t0 = time.perf_counter()
        ranked = student.rank_many([r.question for r in more], [more_retr[r.id].passages() for r in more])
        st_s = (time.perf_counter() - t0) / len(more)
        given = {r.id: {p.id: float(len(r.passages) - i) for i, p in enumerate(r.passages)} for r in more}
        ranking_only = {
            "n": len(more),
            "given": ir_metrics(qrels, given, ("mrr@10", "recall@2")),
            "retriever": ir_metrics(qrels, more_retr, ("mrr@10", "recall@2")),
            "student": ir_metrics(qrels, {r.id: rl for r, rl in zip(more, ranked)}, ("mrr@10", "recall@2")),
            "student_rerank_s_per_query": st_s,
        }
        print(f"ranking only, first {len(more)} dev questions: given order {ranking_only['given']}, "
              f"retriever {ranking_only['retriever']}, "
              f"student {ranking_only['student']} ({st_s:.3f} s/query)")
    label_info: dict[str, Any] | None = None
    if args.labels and Path(args.labels).exists():
        from ragkit.training.labels import read_labels

        labs = read_labels(args.labels)
        label_info = {"num_questions": len(labs), "sources": sorted({x.source for x in labs}),
                      "design": sorted({x.design for x in labs}), "outcome": sorted({x.outcome for x in labs}),
                      "generator_calls_per_question": float(np.mean([x.generator_calls for x in labs])),
                      "quality_vs_gold": label_quality(labs, args.seed)}
        if args.labels_run and Path(args.labels_run).exists():
            label_info["run"] = json.loads(Path(args.labels_run).read_text())

    result = {
        "benchmark": "distill",
        "dataset": f"HotpotQA dev (distractor): {len(common)} questions (of the first {len(recs)}) "
                   f"that every method finished, {rel(args.dev_file)}",
        "question_ids": [r.id for r in common],
        "retriever_order": "per-question BM25 over the 10 paragraphs",
        "generator": args.model or "SmolLM2-135M-Instruct (embedded)",
        "passage_max_tokens": args.passage_max_tokens,
        "profile": rel(args.profile) if args.profile else "recency (default)",
        "machine": {"note": args.machine_note},
        "methods": table,
        "comparison": comparison,
        "ranking_only": ranking_only,
        "labels": label_info,
        "student": train_info,
        "command": " ".join(["experiments/distill/distill.py", *args._argv]),
    }
    write_result(args.out, result)

    cols = ("mrr@10", "recall@2", "em", "f1", "generator_calls_per_query", "encoder_passes_per_query",
            "rerank_s_per_query", "total_s_per_query")
    print(f"{'method':<12}" + "".join(f"{c[:14]:>16}" for c in cols))
    for m, row in table.items():
        print(f"{m:<12}" + "".join(f"{row[c]:>16.3f}" for c in cols))
    for k, v in comparison.items():
        print(f"{k}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
