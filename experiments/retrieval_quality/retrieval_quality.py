"""Retrieval quality on HotpotQA dev: gold-paragraph recall and MRR of BM25, dense and hybrid.

The paragraphs of the first ``--limit`` questions (10 per question: 2 gold + 8 distractors) are
pooled into one corpus, de-duplicated by title (a paragraph's id is its Wikipedia title). Each
question is searched against the whole pool; its relevant documents are its supporting-fact
titles. Metrics are computed with ranx (``Qrels``/``Run``): recall@2 (the share of a question's
gold paragraphs found in the top 2, averaged over questions), recall@10, MRR@10 (reciprocal rank
of the first gold paragraph), nDCG@10.

Usage::

    python experiments/retrieval_quality/retrieval_quality.py --data $RAGKIT_DATA/hotpotqa/dev.jsonl \\
        --out experiments/retrieval_quality/results/retrieval_quality-cpu.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result

METRICS = ["recall@2", "recall@10", "mrr@10", "ndcg@10"]


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("experiments/retrieval_quality/retrieval_quality.py",
                          "--data $RAGKIT_DATA/hotpotqa/dev.jsonl --embedder BAAI/bge-base-en-v1.5 --device cuda "
                          "--out experiments/retrieval_quality/results/retrieval_quality-gpu.json",
                          generator=False, note="(No generator here: the GPU runs the dense encoder; BM25 is the "
                                                "same on any machine.)"))
    ap.add_argument("--data", required=True, help="HotpotQA dev JSONL (distractor setting)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--limit", type=int, default=300, help="number of questions")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--embedder", default=None, help="dense encoder (default embedded MiniLM)")
    ap.add_argument("--device", default="auto", help="encoder device: auto (CUDA when present), cpu, cuda")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)

    from ranx import Qrels, Run, evaluate

    from ragkit.datasets import load_hotpotqa
    from ragkit.retrievers import BM25Retriever, DenseRetriever, HybridRetriever
    from ragkit.types import Passage

    records = load_hotpotqa(args.data, limit=args.limit)
    pool: dict[str, Passage] = {}
    for rec in records:
        for p in rec.passages:
            pool.setdefault(p.id, Passage(id=p.id, title=p.title, text=p.text))
    corpus = list(pool.values())
    qrels = {rec.id: {g: 1 for g in rec.gold_ids} for rec in records}
    queries = [rec.query for rec in records]

    bm25 = BM25Retriever()
    dense = DenseRetriever(args.embedder, device=args.device)
    systems: dict[str, Any] = {}
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    bm25.index(corpus)
    timings["bm25_index_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dense.index(corpus)
    timings["dense_index_s"] = time.perf_counter() - t0
    systems["bm25"] = bm25
    systems["dense"] = dense
    systems["hybrid_rrf"] = HybridRetriever([bm25, dense], method="rrf").index(corpus)  # reuses both

    results: dict[str, dict[str, float]] = {}
    for name, r in systems.items():
        t0 = time.perf_counter()
        lists = r.search(queries, k=args.k)
        timings[f"{name}_search_s"] = time.perf_counter() - t0
        run = Run({q.id: rl.to_run_dict() for q, rl in zip(queries, lists)}, name=name)
        scores = evaluate(Qrels(qrels), run, METRICS)
        results[name] = {m: float(scores[m]) for m in METRICS}

    embedder = rel(dense.embedder) if os.path.isabs(dense.embedder) else dense.embedder
    out = {
        "data": rel(args.data), "n_questions": len(records), "n_docs": len(corpus),
        "embedder": embedder, "k": args.k, "metrics": results, "timings": timings,
        "notes": "corpus = the questions' 10 paragraphs pooled and de-duplicated by title; "
                 "relevant = supporting-fact titles; BM25 lucene k1=1.5 b=0.75 with English "
                 "stopwords and Snowball stemming; dense = FAISS flat inner product of "
                 "normalised embeddings; hybrid = RRF (k=60) of the two top-100 lists; ranx.",
    }
    print(f"{'system':<12}" + "".join(f"{m:>11}" for m in METRICS))
    for name, sc in results.items():
        print(f"{name:<12}" + "".join(f"{sc[m]:>11.4f}" for m in METRICS))
    write_result(args.out, out, device=None if args.device == "auto" else args.device)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
