"""MoI vs. baselines on HotpotQA or MS MARCO: gold-passage ranking quality, answer quality, cost.

For each question the dataset's 10 passages play the retriever's list, in the order chosen by
``--order``: ``given`` (HotpotQA's given order is random; MS MARCO's is Bing's), ``bm25`` or
``dense`` (each question's own passages ranked by BM25 or by the dense embedder; read from
``--orders FILE``, written by ``experiments/moi_lab/question_orders.py``, or computed here).
Every method (retriever order, reverse, both ends, random, answer voting, permutation
self-consistency, MoI with each outcome and design) produces a ranking and a final answer:

- ranking: gold-passage MRR@10 and recall@2 (``_stats.rank_metrics``; gold = HotpotQA's supporting
  paragraphs, MS MARCO's ``is_selected`` passages);
- answer: EM / F1 (ragkit.eval.metrics, SQuAD normalisation) of the final generation, and on MS
  MARCO ROUGE-L by rouge-score (``rouge_l``) and by the leaderboard's protocol
  (``rouge_l_official``, ragkit.eval.msmarco_official: spaCy tokens, beta = 1.2);
- paired: each method minus the retriever order (``none``), and each MoI method minus every other
  baseline in ``--methods`` (``summary[m]["minus"][baseline]``), per question, with a 95% bootstrap
  interval (``_stats.paired_ci``);
- cost: generator sequences per question and wall seconds per question;
- answer reach (HotpotQA): whether the gold answer's text is in a gold paragraph as the prompt shows
  it (after the ``--passage-tokens`` cut): ``yes/no`` answers, ``in_context``, ``cut_away`` (in the
  full paragraph, not in the cut one) or ``absent``; ``summary_by_reach`` gives each method's MRR@10
  and F1 per stratum, since an answer-likelihood outcome cannot credit a paragraph whose answer
  sentence was cut off.

Questions are processed one at a time (every method on question i before question i+1) and the
JSON is rewritten after each question, so a run stopped by ``--time-budget`` still reports every
method on the same completed questions.

    nice -n 10 python3 experiments/moi_lab/moi_quality.py --data $RAGKIT_DATA/hotpotqa/dev.jsonl \
        --limit 20 --time-budget 1200 --out experiments/moi_lab/results/moi_quality-cpu.json
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from _lab import answer_scores, blend_table, reorder

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, model_label, rel, study_config, study_main, write_result
from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import paired_ci

DEFAULT_METHODS = ("none", "reverse", "both_ends", "random", "voting", "psc_borda", "psc_rrf", "moi", "moi_prior",
                   "moi_confidence", "moi_gold")


class SharedGenerations:
    """Delegates to a Generator but memoises ``generate`` by (prompt, settings).

    Greedy decoding is deterministic, so voting, PSC and MoI (same cyclic orderings, same
    prompts) get identical per-ordering answers whether or not they are shared; sharing only
    saves wall time on a loaded CPU. ``generator_calls`` still count every sequence a method
    needs on its own; the seconds of later methods exclude the shared generations.
    """

    def __init__(self, gen: Any) -> None:
        self._gen = gen
        self._memo: dict[tuple[Any, ...], str] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_gen":  # copy/pickle probes: never recurse
            raise AttributeError(name)
        return getattr(self._gen, name)

    def generate(self, prompts: list[str], max_new_tokens: int = 32, stop: Any = None,
                 temperature: float = 0.0, **kw: Any) -> list[str]:
        if temperature != 0.0 or kw.get("n", 1) != 1:
            return self._gen.generate(prompts, max_new_tokens=max_new_tokens, stop=stop,
                                      temperature=temperature, **kw)
        key = (max_new_tokens, tuple(stop or ()))
        todo = list(dict.fromkeys(p for p in prompts if (p, *key) not in self._memo))
        if todo:
            for p, o in zip(todo, self._gen.generate(todo, max_new_tokens=max_new_tokens, stop=stop)):
                self._memo[(p, *key)] = o
        return [self._memo[(p, *key)] for p in prompts]


METRICS = ("mrr@10", "recall@2", "em", "f1", "rouge_l", "rouge_l_official", "generator_calls", "seconds")
PAIRED = ("mrr@10", "recall@2", "f1", "rouge_l", "rouge_l_official")


def summarise(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Mean of every per-question metric, per method, over the questions all methods finished,
    and each method minus ``none`` (paired, 95% bootstrap interval) for MRR@10, recall@2 and F1."""
    done = [r for r in rows if all(m in r["methods"] for m in methods)]
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        vals = [r["methods"][m] for r in done]
        if not vals:
            continue
        out[m] = {key: float(np.mean([v[key] for v in vals])) for key in METRICS if vals[0].get(key) is not None}
        out[m]["n"] = len(vals)
        if "none" in methods and m != "none":
            base = [r["methods"]["none"] for r in done]
            for key in PAIRED:
                if vals[0].get(key) is not None:
                    out[m][f"{key}_minus_none"] = paired_ci([v[key] for v in vals], [b[key] for b in base])
        if m.startswith("moi"):  # MoI minus every baseline run beside it (issue: paired CI per baseline)
            others = [b for b in methods if b != "none" and not b.startswith("moi")]
            out[m]["minus"] = {
                b: {key: paired_ci([v[key] for v in vals], [r["methods"][b][key] for r in done])
                    for key in PAIRED if vals[0].get(key) is not None}
                for b in others}
    return out


REACH = ("in_context", "cut_away", "absent", "yes/no")


def answer_reach(answers: list[str], gold_full: list[str], gold_cut: list[str]) -> str:
    """Where the gold answer stands in the prompt: ``yes/no``, ``in_context`` (a normalised answer is a
    substring of a normalised gold body as cut for the prompt), ``cut_away`` (only in the uncut
    paragraph) or ``absent`` (in no gold paragraph)."""
    from ragkit.text import normalize_answer

    refs = [normalize_answer(a) for a in answers]
    refs = [r for r in refs if r]
    if any(r in ("yes", "no") for r in refs):
        return "yes/no"

    def has(bodies: list[str]) -> bool:
        return any(r in normalize_answer(b) for b in bodies for r in refs)

    return "in_context" if has(gold_cut) else "cut_away" if has(gold_full) else "absent"


def summarise_by_reach(rows: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per answer-reach stratum (``answer_reach``): the questions it holds and each method's mean
    MRR@10 and F1 on them, over the questions all methods finished."""
    done = [r for r in rows if all(m in r["methods"] for m in methods) and r.get("answer_reach")]
    out: dict[str, dict[str, Any]] = {}
    for stratum in REACH:
        got = [r for r in done if r["answer_reach"] == stratum]
        if got:
            out[stratum] = {"n": len(got), **{m: {key: float(np.mean([r["methods"][m][key] for r in got]))
                                                  for key in ("mrr@10", "f1")} for m in methods}}
    return out


def blend_tables(rows: list[dict[str, Any]], methods: list[str], blends: list[float]) -> dict[str, Any]:
    """Per MoI method, gold MRR@10 at each blend weight ``β`` of ``blends``, recomputed from the
    stored raw utilities and fallbacks (no model calls; ``moi_designs.blend_table``, the retriever
    order being ``none``'s ranking), paired against the retriever order, on the questions all
    methods finished; also the share of questions that fell back and, as ``no_fallback``, the
    ranking of the raw utilities alone (β = 0, no fallback): what the estimate itself is worth. The
    answers are not recomputed: only the run's own ``--blend`` has EM/F1."""
    from ragkit.debias.estimators import blend_with_retriever

    done = [r for r in rows if all(m in r["methods"] for m in methods)]
    out: dict[str, Any] = {}
    if "none" not in methods:
        return out
    for m in methods:
        got = [r for r in done if m.startswith("moi") and r["methods"][m].get("utilities") is not None]
        if not got:
            continue
        stored = {"per_question_utilities": [r["methods"][m]["utilities"] for r in got],
                  "per_question_fallback": [r["methods"][m]["fallback"] for r in got]}
        ids = [r["methods"]["none"]["ranking"] for r in got]
        golds = [set(r["gold_ids"]) for r in got]
        base = np.asarray([r["methods"]["none"]["mrr@10"] for r in got])
        raw = {**stored, "per_question_fallback": [False] * len(got)}
        out[m] = {"n": len(got), "table": blend_table(stored, ids, golds, 10, blends, base, blend_with_retriever),
                  "fallback_rate": float(np.mean(stored["per_question_fallback"])),
                  "no_fallback": blend_table(raw, ids, golds, 10, [0.0], base, blend_with_retriever)[0]}
    return out


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/moi_lab/moi_quality.py",
        "--model Qwen/Qwen2.5-7B-Instruct --device cuda --batch-size 64 --limit 100 --calibrate 30 "
        "--out experiments/moi_lab/results/moi_quality-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None,
                    help="HotpotQA JSONL or MS MARCO QnA JSON (told from the content; default: "
                         "$RAGKIT_DATA/hotpotqa/dev.jsonl)")
    ap.add_argument("--order", choices=("given", "bm25", "dense"), default="given",
                    help="the retriever order MoI starts from (bm25/dense: each question's own passages)")
    ap.add_argument("--orders", default=None,
                    help="JSON of precomputed orders (experiments/moi_lab/question_orders.py)")
    ap.add_argument("--device", default="auto", help="auto (CUDA with bf16 when present, else CPU fp32), cpu, cuda")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--offset", type=int, default=0, help="skip the first N records")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--model", default=None, help="generator (default: embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--passage-tokens", type=int, default=60)
    ap.add_argument("--profile", default=None, help="profile JSON (default: the recency-heavy default)")
    ap.add_argument("--blend", type=float, default=None,
                    help="MoI's weight of the retriever order, (1 - b) z(u) + b z(prior) (default: MoI's "
                         "'auto', which is 0 here: no retriever scores are passed); the README's BM25-order rows "
                         "use 0.75, chosen on train: experiments/moi_lab/moi_designs.py --order bm25")
    ap.add_argument("--blends", default="0,0.25,0.5,0.75,0.9",
                    help="blend weights at which MoI's MRR@10 is recomputed from the stored utilities "
                         "(summary 'blends'; no model calls)")
    ap.add_argument("--calibrate", type=int, default=0,
                    help="calibrate the profile on N questions of --calib-data first (0: use the default)")
    ap.add_argument("--calib-data", default=None, help="default: $RAGKIT_DATA/hotpotqa/train.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--no-share", action="store_true",
                    help="do not share identical greedy generations between methods (slower, same results)")
    ap.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the questions already in --out (same data, order, model and passage length) and "
                         "run only the rest; a method missing from a kept question is run for it")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    args.data = str(args.data or data_path("hotpotqa", "dev.jsonl"))
    if args.calibrate > 0 and args.calib_data is None:
        args.calib_data = str(data_path("hotpotqa", "train.jsonl"))
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")

    import torch

    from ragkit.datasets import detect_format, load_dataset, load_hotpotqa
    from ragkit.debias import PositionProfile, get_method
    from ragkit.generation import Generator
    from ragkit.generation.fitting import fit_passages

    t_start = time.perf_counter()
    fmt = detect_format(args.data)
    records = [r for r in load_dataset(fmt, args.data, limit=None) if r.gold_ids and r.answers
               and len(r.passages) >= 2][args.offset: args.offset + args.limit]
    records = reorder(records, args.order, args.orders)
    gen = Generator(args.model, device=args.device, passage_max_tokens=args.passage_tokens,
                    batch_size=args.batch_size, show_progress=False)
    calib_s = 0.0
    if args.profile:
        profile = PositionProfile.load(args.profile)
    elif args.calibrate > 0:
        t0 = time.perf_counter()
        profile = PositionProfile.calibrate(gen, load_hotpotqa(args.calib_data, args.calibrate), k=10)
        calib_s = time.perf_counter() - t0
    else:
        profile = PositionProfile.recency(10, model=gen.name)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    shared = gen if args.no_share else SharedGenerations(gen)
    runners = {m: get_method(m, shared, max_new_tokens=args.max_new_tokens,
                             **({"profile": profile, **({} if args.blend is None else {"blend": args.blend})}
                                if m.startswith("moi") else {})) for m in methods}
    rows: list[dict[str, Any]] = []
    wall_before = 0.0
    if args.resume and os.path.isfile(args.out):
        import json

        old = json.loads(open(args.out, encoding="utf-8").read())
        same = (old.get("data") == rel(args.data) and old.get("order", "given") == args.order
                and old.get("generator") in (gen.name, model_label(gen.name))
                and old.get("passage_tokens") == args.passage_tokens)
        if same:
            wanted = {r.id for r in records}
            rows = [r for r in old.get("per_question", []) if r["id"] in wanted]
            wall_before = float(old.get("wall_seconds") or 0.0)
            print(f"resuming: {len(rows)} questions kept from {args.out}", file=sys.stderr)

    def write(final: bool) -> dict[str, Any]:
        result = {
            "benchmark": "moi_quality",
            "data": rel(args.data), "format": fmt, "order": args.order, "offset": args.offset, "limit": args.limit,
            "questions_done": sum(all(m in r["methods"] for m in methods) for r in rows),
            "generator": model_label(gen.name), "template": gen.template.name, "passage_tokens": args.passage_tokens,
            "k": 10, "max_new_tokens": args.max_new_tokens, "shared_generations": not args.no_share,
            "blend": args.blend,
            "profile": {**profile.to_dict(), "model": model_label(profile.model)}, "calibration_seconds": calib_s,
            "machine": {"torch_threads": torch.get_num_threads(), "device": gen.device,
                        "gpu": torch.cuda.get_device_name() if gen.device.startswith("cuda") else None},
            "wall_seconds": wall_before + time.perf_counter() - t_start, "finished": final,
            "summary": summarise(rows, methods),
            "summary_by_reach": summarise_by_reach(rows, methods),
            "blends": blend_tables(rows, methods, [float(b) for b in args.blends.split(",") if b.strip()]),
            "per_question": rows,
        }
        write_result(args.out, result)
        return result

    def reach(rec: Any) -> str | None:
        if fmt != "hotpotqa":
            return None
        gold_ids = set(rec.gold_ids)
        gold = [j for j, p in enumerate(rec.passages) if p.id in gold_ids]
        cut = fit_passages(gen.tokenizer, gen.template, rec.question, list(rec.passages), max_length=gen.max_length,
                           answer_reserve=gen.answer_reserve, passage_max_tokens=gen.passage_max_tokens)
        return answer_reach(list(rec.answers), [rec.passages[j].text for j in gold], [cut[j] for j in gold])

    kept = {r["id"]: r for r in rows}
    for r in records:  # rows kept from an earlier run get the field too (tokenizer only, no model calls)
        if r.id in kept and "answer_reach" not in kept[r.id]:
            kept[r.id]["answer_reach"] = reach(r)
        if r.id in kept and fmt == "msmarco":  # likewise the official ROUGE-L, from the stored answers
            for v in kept[r.id]["methods"].values():
                if v.get("rouge_l_official") is None:
                    scores = answer_scores(fmt, v.get("answer") or "", list(r.answers))
                    v["rouge_l_official"] = scores["rouge_l_official"]
    for i, rec in enumerate(records):
        if args.time_budget and time.perf_counter() - t_start > args.time_budget:
            logging.warning("time budget reached after %d questions", i)
            break
        row: dict[str, Any] = kept.get(rec.id) or {"id": rec.id, "question": rec.question,
                                                   "answers": list(rec.answers), "gold_ids": list(rec.gold_ids),
                                                   "answer_reach": reach(rec), "methods": {}}
        if all(m in row["methods"] for m in methods):
            continue
        for m in methods:
            if m in row["methods"]:
                continue
            t0 = time.perf_counter()
            (o,) = runners[m].run_many([rec.question], [list(rec.passages)], answers=[list(rec.answers)])
            dt = time.perf_counter() - t0
            mrr, rec2 = rank_metrics(o.ranking.ids(), rec.gold_ids, 10)
            row["methods"][m] = {
                "mrr@10": mrr, "recall@2": rec2, **answer_scores(fmt, o.answer or "", list(rec.answers)),
                "answer": o.answer, "ranking": o.ranking.ids(), "order": o.order,
                "generator_calls": o.generator_calls, "seconds": dt,
            }
            raw = o.ranking.info.details.get("raw_utilities")
            if raw is not None:  # MoI: its raw utilities and fallback, for the blend table
                row["methods"][m]["utilities"] = [float(x) for x in raw]
                row["methods"][m]["fallback"] = bool(o.ranking.info.fallback)
        if rec.id not in kept:
            rows.append(row)
        write(False)
        print(f"[{i + 1}/{len(records)}] {time.perf_counter() - t_start:.0f}s", file=sys.stderr, flush=True)
    result = write(True)
    head = f"{'method':<16}{'MRR@10':>8}{'R@2':>7}{'EM':>7}{'F1':>7}{'calls/q':>9}{'s/q':>8}  dMRR vs none [95% CI]"
    print(f"{head}   n={result['questions_done']}, order={args.order}, {model_label(gen.name)}")
    for m, s in result["summary"].items():
        d = s.get("mrr@10_minus_none")
        ci = f"  {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else ""
        print(f"{m:<16}{s['mrr@10']:>8.3f}{s['recall@2']:>7.3f}{s['em']:>7.3f}{s['f1']:>7.3f}"
              f"{s['generator_calls']:>9.1f}{s['seconds']:>8.1f}{ci}")
    for m, s in result["summary"].items():
        if s.get("rouge_l") is not None:
            parts = [f"{key} {s[key]:.3f}" + (f" (minus none {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}])"
                                              if (d := s.get(f"{key}_minus_none")) else "")
                     for key in ("rouge_l", "rouge_l_official") if s.get(key) is not None]
            print(f"{m}: " + ", ".join(parts))
    for m, bt in result["blends"].items():
        print(f"{m} at blend beta (MRR@10 from stored utilities, n={bt['n']}): " + ", ".join(
            f"{b['beta']:g}: {b['mrr@10']:.3f} ({b['minus_order'][0]:+.3f})" for b in bt["table"]))
    for stratum, g in result["summary_by_reach"].items():
        print(f"answer {stratum} (n={g['n']}): " + ", ".join(
            f"{m} MRR {g[m]['mrr@10']:.3f} F1 {g[m]['f1']:.3f}" for m in methods))
    for m, s in result["summary"].items():
        for b, diffs in s.get("minus", {}).items():
            print(f"{m} minus {b}: " + ", ".join(f"{key} {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
                                                  for key, d in diffs.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
