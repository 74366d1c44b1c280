"""``ragkit rerank``, ``ragkit ask`` and ``ragkit bias-profile``."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _add_moi_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", choices=("cyclic", "prior", "random"), default="cyclic",
                   help="orderings to run: cyclic = k rotations (default), prior = M<k around the given order")
    p.add_argument("--budget", type=int, default=None, help="number of orderings M (default: k; prior: 3)")
    p.add_argument("--outcome", choices=("consensus", "confidence"), default="consensus",
                   help="label-free outcome per ordering (default: consensus)")
    p.add_argument("--profile", default=None, help="position-bias profile JSON (default: recency-heavy)")
    p.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--passage-tokens", type=int, default=None, help="cut each passage to this many tokens")
    p.add_argument("--device", default="auto")


def _generator(args: argparse.Namespace) -> Any:
    from ragkit.generation import Generator

    return Generator(args.model, device=args.device, passage_max_tokens=args.passage_tokens)


def _profile(args: argparse.Namespace) -> Any:
    from ragkit.debias.profile import PositionProfile

    return PositionProfile.load(args.profile) if args.profile else None


def _check_budget(args: argparse.Namespace) -> None:
    if args.budget is not None and args.budget < 1:
        raise ValueError(f"--budget must be >= 1, got {args.budget}")


def _rerank(args: argparse.Namespace) -> int:
    from ragkit.cli import emit
    from ragkit.io import read_jsonl
    from ragkit.types import Passage

    _check_budget(args)
    rows = read_jsonl(args.passages)
    if not rows:
        raise ValueError(f"{args.passages} holds no passages; write one JSON object per line "
                         '({"id": ..., "text": ..., "title": ..., "score": ...})')
    passages = [Passage.from_dict(r) for r in rows]
    scores = [float(r["score"]) for r in rows] if all("score" in r for r in rows) else None
    result: dict[str, Any] = {"query": args.query}
    if args.reranker:
        from ragkit.training.distill import DistilledReranker

        ranked = DistilledReranker.load(args.reranker).rank(args.query, passages, scores)
        result["reranker"] = args.reranker
    else:
        from ragkit.debias.reranker import MoIReranker

        rr = MoIReranker(_generator(args), design=args.design, budget=args.budget, outcome=args.outcome,
                         profile=_profile(args))
        ranked = rr.rank(args.query, passages, scores)
        res = rr.last_results[0]
        result.update({"reranker": "moi", "design": args.design, "outcome": args.outcome,
                       "orderings": res.orderings, "generator_calls": res.generator_calls,
                       "consensus_answer": res.target})
    result["ranking"] = [{"rank": h.rank + 1, "id": h.passage.id, "score": h.score, "title": h.passage.title}
                         for h in ranked]
    if not args.json:
        for h in ranked:
            print(f"{h.rank + 1:>3}  {h.score:+.4f}  {h.passage.id}  {h.passage.contents[:80]!r}")
    emit(result, args.out, args.json)
    return 0


def _ask(args: argparse.Namespace) -> int:
    from ragkit.cli import emit
    from ragkit.pipeline import RAGPipeline

    _check_budget(args)
    if args.k < 1:
        raise ValueError(f"-k must be >= 1, got {args.k}")
    rag = RAGPipeline.default(index=args.index, model=args.model, use_moi=not args.no_moi, k=args.k,
                              device=args.device, design=args.design, budget=args.budget,
                              outcome=args.outcome, profile=_profile(args),
                              passage_max_tokens=args.passage_tokens)
    res = rag.ask(args.question)
    result: dict[str, Any] = {"index": args.index or "bundled HotpotQA sample (BM25)",
                              "moi": rag.moi is not None, **res.to_dict()}
    if not args.json:
        print(f"Answer: {result['answer']}")
        for r in result["passages"]:
            print(f"{r['rank']:>3}  {r['id']}  (retriever rank {r['retriever_rank']})")
    emit(result, args.out, args.json)
    return 0


def _bias_profile(args: argparse.Namespace) -> int:
    from ragkit.cli import emit
    from ragkit.debias.profile import PositionProfile
    from ragkit.datasets import load_hotpotqa

    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    records = load_hotpotqa(args.data, args.limit)
    prof = PositionProfile.calibrate(_generator(args), records, k=args.k, seed=args.seed)
    prof.save(args.out)
    if args.plot:
        prof.plot(args.plot)
    if not args.json:
        print(" ".join(f"{w:.3f}" for w in prof.weights))
        print(f"saved {args.out}" + (f" and {args.plot}" if args.plot else ""))
    emit(prof.to_dict(), None, args.json)
    return 0


def register(subparsers: Any) -> None:
    """Add ``rerank``, ``ask`` and ``bias-profile`` to the ``ragkit`` command line."""
    p = subparsers.add_parser("rerank", help="rerank passages with Mixture-of-Intervention (or a distilled student)")
    p.add_argument("--query", required=True)
    p.add_argument("--passages", required=True, help='JSONL: {"id", "text", "title"?, "score"?} per line')
    _add_moi_args(p)
    p.add_argument("--reranker", default=None, help="a distilled student folder (ragkit distill) instead of MoI")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.set_defaults(func=_rerank)

    a = subparsers.add_parser("ask", help="retrieve, rerank with MoI and answer a question")
    a.add_argument("question")
    a.add_argument("--index", default=None, help="a saved ragkit index (default: BM25 over the bundled sample)")
    a.add_argument("-k", type=int, default=10, help="passages to retrieve")
    _add_moi_args(a)
    a.add_argument("--no-moi", action="store_true", help="answer from the retriever order")
    a.add_argument("--json", action="store_true")
    a.add_argument("--out", default=None)
    a.set_defaults(func=_ask)

    b = subparsers.add_parser("bias-profile", help="calibrate and plot a generator's position-bias profile")
    b.add_argument("--data", required=True, help="HotpotQA-format JSONL with answers and supporting facts")
    b.add_argument("--k", type=int, default=10)
    b.add_argument("--limit", type=int, default=20, help="calibration questions")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--out", required=True, help="profile JSON")
    b.add_argument("--plot", default=None, help="PNG of the profile")
    b.add_argument("--model", default=None)
    b.add_argument("--passage-tokens", type=int, default=60)
    b.add_argument("--device", default="auto")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=_bias_profile)
