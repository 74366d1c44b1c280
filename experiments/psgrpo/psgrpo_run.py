"""A short real PS-GRPO run on CPU with consistency and EM/F1 before and after.

Embedded SmolLM2-135M-Instruct, HotpotQA train questions (rule paraphrases, n members with the
original), LoRA, a few dozen steps; then Con-RAG consistency (generator-level: passages of the
original held fixed; end-to-end: BM25 over the dev paragraphs, retrieved per paraphrase) and
EM/F1 on dev questions, for the base model and one trained model per gold-F1 weight
(``--gold-weights 0,0.5``: the consistency/accuracy trade-off, measured on the same sets), with
paired 95% bootstrap intervals set by set. A re-run with the same settings reuses what ``--out``
already holds, and a cut-off training resumes from its last checkpoint. Usage::

    python3 experiments/psgrpo/psgrpo_run.py --gold-weights 0,0.5 --out experiments/psgrpo/results/psgrpo_run-cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, study_config, study_main, write_result
from ragkit.eval.stats import paired_ci


def _with_passages(records, k):
    from dataclasses import replace

    from ragkit.training.psgrpo import select_passages

    return [replace(r, passages=select_passages(r, k)) for r in records]


def evaluate(model, records, paras, retriever, k, passage_max_tokens, max_new_tokens=16, device="cpu"):
    from ragkit.eval.consistency import evaluate_consistency
    from ragkit.generation import Generator

    gen = Generator(model, device=device, template="auto", passage_max_tokens=passage_max_tokens,
                    batch_size=8, show_progress=False)
    t0 = time.perf_counter()
    rep = evaluate_consistency(gen, records, paras, retriever=retriever, k=k, similarity="bleu2",
                               max_new_tokens=max_new_tokens)
    d = rep.to_dict()
    d["eval_s"] = time.perf_counter() - t0
    per = d.pop("per_set")
    d["per_set"] = per  # every set's outputs and scores: paired before/after intervals
    d["examples"] = [{"paraphrases": e["paraphrases"], "outputs_fixed": e["outputs_fixed"]} for e in per[:3]]
    d["empty_rate_fixed"] = sum(o == "" for e in per for o in e["outputs_fixed"]) / max(
        sum(len(e["outputs_fixed"]) for e in per), 1)
    return d


# per-set scores compared before/after and between gold weights (paired over the same dev sets)
PAIRED = ("generator", "end_to_end", "em", "f1", "f1_paraphrases")
# settings that decide the evaluation (a stored "before" is reused only when all of them match)
EVAL_KEYS = ("model", "device", "eval_questions", "n", "k", "passage_max_tokens", "eval_max_new")
# settings that decide a training run (a stored run is reused only when these and EVAL_KEYS match)
TRAIN_KEYS = ("train_questions", "steps", "g", "lora_r", "lr", "beta", "max_completion_length")


def paired_block(a: dict, b: dict) -> dict[str, list[float]]:
    """``a`` minus ``b``, set by set, for every score in ``PAIRED``: ``[mean, low, high]`` (95% bootstrap)."""
    pa = {e["qid"]: e for e in a["per_set"]}
    pb = {e["qid"]: e for e in b["per_set"]}
    qids = [q for q in pa if q in pb]
    return {key: paired_ci([pa[q][key] for q in qids], [pb[q][key] for q in qids])
            for key in PAIRED if qids and key in pa[qids[0]] and key in pb[qids[0]]}


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/psgrpo/psgrpo_run.py",
        "--model Qwen/Qwen2.5-1.5B-Instruct --device cuda --train-questions 300 --eval-questions 50 "
        "--steps 200 --gold-weights 0,0.5 --out experiments/psgrpo/results/psgrpo_run-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON result; a re-run with the same settings resumes from it")
    ap.add_argument("--model", default=None,
                    help="generator: hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (training then runs on the GPU too)")
    ap.add_argument("--train-questions", type=int, default=40)
    ap.add_argument("--eval-questions", type=int, default=40)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--k", type=int, default=3, help="passages per prompt")
    ap.add_argument("--passage-max-tokens", type=int, default=48)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta", type=float, default=0.04)
    ap.add_argument("--gold-weights", default="0.5",
                    help="comma-separated weights of the gold-F1 term; one training run each, all evaluated "
                         "on the same dev sets and compared set by set (e.g. 0,0.5)")
    ap.add_argument("--run-dir", default="/tmp/psgrpo_run",
                    help="training runs go to RUN_DIR/gold-W (checkpoints: a cut-off run resumes)")
    ap.add_argument("--save-steps", type=int, default=8, help="checkpoint every N training steps")
    ap.add_argument("--skip-before", action="store_true")
    ap.add_argument("--eval-max-new", type=int, default=10)
    ap.add_argument("--max-completion-length", type=int, default=10)
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    args = study_config(ap, config)
    try:
        weights = [float(w) for w in args.gold_weights.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--gold-weights {args.gold_weights!r}: pass comma-separated numbers, e.g. 0,0.5")
    if not weights or any(w < 0 for w in weights):
        ap.error("--gold-weights: pass one or more non-negative numbers, e.g. 0,0.5")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import torch

    from ragkit.datasets import load_hotpotqa
    from ragkit.eval.consistency import paraphrase_sets
    from ragkit.paraphrase import RuleParaphraser, build_paraphrase_sets
    from ragkit.retrievers import BM25Retriever
    from ragkit.training.psgrpo import PSGRPOConfig, select_passages, train_psgrpo

    if args.device == "cpu":
        torch.set_num_threads(2)
    cfg = vars(args)
    old = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    same_eval = all(old.get("config", {}).get(key) == cfg[key] for key in EVAL_KEYS)
    same_train = same_eval and all(old.get("config", {}).get(key) == cfg[key] for key in TRAIN_KEYS)

    train = load_hotpotqa(data_path("hotpotqa", "train.jsonl"), limit=args.train_questions)
    dev_all = load_hotpotqa(data_path("hotpotqa", "dev.jsonl"))
    dev = _with_passages(dev_all[: args.eval_questions], args.k)
    corpus = list({p.id: p for r in dev_all for p in r.passages}.values())
    retriever = BM25Retriever().index(corpus)
    # evaluation paraphrases: a different seed from training (same rule family: in-distribution)
    paras = paraphrase_sets(dev, n=args.n - 1, source="rule", seed=123)

    result: dict = {"config": cfg, "model": args.model or "SmolLM2-135M-Instruct (embedded)",
                    "machine": "CPU, 2 cores shared with other jobs" if args.device == "cpu" else args.device,
                    "corpus_passages": len(corpus), "runs": {}}
    if same_eval and "before" in old:
        result["before"] = old["before"]
        logging.info("before: reused from %s", args.out)
    elif not args.skip_before:
        result["before"] = evaluate(args.model, dev, paras, retriever, args.k, args.passage_max_tokens,
                                    args.eval_max_new, args.device)
        logging.info("before: %s", {k: v for k, v in result["before"].items() if k not in ("examples", "per_set")})
        _save(args.out, result)  # partial results survive an interrupted run

    sets = build_paraphrase_sets(train, RuleParaphraser(seed=0), n=args.n - 1,
                                 passage_filter=lambda r: select_passages(r, args.k))
    for w in weights:
        name = f"{w:g}"
        if same_train and "after" in old.get("runs", {}).get(name, {}):
            result["runs"][name] = old["runs"][name]
            logging.info("gold weight %s: reused from %s", name, args.out)
            continue
        st = PSGRPOConfig(output_dir=str(Path(args.run_dir) / f"gold-{name}"), model=args.model,
                          paraphrases=args.n, num_generations=args.g, max_steps=args.steps, beta=args.beta,
                          epsilon=0.2, kappa=3, s=1, reward="bleu2", gold_weight=w, consistency_weight=1.0,
                          learning_rate=args.lr,
                          temperature=1.0, max_completion_length=args.max_completion_length,
                          lora_r=args.lora_r, seed=0, save_steps=args.save_steps,
                          passage_max_tokens=args.passage_max_tokens, use_cpu=args.device == "cpu",
                          resume_from_checkpoint="last")
        summary = train_psgrpo(sets, st)
        hist = summary.pop("history")
        run: dict = {"gold_weight": w, "training": summary}
        run["training"]["reward_curve"] = [h.get("reward") for h in hist]
        run["training"]["consistency_curve"] = [h.get("psgrpo/consistency") for h in hist]
        run["training"]["kl_curve"] = [h.get("kl") for h in hist]
        run["training"]["rollout_tokens_per_s"] = summary["rollout_tokens"] / max(summary["wall_s"], 1e-9)
        run["after"] = evaluate(summary["final_dir"], dev, paras, retriever, args.k, args.passage_max_tokens,
                                args.eval_max_new, args.device)
        if "before" in result:
            run["after_minus_before"] = paired_block(run["after"], result["before"])
        result["runs"][name] = run
        logging.info("gold weight %s, after: %s", name,
                     {k: v for k, v in run["after"].items() if k not in ("examples", "per_set")})
        _save(args.out, result)
    names = [f"{w:g}" for w in weights]
    result["between"] = {f"{b}_minus_{names[0]}": paired_block(result["runs"][b]["after"],
                                                               result["runs"][names[0]]["after"])
                         for b in names[1:]}
    _save(args.out, result)
    print(table(result, names))
    return 0


def table(result: dict, names: list[str]) -> str:
    """The before/after table: one row per model, paired intervals against the base model."""
    cols = [("retriever_consistency", None), ("generator_consistency", "generator"),
            ("end_to_end_consistency", "end_to_end"), ("em", "em"), ("f1", "f1"),
            ("f1_paraphrases", "f1_paraphrases")]
    head = "| | " + " | ".join(c for c, _ in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 1)]

    def cell(block: dict, col: str, key: str | None, diff: dict | None) -> str:
        v = block.get(col)
        text = "–" if v is None else f"{v:.3f}"
        if diff and key in diff:
            m, lo, hi = diff[key]
            text += f" ({m:+.3f} [{lo:+.3f}, {hi:+.3f}])"
        return text

    if "before" in result:
        lines.append("| before | " + " | ".join(cell(result["before"], c, k, None) for c, k in cols) + " |")
    for name in names:
        run = result["runs"][name]
        lines.append(f"| after, gold weight {name} | "
                     + " | ".join(cell(run["after"], c, k, run.get("after_minus_before")) for c, k in cols) + " |")
    for pair, diff in result.get("between", {}).items():
        lines.append(f"| {pair.replace('_minus_', ' minus ')} | "
                     + " | ".join("–" if k is None or k not in diff else
                                  f"{diff[k][0]:+.3f} [{diff[k][1]:+.3f}, {diff[k][2]:+.3f}]" for _, k in cols) + " |")
    n = result.get("before", result["runs"][names[0]]["after"]).get("n_sets")
    return "\n".join(lines) + f"\n({n} dev paraphrase sets; brackets: after minus before, paired 95% bootstrap)"


def _save(path: str, result: dict) -> None:
    write_result(path, result)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
