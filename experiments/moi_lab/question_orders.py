"""Per-question retriever orders: each question's own passages ranked by BM25 and by the dense embedder.

HotpotQA gives 10 paragraphs per question in a random order and MS MARCO 10 Bing passages; MoI's
"on the retriever's list" rows start from these passages ranked by a real retriever instead:

- ``bm25``: the question against its own passages with ragkit's ``BM25Retriever`` (bm25s, Lucene
  variant, k1 = 1.5, b = 0.75; Robertson & Zaragoza, 2009);
- ``dense``: cosine similarity of the embedder's normalised embeddings (the embedded
  all-MiniLM-L6-v2 by default), ties broken by the given order.

Writes ``{"orders": {question_id: {"bm25": [ids], "dense": [ids]}}}`` so that a machine without
the embedder (a GPU machine that reaches no hub) can run ``moi_quality.py --orders FILE``, and
``"metrics"``: gold-passage MRR@10 and recall@2 of the given, BM25 and dense orders over the
questions that have gold passages (``_stats.rank_metrics``), with each retriever order minus the
given order (paired 95% bootstrap interval).

    python3 experiments/moi_lab/question_orders.py --data $RAGKIT_DATA/hotpotqa/dev.jsonl --out /tmp/orders-dev.json
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
from _lab import question_orders

from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result
from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/moi_lab/question_orders.py",
        "--data $RAGKIT_DATA/hotpotqa/dev.jsonl --embedder BAAI/bge-small-en-v1.5 --device cuda "
        "--out /tmp/orders-dev.json",
        generator=False)
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="HotpotQA JSONL or MS MARCO QnA JSON")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="bm25,dense")
    ap.add_argument("--embedder", default=None, help="dense encoder (default: the embedded MiniLM)")
    ap.add_argument("--device", default="auto")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    logging.basicConfig(level=logging.WARNING)
    from ragkit.datasets import detect_format, load_dataset

    records = load_dataset(detect_format(args.data), args.data)
    kinds = args.kinds.split(",")
    table = question_orders(records, kinds, args.embedder, args.device)
    gold = [r for r in records if r.gold_ids]
    per: dict[str, list[tuple[float, float]]] = {
        kind: [rank_metrics(table[r.id][kind] if kind != "given" else [p.id for p in r.passages], r.gold_ids, 10)
               for r in gold] for kind in ("given", *kinds)}
    metrics = {kind: {"mrr@10": float(np.mean([m for m, _ in v])), "recall@2": float(np.mean([x for _, x in v])),
                      "n": len(v)} for kind, v in per.items()}
    for kind in kinds:
        metrics[kind]["mrr@10_minus_given"] = paired_ci([m for m, _ in per[kind]], [m for m, _ in per["given"]])
    write_result(args.out, {"data": rel(args.data), "kinds": kinds, "embedder": args.embedder or "embedded MiniLM",
                            "metrics": metrics, "orders": table})
    for kind, m in metrics.items():
        print(f"{kind:<6} MRR@10 {m['mrr@10']:.3f}  recall@2 {m['recall@2']:.3f}  n={m['n']}")
    n = len(records)
    agree = np.mean([t["bm25"][0] == t["dense"][0] for t in table.values()]) if "dense" in args.kinds else None
    print(f"{n} questions; top-1 agreement bm25/dense: {agree}")
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
