"""``ragkit distill``: train a one-pass student reranker on MoI labels; ``ragkit distill labels`` makes them.

Usage::

    # 1. label training questions with MoI (gold outcome, leave-one-out design); resumable
    ragkit distill labels --data-file ../shared/data/hotpotqa/train.jsonl --out labels.jsonl --limit 80
    # 2. train the student cross-encoder (embedded MiniLM by default)
    ragkit distill --labels labels.jsonl --out students/minilm-moi --loss listnet --epochs 3
    # 3. use it
    ragkit rerank --reranker student:students/minilm-moi ...

``ragkit distill train ...`` is the same as ``ragkit distill ...`` (step 2).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from ragkit.cli._common import (
    add_data_args,
    add_output_args,
    emit,
    float_between,
    positive_int,
    seed_int,
    set_requirements,
)


def _add_train_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--labels", required=required, help="label file (JSONL) from `ragkit distill labels`")
    p.add_argument("--base-model", default=None,
                   help="encoder to start from: sentence-transformers/HF path or hub id (default: embedded MiniLM)")
    p.add_argument("--loss", default="listnet", choices=("listnet", "ranknet", "lambdaloss"),
                   help="listwise ListNet (default), pairwise RankNet or LambdaLoss")
    p.add_argument("--epochs", type=float_between(0.0, 1000.0), default=3.0,
                   help="passes over the labels, at most 1000 (default 3)")
    p.add_argument("--batch-size", type=positive_int, default=4, help="questions per optimisation step (default 4)")
    p.add_argument("--lr", type=float_between(0.0, 10.0), default=1e-4, help="AdamW learning rate (default 1e-4)")
    p.add_argument("--max-length", type=positive_int, default=256, help="token limit of a (question, passage) pair")
    p.add_argument("--temperature", type=float_between(1e-3, 1e3, strict=False), default=1.0,
                   help="target temperature (z-scored u / T), 0.001-1000 (default 1)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--device", default="auto")
    add_output_args(p, folder=True, required=required, out_help="folder for the trained student (written atomically)")


def _train_requires(args: argparse.Namespace) -> list[tuple[list[str], str]]:
    """Training the student runs sentence-transformers' trainer, which reads a ``datasets.Dataset``."""
    if getattr(args, "distill_command", None) == "labels":
        return []
    return [(["datasets"], "ragkit distill (training the student)")]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ragkit distill`` (train) and ``ragkit distill labels`` to the top-level sub-commands."""
    p = sub.add_parser(
        "distill",
        help="distil MoI into a one-pass cross-encoder reranker",
        description="Train a cross-encoder student on MoI labels (`ragkit distill --labels F --out D`), "
        "or make the labels (`ragkit distill labels ...`).",
    )
    _add_train_args(p, required=False)
    p.set_defaults(func=_train)
    set_requirements(p, _train_requires)
    dsub = p.add_subparsers(dest="distill_command", metavar="{train,labels}")

    t = dsub.add_parser("train", help="train the student (same as `ragkit distill --labels ... --out ...`)")
    _add_train_args(t, required=True)
    t.set_defaults(func=_train)
    set_requirements(t, _train_requires)

    lab = dsub.add_parser("labels", help="label training questions with MoI (gold outcome); resumable")
    add_data_args(lab, required=True)
    lab.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    lab.add_argument("--design", default="loo", choices=("loo", "ablate", "mixed", "cyclic", "prior", "random"),
                     help="MoI design (default loo: the full prompt and each passage left out, k + 1 sequences; "
                          "gold-paragraph MRR@10 0.765 on HotpotQA train vs 0.420 for cyclic, the k rotations)")
    lab.add_argument("--profile", default=None, help="position-bias profile JSON (default: flat)")
    lab.add_argument("--batch-queries", type=positive_int, default=4, help="questions per batched MoI call")
    lab.add_argument("--passage-max-tokens", type=positive_int, default=None,
                     help="truncate each passage in the prompt")
    lab.add_argument("--passage-tokens", dest="passage_max_tokens", type=positive_int, help=argparse.SUPPRESS)
    lab.add_argument("--no-resume", action="store_true", help="replace --out instead of appending to it")
    lab.add_argument("--device", default="auto")
    add_output_args(lab, required=True, result=False,
                    out_help="label file (JSONL) to append to; question ids already in it are skipped")
    lab.set_defaults(func=_labels)


def _train(args: argparse.Namespace) -> int:
    from ragkit.training.distill import train_student

    if not args.labels or not args.out:
        raise ValueError("`ragkit distill` needs --labels FILE and --out DIR (or use `ragkit distill labels ...`)")
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for --json
        res = train_student(
            args.labels,
            args.out,
            base_model=args.base_model,
            loss=args.loss,
            epochs=args.epochs,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            max_length=args.max_length,
            temperature=args.temperature,
            device=args.device,
            overwrite=args.overwrite,
        )
    emit(res.to_dict(), args,
         f"trained {args.loss} student on {res.num_queries} questions ({res.num_pairs} pairs) in "
         f"{res.seconds:.1f} s; training loss {res.initial_loss:.4f} -> {res.final_loss:.4f}; saved to {args.out}")
    return 0


def _labels(args: argparse.Namespace) -> int:
    from ragkit.datasets import load_dataset
    from ragkit.generation import load_generator
    from ragkit.training.labels import generate_labels

    records = load_dataset(args.dataset or "auto", args.data_file, limit=args.limit)
    gen_kw: dict[str, Any] = {"device": args.device}
    if args.passage_max_tokens is not None:
        gen_kw["passage_max_tokens"] = args.passage_max_tokens
    generator = load_generator(args.model, **gen_kw)
    moi_kwargs: dict[str, Any] = {}
    if args.profile:
        from ragkit.debias import PositionProfile

        moi_kwargs["profile"] = PositionProfile.load(args.profile)
    stats = generate_labels(
        generator,
        records,
        args.out,
        batch_queries=args.batch_queries,
        resume=not args.no_resume,
        design=args.design,
        moi_kwargs=moi_kwargs,
    )
    emit(stats.to_dict(), args,
         f"labelled {stats.written} questions ({stats.skipped_existing} already there, "
         f"{stats.skipped_unusable} without answer/passages) in {stats.seconds:.1f} s "
         f"({stats.seconds_per_question:.1f} s/question) -> {stats.path}")
    return 0
