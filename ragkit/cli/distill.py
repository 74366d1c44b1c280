"""``ragkit distill``: train a one-pass student reranker on MoI labels; ``ragkit distill labels`` makes them.

Usage::

    # 1. label training questions with MoI (gold outcome, leave-one-out design); resumable
    ragkit distill labels --data-file $RAGKIT_DATA/hotpotqa/train.jsonl --out labels.jsonl --limit 80
    #    or label-free, what moi_masked computes at inference, on the pipeline's BM25 candidates
    ragkit distill labels --data-file $RAGKIT_DATA/hotpotqa/train.jsonl --pool-file $RAGKIT_DATA/hotpotqa/dev.jsonl \\
        --retriever bm25 --candidates 20 --design masked --outcome question --model GGUF --out masked.jsonl
    # 2. train a student (residual by default), checked against the first stage on held-out questions
    ragkit distill --labels labels.jsonl --out students/minilm-moi --student residual --epochs 3
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
    add_dtype_arg,
    add_output_args,
    emit,
    float_between,
    positive_int,
    seed_int,
    set_requirements,
)


def _add_train_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--labels", required=required, help="label file (JSONL) from `ragkit distill labels`")
    p.add_argument("--student", default="residual", choices=("residual", "cross-encoder", "bi-encoder"),
                   help="residual: retriever order + a zero-initialised cross-encoder correction (default); "
                        "cross-encoder: a fresh scoring head; bi-encoder: the dense embedder fine-tuned")
    p.add_argument("--holdout", type=float, default=0.2,
                   help="fraction of labelled questions held out to compare the student with its first stage "
                        "(default 0.2; 0 skips the check)")
    p.add_argument("--relevance", default="auto", choices=("auto", "gold", "labels"),
                   help="relevant passages of the check: gold ids where present, else top-utility (auto)")
    p.add_argument("--tolerance", type=float, default=0.0,
                   help="how far below the first stage (MRR@10, recall@3) a student may fall (default 0)")
    p.add_argument("--force", action="store_true", help="save a student that falls below its first stage")
    p.add_argument("--prior", default="rank", choices=("rank", "score"),
                   help="residual student's prior: the given order (default) or the retriever scores")
    p.add_argument("--base-model", default=None,
                   help="encoder to start from: sentence-transformers/HF path or hub id (default: embedded MiniLM)")
    p.add_argument("--loss", default=None, choices=("listnet", "ranknet", "lambdaloss", "margin_mse", "mnrl"),
                   help="cross-encoder/residual: listwise ListNet (default), pairwise RankNet (or LambdaLoss, "
                        "cross-encoder only); bi-encoder: in-batch negatives + MarginMSE (margin_mse, default) or "
                        "in-batch negatives alone (mnrl)")
    p.add_argument("--epochs", type=float_between(0.0, 1000.0), default=3.0,
                   help="passes over the labels, at most 1000 (default 3)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="questions per optimisation step (default 4; bi-encoder: rows per step, default 16)")
    p.add_argument("--lr", type=float_between(0.0, 10.0), default=None,
                   help="AdamW learning rate, at most 10 (default 1e-4; bi-encoder 2e-5)")
    p.add_argument("--max-length", type=positive_int, default=256, help="token limit of a (question, passage) pair")
    p.add_argument("--temperature", type=float_between(1e-3, 1e3, strict=False), default=1.0,
                   help="target temperature (z-scored u / T), 0.001-1000 (default 1)")
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--bf16", action="store_true",
                   help="mixed precision (bfloat16 autocast, fp32 weights): faster on GPUs and on CPUs with "
                        "AVX512-BF16 or AMX, slower on other CPUs")
    p.add_argument("--checkpoint-dir", default=None,
                   help="make training resumable: checkpoints go here (every 20 steps) and the same command "
                        "started again continues from the latest; removed once the student is saved or refused "
                        "(default: none)")
    add_output_args(p, folder=True, required=required, out_help="folder for the trained student (written atomically)")


def _train_requires(args: argparse.Namespace) -> list[tuple[list[str], str]]:
    """Training the student runs sentence-transformers' trainer, which reads a ``datasets.Dataset``."""
    if getattr(args, "distill_command", None) in ("labels", "probe"):
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
    dsub = p.add_subparsers(dest="distill_command", metavar="{train,labels,probe}")

    t = dsub.add_parser("train", help="train the student (same as `ragkit distill --labels ... --out ...`)")
    _add_train_args(t, required=True)
    t.set_defaults(func=_train)
    set_requirements(t, _train_requires)

    lab = dsub.add_parser("labels", help="label training questions with MoI (gold, label-free or masked) or "
                                          "gold passages; resumable")
    add_data_args(lab, required=True)
    lab.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    lab.add_argument("--design", default="loo", choices=("loo", "ablate", "mixed", "cyclic", "prior", "random",
                                                         "masked"),
                     help="MoI design (default loo: the full prompt and each passage left out, k + 1 sequences; "
                          "gold-paragraph MRR@10 0.765 on HotpotQA train vs 0.420 for cyclic, the k rotations); "
                          "masked: leave-one-out estimated from one prefill with each passage masked out, what "
                          "the moi_masked reranker computes at inference (about UPR's cost; needs --outcome question)")
    lab.add_argument("--outcome", default="gold", choices=("gold", "question", "passages"),
                     help="gold: log-prob of the reference answer (oracle, default); question: query likelihood "
                          "(label-free, what `moi` runs at inference); passages: 1 for the data's gold passages, "
                          "else 0 (no generator)")
    lab.add_argument("--retriever", default="given", choices=("given", "bm25", "dense", "hybrid"),
                     help="candidates: the record's own passages (given, default) or the first stage's top "
                          "--candidates over the pooled corpus (the pipeline protocol: bm25, 20)")
    lab.add_argument("--candidates", type=positive_int, default=20, help="first-stage depth with --retriever")
    lab.add_argument("--pool-file", action="append", default=[],
                     help="dataset files whose passages join the retriever's corpus (HotpotQA: dev.jsonl)")
    lab.add_argument("--profile", default=None, help="position-bias profile JSON (default: flat)")
    lab.add_argument("--batch-queries", type=positive_int, default=4, help="questions per batched MoI call")
    lab.add_argument("--passage-max-tokens", type=positive_int, default=None,
                     help="truncate each passage in the prompt")
    lab.add_argument("--passage-tokens", dest="passage_max_tokens", type=positive_int, help=argparse.SUPPRESS)
    lab.add_argument("--no-resume", action="store_true", help="replace --out instead of appending to it")
    lab.add_argument("--device", default="auto")
    add_dtype_arg(lab)
    add_output_args(lab, required=True, result=False,
                    out_help="label file (JSONL) to append to; question ids already in it are skipped")
    lab.set_defaults(func=_labels)

    pr = dsub.add_parser("probe", help="fit the moi_attn attention probe of a generator to MoI labels")
    pr.add_argument("--labels", required=True, help="label file (JSONL) from `ragkit distill labels`")
    pr.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    pr.add_argument("--ridge", type=float, default=1.0, help="ridge penalty lambda (default 1)")
    pr.add_argument("--target", default="zscore", choices=("zscore", "center"),
                    help="per-question normalisation of the utilities (default zscore)")
    pr.add_argument("--no-calibrate", action="store_true", help="skip ICR's 'N/A' calibration row")
    pr.add_argument("--holdout", type=float, default=0.2,
                    help="fraction of questions held out to report fidelity (Spearman, top-3) on (default 0.2)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--passage-max-tokens", type=int, default=None, help="truncate each passage in the prompt")
    pr.add_argument("--device", default="auto")
    add_dtype_arg(pr)
    pr.add_argument("--probe-out", default=None,
                    help="probe JSON to write (default: ragkit/data/probes/<model-fingerprint>.json)")
    pr.add_argument("--features-cache", default=None,
                    help="JSONL file keeping each question's attention features as they are computed, so that an "
                         "interrupted fit resumes where it stopped (default: none)")
    add_output_args(pr, out_help="also write the JSON report to this file")
    pr.set_defaults(func=_probe)


_RECIPE_DEFAULTS = {"residual": ("listnet", 4, 1e-4), "cross-encoder": ("listnet", 4, 1e-4),
                    "bi-encoder": ("margin_mse", 16, 2e-5)}


def recipe_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The trainer arguments of ``--student``'s recipe: its own defaults for loss, batch size and learning rate."""
    loss, batch_size, lr = _RECIPE_DEFAULTS[args.student]
    loss = args.loss or loss
    allowed = ("margin_mse", "mnrl") if args.student == "bi-encoder" else (
        ("listnet", "ranknet") if args.student == "residual" else ("listnet", "ranknet", "lambdaloss"))
    if loss not in allowed:
        raise ValueError(f"--loss {loss} does not train a {args.student} student; choose one of {', '.join(allowed)}")
    kw: dict[str, Any] = dict(base_model=args.base_model, loss=loss, epochs=args.epochs,
                              batch_size=args.batch_size or batch_size, lr=args.lr or lr,
                              max_length=args.max_length, temperature=args.temperature, device=args.device,
                              bf16=args.bf16, checkpoint_dir=args.checkpoint_dir)
    if args.student == "residual":
        kw["prior"] = args.prior
    return kw


def _train(args: argparse.Namespace) -> int:
    from ragkit.training.students import distill

    if not args.labels or not args.out:
        raise ValueError("`ragkit distill` needs --labels FILE and --out DIR (or use `ragkit distill labels ...`)")
    kw = recipe_kwargs(args)
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for --json
        res = distill(args.labels, args.out, args.student, holdout=args.holdout, relevance=args.relevance,
                      tolerance=args.tolerance, force=args.force, seed=args.seed, overwrite=args.overwrite, **kw)
    c = res.reranker.metadata.get("comparison")
    check = ("no held-out check" if not c else "held-out " + ", ".join(
        f"{m} {c['student'][m]:.4f} (first stage {c['first_stage'][m]:.4f})" for m in c["first_stage"]))
    loss = ("" if res.initial_loss is None else
            f"; training loss {res.initial_loss:.4f} -> {res.final_loss:.4f}")
    emit(res.to_dict(), args,
         f"trained {args.student} student ({kw['loss']}) on {res.num_queries} questions ({res.num_pairs} pairs) in "
         f"{res.seconds:.1f} s{loss}; {check}; saved to {args.out}")
    return 0


def _labels(args: argparse.Namespace) -> int:
    from ragkit.datasets import load_dataset
    from ragkit.generation import load_generator
    from ragkit.training.labels import generate_labels

    if args.design == "masked" and args.outcome != "question":
        raise ValueError("--design masked estimates the question outcome (label-free MoI, what moi_masked runs at "
                         f"inference); pass --outcome question (got --outcome {args.outcome})")
    records = load_dataset(args.dataset or "auto", args.data_file, limit=args.limit)
    if args.retriever != "given":
        records = _with_candidates(args, records)
    if args.outcome == "passages":
        from ragkit.training.labels import passage_labels, write_labels

        labs = passage_labels(records)
        write_labels(args.out, labs)  # free to make: written whole (atomically), never appended
        emit({"path": args.out, "written": len(labs), "skipped": len(records) - len(labs)}, args,
             f"wrote {len(labs)} gold-passage labels ({len(records) - len(labs)} questions without both a gold and "
             f"a non-gold candidate skipped) -> {args.out}")
        return 0
    gen_kw: dict[str, Any] = {"device": args.device, "dtype": args.dtype}
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
        outcome=args.outcome,
    )
    emit(stats.to_dict(), args,
         f"labelled {stats.written} questions ({stats.skipped_existing} already there, "
         f"{stats.skipped_unusable} without answer/passages) in {stats.seconds:.1f} s "
         f"({stats.seconds_per_question:.1f} s/question) -> {stats.path}")
    return 0


def _probe(args: argparse.Namespace) -> int:
    from ragkit.debias.attention_probe import (
        attention_feature_table,
        default_probe_path,
        fit_attention_probe,
        spearman_fidelity,
        top_k_agreement,
    )
    from ragkit.generation import load_generator
    from ragkit.training.labels import read_labels
    from ragkit.training.students import split_labels

    labels = read_labels(args.labels)
    train, held = split_labels(labels, args.holdout, args.seed)
    gen_kw: dict[str, Any] = {"device": args.device, "dtype": args.dtype}
    if args.passage_max_tokens is not None:
        gen_kw["passage_max_tokens"] = args.passage_max_tokens
    generator = load_generator(args.model, **gen_kw)
    out = args.probe_out or default_probe_path(generator)
    probe = fit_attention_probe(generator, [lab.question for lab in train], [lab.passages() for lab in train],
                                [lab.u for lab in train], ridge=args.ridge, target=args.target,
                                calibrated=not args.no_calibrate, cache=args.features_cache,
                                metadata={"labels": str(args.labels),  # what the probe imitates, e.g. masked + question
                                          "label_design": ",".join(sorted({lab.design for lab in labels})),
                                          "label_outcome": ",".join(sorted({lab.outcome for lab in labels}))})
    if held:
        feats = attention_feature_table(generator, [lab.question for lab in held], [lab.passages() for lab in held],
                                        calibrated=probe.calibrated, cache=args.features_cache)
        pred = [probe.score(x) for x in feats]
        probe.metadata["held_out_fidelity"] = {
            "num_queries": len(held), "spearman": spearman_fidelity(pred, [lab.u for lab in held]),
            "top3_agreement": top_k_agreement(pred, [lab.u for lab in held], 3)}
    probe.save(out)
    fid = probe.metadata.get("held_out_fidelity") or probe.metadata["train_fidelity"]
    emit({"probe": str(out), **probe.metadata}, args,
         f"fitted moi_attn probe on {len(train)} questions ({probe.layers} layers x {probe.heads} heads); "
         f"{'held-out' if held else 'train'} fidelity: Spearman {fid['spearman']:.3f}, top-3 agreement "
         f"{fid['top3_agreement']:.3f}; saved to {out}")
    return 0


def _with_candidates(args: argparse.Namespace, records: list[Any]) -> list[Any]:
    """The records with the first stage's top ``--candidates`` (pooled corpus) as their passages.

    The corpus pools every record of ``--data-file`` (not only the first ``--limit``) and of each
    ``--pool-file``, as the pipeline study does, so a question's candidates do not depend on
    ``--limit``: a label file extended by a later run with a larger ``--limit`` keeps one protocol.
    """
    from ragkit.datasets import load_dataset
    from ragkit.eval.runner import EvalConfig, records_with_candidates

    pool = list(load_dataset(args.dataset or "auto", args.data_file)) if args.limit is not None else list(records)
    for f in args.pool_file:
        pool += load_dataset(args.dataset or "auto", f)
    cfg = EvalConfig(dataset=args.dataset or "auto", retriever=args.retriever, candidates=args.candidates,
                     k=args.candidates, device=args.device)
    return records_with_candidates(cfg, records, pool=pool)
