"""``ragkit ask``: retrieve, rerank (MoI by default) and answer one question."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ragkit.cli._common import add_k_arg, add_model_args, add_output_args, emit
from ragkit.cli.rerank import add_moi_args, moi_kwargs_from_args, profile_from_args

__all__ = ["register", "ASK_PASSAGE_TOKENS"]

ASK_PASSAGE_TOKENS = 64
"""Per-passage token cut of ``ragkit ask`` (``--passage-max-tokens 0``: none). MoI scores k + 1 prompts of
k passages; uncut HotpotQA paragraphs make each prompt several times longer for little more evidence."""

logger = logging.getLogger(__name__)


MIN_PASSAGE_TOKENS = 16
"""Fewest tokens of its own a passage must get in the prompt to say anything (-k above that is refused)."""
WARN_PASSAGE_TOKENS = 64
"""Below this many tokens per passage, ``-k`` is allowed but warned about (most passages get cut)."""


def _check_k_fits(k: int, generator: Any) -> None:
    """Refuse a ``-k`` whose passages cannot all fit the generator's context window.

    ``k`` passages share ``max_length - answer_reserve`` tokens; with fewer than
    :data:`MIN_PASSAGE_TOKENS` each, every passage would be cut to (almost) nothing and the model
    would run full-context prompts over empty passages (MoI scores many orderings of them).
    """
    room = int(getattr(generator, "max_length", 0) or 0) - int(getattr(generator, "answer_reserve", 0) or 0)
    if room <= 0:
        return
    per = room // k
    if per < MIN_PASSAGE_TOKENS:
        raise ValueError(
            f"-k {k}: {k} passages cannot share the model's context of {room:,} tokens (about {per} tokens "
            f"each, and at least {MIN_PASSAGE_TOKENS} are needed to keep anything of a passage); use -k "
            f"{max(1, room // WARN_PASSAGE_TOKENS)} or less")
    if per < WARN_PASSAGE_TOKENS:
        logger.warning("-k %d: the %d passages share a context of %d tokens (about %d tokens each): longer "
                       "passages are cut; -k %d or less keeps more of each", k, k, room, per,
                       max(1, room // WARN_PASSAGE_TOKENS))


def _ask(args: argparse.Namespace) -> int:
    from ragkit.pipeline import RAGPipeline

    if not args.question.strip():
        raise ValueError("the question is empty; write it in quotes: ragkit ask \"Who wrote Hamlet?\"")
    moi_kwargs: dict[str, Any] = {}
    if not args.no_moi:
        moi_kwargs = {**moi_kwargs_from_args(args), "profile": profile_from_args(args),
                      "calibrate_profile": args.calibrate_profile}
    rag = RAGPipeline.default(index=args.index, model=args.model, use_moi=not args.no_moi, k=args.k,
                              device=args.device, dtype=args.dtype,
                              passage_max_tokens=args.passage_max_tokens or None, **moi_kwargs)
    _check_k_fits(args.k, rag.generator)
    res = rag.ask(args.question)
    result: dict[str, Any] = {"index": args.index or "bundled HotpotQA sample (BM25)",
                              "moi": rag.moi is not None, **res.to_dict(),
                              "profiles": rag.method.profiles_used()}
    lines = [f"Answer: {result['answer']}"]
    lines += [f"{r['rank']:>3}  {r['id']}  (retriever rank {r['retriever_rank']})" for r in result["passages"]]
    emit(result, args, "\n".join(lines))
    return 0


def register(subparsers: Any) -> None:
    """Add ``ask``."""
    a = subparsers.add_parser("ask", help="retrieve, rerank with MoI and answer a question")
    a.add_argument("question")
    a.add_argument("--index", default=None, help="a saved ragkit index (default: BM25 over the bundled sample)")
    add_k_arg(a, default=5, help="passages to retrieve (as RAGPipeline.default)")
    add_moi_args(a)
    a.add_argument("--no-moi", action="store_true", help="answer from the retriever order")
    add_model_args(a, template=False, batch_size=None, passage_max_tokens=ASK_PASSAGE_TOKENS)
    add_output_args(a, out_help="also write the JSON result to this file")
    a.set_defaults(func=_ask)
