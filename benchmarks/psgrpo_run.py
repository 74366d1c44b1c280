"""A short real PS-GRPO run on CPU with consistency and EM/F1 before and after.

Embedded SmolLM2-135M-Instruct, HotpotQA train questions (rule paraphrases, n members with the
original), LoRA, a few dozen steps; then Con-RAG consistency (generator-level: passages of the
original held fixed; end-to-end: BM25 over the dev paragraphs, retrieved per paraphrase) and
EM/F1 on dev questions, for the base model and the trained one. Usage::

    nice -n 10 python benchmarks/psgrpo_run.py --out benchmarks/results/psgrpo_run-cpu.json
"""

from __future__ import annotations

import argparse
import logging
import time

from _harness import gpu_epilog, shared_data, write_result


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


def main() -> None:
    epilog = gpu_epilog(
        "psgrpo_run.py",
        "--model Qwen/Qwen2.5-1.5B-Instruct --device cuda --train-questions 300 --eval-questions 50 "
        "--steps 200 --out benchmarks/results/psgrpo_run-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
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
    ap.add_argument("--gold-weight", type=float, default=0.5)
    ap.add_argument("--run-dir", default="/tmp/psgrpo_run")
    ap.add_argument("--skip-before", action="store_true")
    ap.add_argument("--eval-max-new", type=int, default=10)
    ap.add_argument("--max-completion-length", type=int, default=10)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import torch

    from ragkit.datasets import load_hotpotqa
    from ragkit.eval.consistency import paraphrase_sets
    from ragkit.paraphrase import RuleParaphraser, build_paraphrase_sets
    from ragkit.retrievers import BM25Retriever
    from ragkit.training.psgrpo import PSGRPOConfig, select_passages, train_psgrpo

    if args.device == "cpu":
        torch.set_num_threads(2)
    train = load_hotpotqa(shared_data("hotpotqa", "train.jsonl"), limit=args.train_questions)
    dev_all = load_hotpotqa(shared_data("hotpotqa", "dev.jsonl"))
    dev = _with_passages(dev_all[: args.eval_questions], args.k)
    corpus = list({p.id: p for r in dev_all for p in r.passages}.values())
    retriever = BM25Retriever().index(corpus)
    # evaluation paraphrases: a different seed from training (same rule family: in-distribution)
    paras = paraphrase_sets(dev, n=args.n - 1, source="rule", seed=123)

    result: dict = {"config": vars(args), "model": args.model or "SmolLM2-135M-Instruct (embedded)",
                    "machine": "CPU, 2 cores shared with other jobs" if args.device == "cpu" else args.device,
                    "corpus_passages": len(corpus)}
    if not args.skip_before:
        result["before"] = evaluate(args.model, dev, paras, retriever, args.k, args.passage_max_tokens,
                                    args.eval_max_new, args.device)
        logging.info("before: %s", {k: v for k, v in result["before"].items() if k != "examples"})
        _save(args.out, result)  # partial results survive an interrupted run

    sets = build_paraphrase_sets(train, RuleParaphraser(seed=0), n=args.n - 1,
                                 passage_filter=lambda r: select_passages(r, args.k))
    st = PSGRPOConfig(output_dir=str(args.run_dir), model=args.model, paraphrases=args.n, num_generations=args.g,
                      max_steps=args.steps, beta=args.beta, epsilon=0.2, kappa=3, s=1, reward="bleu2",
                      gold_weight=args.gold_weight, learning_rate=args.lr, temperature=1.0,
                      max_completion_length=args.max_completion_length, lora_r=args.lora_r, seed=0,
                      save_steps=10_000, passage_max_tokens=args.passage_max_tokens,
                      use_cpu=args.device == "cpu")
    summary = train_psgrpo(sets, st)
    hist = summary.pop("history")
    result["training"] = summary
    result["training"]["reward_curve"] = [h.get("reward") for h in hist]
    result["training"]["consistency_curve"] = [h.get("psgrpo/consistency") for h in hist]
    result["training"]["kl_curve"] = [h.get("kl") for h in hist]
    result["training"]["rollout_tokens_per_s"] = summary["rollout_tokens"] / max(summary["wall_s"], 1e-9)
    _save(args.out, result)
    result["after"] = evaluate(summary["final_dir"], dev, paras, retriever, args.k, args.passage_max_tokens,
                               args.eval_max_new, args.device)
    logging.info("after: %s", {k: v for k, v in result["after"].items() if k != "examples"})

    keys = ["generator_consistency", "end_to_end_consistency", "retriever_consistency", "em", "f1",
            "em_paraphrases", "f1_paraphrases", "empty_rate_fixed"]
    print(f"{'metric':28s} {'before':>8s} {'after':>8s}")
    for k in keys:
        b = result.get("before", {}).get(k)
        a = result["after"].get(k)
        print(f"{k:28s} {b if b is None else round(b, 4)!s:>8s} {a if a is None else round(a, 4)!s:>8s}")
    _save(args.out, result)


def _save(path: str, result: dict) -> None:
    write_result(path, result)


if __name__ == "__main__":
    main()
