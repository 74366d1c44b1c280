"""``ragkit eval`` (+ ``ragkit eval sweep``, ``ragkit eval consistency``): the evaluation commands."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from ragkit.cli._common import (
    MAX_COUNT,
    add_data_args,
    add_k_arg,
    add_model_args,
    add_output_args,
    emit,
    int_between,
    non_negative_int,
    positive_int,
    seed_int,
    set_requirements,
)
from ragkit.datasets import detect_format
from ragkit.io import partial_path

logger = logging.getLogger(__name__)

SAMPLE_LIMIT = 8
"""Questions of the bundled sample evaluated by a bare ``ragkit eval`` (fits in 5 min on 2 CPU cores)."""
SAMPLE_PASSAGE_TOKENS = 48
"""Per-passage token cut of a bare ``ragkit eval``."""
SAMPLE_K = 10
SAMPLE_METHODS = ("none", "moi", "moi_prior", "both_ends")
"""Methods of a bare ``ragkit eval``: the given order, MoI (default design; prior design, 3 orderings), a baseline."""
DEFAULT_METHODS = ("none",)


def _methods(s: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in s.split(",") if x.strip())
    if not names:
        raise argparse.ArgumentTypeError("--methods needs at least one name, e.g. none,moi")
    return names


def _ints(s: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {s[:80]!r}") from e
    bad = [v for v in out if not 0 <= v <= MAX_COUNT]
    if bad:
        raise argparse.ArgumentTypeError(f"slots are 0-based positions (0 .. k-1), got {str(bad[0])[:40]}")
    return out


def _add_common(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=16, help="answer length budget (default 16)")
    p.add_argument("--seed", type=seed_int, default=0)


def default_report_name(args: argparse.Namespace) -> str:
    """``ragkit eval``'s report file when ``--out`` is not given: named after the settings.

    The bare command (the bundled sample) writes ``ragkit-eval-report.json``; with data, the name
    holds the dataset, the data file's name, ``--limit``, the retriever and the methods, e.g.
    ``ragkit-eval-hotpotqa-dev-50q-none+moi+voting.json``, so that two example commands do not
    collide on one report (a report refuses a run with other settings). Sub-commands keep theirs.
    """
    import re

    from ragkit.eval.runner import DEFAULT_REPORT

    if getattr(args, "eval_command", None) is not None or (args.dataset is None and args.data_file is None):
        return DEFAULT_REPORT
    stem = Path(args.data_file).name if args.data_file else ""
    for suffix in (".gz", ".jsonl", ".json"):
        stem = stem.removesuffix(suffix)
    parts = [args.dataset or "", stem, f"{args.limit}q" if args.limit else "",
             args.retriever if args.retriever != "given" else "", "+".join(args.methods or DEFAULT_METHODS)]
    name = "-".join(re.sub(r"[^A-Za-z0-9._+=]+", "_", p) for p in parts if p)
    return f"ragkit-eval-{name[:120]}.json"


def _requires(args: argparse.Namespace) -> list[tuple[list[str], str]]:
    """Optional packages of ``ragkit eval [sweep|consistency]`` with these flags.

    ``--plot`` needs matplotlib (``[plots]``); an MS MARCO evaluation scores answers with the
    official metrics, whose tokenizer is spaCy's (``[msmarco]``).
    """
    sub = getattr(args, "eval_command", None)
    out: list[tuple[list[str], str]] = []
    if getattr(args, "plot", None):
        out.append((["matplotlib"], f"ragkit eval{' ' + sub if sub else ''} --plot"))
    if sub is None:
        dataset = args.dataset
        if dataset is None and args.data_file:
            try:
                dataset = detect_format(args.data_file)
            except (OSError, ValueError):  # the command itself reports a missing or unreadable file
                dataset = None
        if dataset in ("msmarco", "ms_marco", "ms-marco"):
            out.append((["spacy"], "ragkit eval on MS MARCO (the official metrics' tokenizer)"))
    return out


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``eval`` with its ``sweep`` and ``consistency`` sub-commands."""
    p = sub.add_parser(
        "eval",
        help="evaluate retrievers x debiasing methods on HotpotQA / MS MARCO / NQ-open",
        description=(
            "Evaluate a RAG pipeline. Without arguments: the bundled HotpotQA sample "
            f"({SAMPLE_LIMIT} questions, passages cut to {SAMPLE_PASSAGE_TOKENS} tokens) with the embedded "
            f"generator and methods {','.join(SAMPLE_METHODS)} (the given order, MoI's default design, MoI with "
            "the prior design, the lost-in-the-middle reorder), printing each method's difference to the given "
            "order with a paired bootstrap interval; writes ragkit-eval-report.json and .md in the current directory "
            "(with --data-file: a name made of the settings, unless --out is given)."
        ),
    )
    add_data_args(p, dataset_help="hotpotqa | msmarco | nq-open (default: told from --data-file; "
                                  "neither given: the bundled HotpotQA sample)")
    p.add_argument("--split", default=None, help="hub split (default validation)")
    p.add_argument("--setting", default=None, help="hotpotqa: distractor|fullwiki; msmarco: v1.1|v2.1")
    p.add_argument("--retriever", default="given", choices=("given", "bm25", "dense", "hybrid"))
    p.add_argument("--embedder", default=None, help="dense/hybrid encoder (default: embedded MiniLM)")
    p.add_argument("--methods", type=_methods, default=None,
                   help="comma-separated, e.g. none,moi,voting; the first is the baseline of the paired "
                        f"differences (default {','.join(DEFAULT_METHODS)}; the bundled sample: "
                        f"{','.join(SAMPLE_METHODS)})")
    p.add_argument("-k", "--k", type=positive_int, default=None,
                   help="passages that go into the prompt: the top K of each method's ranking (default: all "
                        "candidates; 10 when --candidates is not given either)")
    p.add_argument("--candidates", type=positive_int, default=None, metavar="N",
                   help="first-stage depth: passages the retriever returns and the reranker sees (default: K)")
    p.add_argument("--corpus", action="append", default=[], metavar="FILE",
                   help="extra corpus JSONL ({\"id\", \"text\", \"title\"}) pooled with every record's passages "
                        "for --retriever bm25|dense|hybrid (repeatable)")
    p.add_argument("--offset", type=non_negative_int, default=0,
                   help="skip the first N questions before --limit (the corpus still pools every record)")
    p.add_argument("--chunk-size", type=positive_int, default=8,
                   help="questions per run_many call / partial-file append")
    p.add_argument("--bootstrap", type=int_between(1, 1_000_000), default=1000,
                   help="bootstrap resamples for 95%% intervals, at most 1,000,000 (default 1000)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="position-bias profile JSON for the MoI methods and bias-aware placement (default: the "
                        "model's cached profile from `ragkit bias-profile`, else flat with a warning)")
    add_output_args(p, out_help="JSON report (default: ragkit-eval-report.json for the bundled sample, else named "
                                "after the settings, e.g. ragkit-eval-hotpotqa-dev-50q-none+moi.json)")
    p.add_argument("--report", default=None, help="markdown report (default: --out with .md)")
    p.add_argument("--plot", default=None, metavar="DIR", help="write PNG bar plots here")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip questions already in <out>.partial.jsonl (default on)")
    p.add_argument("--reuse", action="append", default=[], metavar="REPORT",
                   help="a finished eval report (repeatable) whose rows this run takes for the methods it ran with "
                        "the same settings on the same candidates, instead of running them again")
    _add_common(p)
    p.set_defaults(func=_run_eval, _default_out=default_report_name)
    set_requirements(p, _requires)

    esub = p.add_subparsers(dest="eval_command", metavar="{sweep,consistency}")
    s = esub.add_parser("sweep", help="lost-in-the-middle position sweep on NQ-open (oracle format)")
    s.add_argument("--data-file", required=True, help="NQ-open oracle JSONL(.gz) with gold passages")
    s.add_argument("--data", dest="data_file", help=argparse.SUPPRESS)
    s.add_argument("--limit", type=positive_int, default=100,
                   help="questions to sweep (distractors come from the whole file; default 100)")
    add_k_arg(s, default=(10, 20), help="context sizes, e.g. 10,20", type=_ints)
    s.add_argument("--slots", type=_ints, default=None,
                   help="gold positions, 1 = first passage, as the printed table counts them "
                        "(default 1, k/4, k/2, 3k/4, k; the JSON's 'slot' fields are 0-based)")
    s.add_argument("--no-generate", action="store_true", help="log-prob outcome only (no EM)")
    add_output_args(s, default="ragkit-sweep.json", out_help="JSON result (default ragkit-sweep.json)")
    s.add_argument("--plot", default=None, help="PNG curve path")
    s.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip contexts already in <out>.partial.jsonl, written 10 questions at a time (default on)")
    _add_common(s)
    s.set_defaults(func=_run_sweep)

    c = esub.add_parser("consistency", help="retriever / generator / end-to-end consistency across paraphrases")
    add_data_args(c, limit=20, dataset_help="hotpotqa | msmarco | nq-open (default: told from --data-file; "
                                            "neither given: the bundled HotpotQA sample)")
    c.add_argument("--retriever", default="bm25", choices=("given", "bm25", "dense", "hybrid"))
    c.add_argument("--embedder", default=None)
    add_k_arg(c, default=5, help="passages per question")
    c.add_argument("--n-paraphrases", type=positive_int, default=4)
    c.add_argument("--paraphraser", default="auto", choices=("auto", "data", "rule", "llm"))
    c.add_argument("--similarity", default="bleu2", choices=("bleu2", "f1", "rougel"))
    add_output_args(c, default="ragkit-consistency.json", out_help="JSON result (default ragkit-consistency.json)")
    c.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="skip paraphrase sets already in <out>.partial.jsonl, written 10 sets at a time (default on)")
    _add_common(c)
    c.set_defaults(func=_run_consistency)


def _generator(args: argparse.Namespace) -> Any:
    """The sweep's and the consistency run's generator; its batch bars are their progress (``--quiet``: off)."""
    from ragkit.generation import load_generator

    return load_generator(args.model, device=args.device, dtype=args.dtype, template=args.template,
                          batch_size=args.batch_size, passage_max_tokens=args.passage_max_tokens, show_progress=None)


def _run_eval(args: argparse.Namespace) -> int:
    from ragkit.eval.report import text_summary
    from ragkit.eval.runner import DEFAULT_REPORT, EvalConfig, run_eval

    sample = args.dataset is None and args.data_file is None
    dataset = args.dataset or (detect_format(args.data_file) if args.data_file else "hotpotqa")
    limit = args.limit if args.limit is not None else (SAMPLE_LIMIT if sample else None)
    methods = args.methods or (SAMPLE_METHODS if sample else DEFAULT_METHODS)
    pmt = args.passage_max_tokens
    if pmt is None and sample:
        pmt = SAMPLE_PASSAGE_TOKENS
    if args.profile and not Path(args.profile).is_file():
        raise FileNotFoundError(f"--profile {args.profile}: no such file; write one with `ragkit bias-profile`")
    k = args.k if args.k is not None else (args.candidates if args.candidates is not None else SAMPLE_K)
    cfg = EvalConfig(
        dataset=dataset, data_file=args.data_file, sample=sample, limit=limit, split=args.split,
        setting=args.setting, retriever=args.retriever, methods=methods, k=k, candidates=args.candidates,
        corpus=tuple(args.corpus), offset=args.offset, model=args.model,
        embedder=args.embedder, template=args.template, passage_max_tokens=pmt,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, chunk_size=args.chunk_size,
        seed=args.seed, n_bootstrap=args.bootstrap, device=args.device, dtype=args.dtype,
        method_kwargs={m: {"profile": args.profile} for m in methods} if args.profile else {},
    )
    out = args.out or DEFAULT_REPORT
    if sample:
        print(f"ragkit eval: bundled HotpotQA dev sample, {limit} questions, k={cfg.k} of {cfg.n_candidates} given "
              "paragraphs cut to "
              f"{pmt} tokens, methods {','.join(cfg.methods)}, generator {cfg.model or 'embedded SmolLM2'}",
              file=sys.stderr)
    t0 = time.perf_counter()
    for r in args.reuse:
        if not Path(r).is_file():
            raise FileNotFoundError(f"--reuse {r}: no such file; pass the JSON report of a finished ragkit eval run")
    report = run_eval(cfg, out=out, report_md=args.report, plot_dir=args.plot, resume=args.resume, reuse=args.reuse)
    md = args.report or str(Path(out).with_suffix(".md"))
    emit(report, args, text_summary(report)
         + f"\n{report['n_questions']} questions in {time.perf_counter() - t0:.1f} s; wrote {out} and {md}",
         write=False)  # run_eval wrote --out
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    from ragkit.datasets import load_dataset
    from ragkit.eval.report import text_table
    from ragkit.eval.sweep import position_sweep

    slots = None
    if args.slots:
        for kk in args.k:
            bad = [s for s in args.slots if not 1 <= s <= kk]
            if bad:
                raise ValueError(f"--slots {','.join(map(str, bad))}: positions are 1..{kk} for k={kk} "
                                 "(1 = the first passage)")
        slots = [s - 1 for s in args.slots]
    pool = load_dataset("nq-open", args.data_file)  # another format is refused, naming it
    recs = pool[: args.limit]
    gen = _generator(args)
    t0 = time.perf_counter()
    partial = partial_path(args.out)
    res = position_sweep(gen, recs, k=args.k, slots=slots, pool=pool, seed=args.seed,
                         max_new_tokens=args.max_new_tokens, generate=not args.no_generate,
                         partial=partial, resume=args.resume)
    d = res.to_dict()
    d["wall_seconds"] = round(time.perf_counter() - t0, 2)
    d["config"].update({"data_file": args.data_file, "passage_max_tokens": args.passage_max_tokens,
                        "template": args.template})
    if args.plot:
        d["plot"] = res.plot(args.plot)
    rows = [[r["setting"], r["k"] if r["k"] is not None else "-", r["slot"] + 1 if r["slot"] is not None else "-",
             f"{r['subspan_em']:.3f}", f"{r['logprob']:.3f}", r["n"]] for r in res.rows]
    text = (text_table(["setting", "k", "gold position", "best-subspan EM", "gold mean log-prob", "n"], rows)
            + _sweep_summary_text(res.summary) + f"\nwrote {args.out}" + (f" and {args.plot}" if args.plot else ""))
    emit(d, args, text)
    partial.unlink(missing_ok=True)  # the result holds every row now
    return 0


def _sweep_summary_text(summary: dict[str, Any]) -> str:
    """Per k: best and worst gold position (1-based, as in the table) and the gap, one line per measure."""
    names = {"subspan_em": "best-subspan EM", "logprob": "gold mean log-prob"}
    lines = []
    for kk, entry in summary.items():
        for key, label in names.items():
            e = entry.get(key)
            if not e:
                continue
            lines.append(f"k={kk} {label}: best at position {e['best_slot'] + 1} ({e['best']:.3f}), worst at "
                         f"position {e['worst_slot'] + 1} ({e['worst']:.3f}), gap {e['gap']:.3f}")
        if "psr" in entry:
            psr = entry["psr"]
            lines.append(f"k={kk} permutation sensitivity rate: {psr:.3f}" if isinstance(psr, float)
                         else f"k={kk} permutation sensitivity: {psr}")
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def _run_consistency(args: argparse.Namespace) -> int:
    from ragkit.datasets import load_dataset, pooled_corpus, sample_records
    from ragkit.eval.consistency import evaluate_consistency, paraphrase_sets
    from ragkit.eval.runner import EvalConfig, build_retriever

    if args.dataset is None and args.data_file is None:
        recs = sample_records(args.limit)
    else:
        ds = args.dataset or detect_format(args.data_file)
        recs = load_dataset(ds, args.data_file, limit=args.limit)
    gen = _generator(args)
    retr = None
    if args.retriever != "given":
        cfg = EvalConfig(retriever=args.retriever, embedder=args.embedder, device=args.device)
        retr = build_retriever(cfg, pooled_corpus(recs))
    paras = paraphrase_sets(recs, n=args.n_paraphrases, source=args.paraphraser, generator=gen, seed=args.seed)
    t0 = time.perf_counter()
    partial = partial_path(args.out)
    rep = evaluate_consistency(gen, recs, paras, retriever=retr, k=args.k, similarity=args.similarity,
                               max_new_tokens=args.max_new_tokens, partial=partial, resume=args.resume)
    d = rep.to_dict()
    d["config"] = {k: v for k, v in vars(args).items() if k != "func" and not k.startswith("_")}
    d["wall_seconds"] = round(time.perf_counter() - t0, 2)
    lines = [f"{key:24s} {'-' if d[key] is None else format(d[key], '.3f')}"
             for key in ("retriever_consistency", "generator_consistency", "end_to_end_consistency", "em", "f1",
                         "em_paraphrases", "f1_paraphrases")]
    emit(d, args, "\n".join([*lines, f"wrote {args.out}"]))
    partial.unlink(missing_ok=True)  # the result holds every set now
    return 0
