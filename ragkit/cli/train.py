"""``ragkit train cord|psgrpo``: CORD (Lee et al., NAACL 2025, arXiv 2412.14581) and PS-GRPO
(Hamman et al., NeurIPS 2025, arXiv 2510.04392) from the command line.

Moved as-is from ``ragkit/training/{_cli,cord_cli,psgrpo_cli}.py``; the training configs
(``CORDConfig``/``PSGRPOConfig`` through ``HfArgumentParser``) replace these hand-written parsers.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from ragkit.cli._common import add_output_args, emit, positive_int

logger = logging.getLogger(__name__)

__all__ = ["register", "run_cord", "run_psgrpo"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ragkit train`` with its ``cord`` and ``psgrpo`` sub-commands."""
    train = subparsers.add_parser("train", help="fine-tune a generator against position/wording bias (cord, psgrpo)",
                                  description="Fine-tune a generator: `ragkit train cord ...` or "
                                              "`ragkit train psgrpo ...`.")
    train_sub = train.add_subparsers(dest="train_method", metavar="{cord,psgrpo}")
    _register_cord(train_sub)
    _register_psgrpo(train_sub)


def _register_cord(train_sub: argparse._SubParsersAction) -> None:
    """Add the ``cord`` parser under ``ragkit train``."""
    p = train_sub.add_parser(
        "cord",
        help="CORD: train the generator to answer consistently under passage reorderings",
        description=(
            "Fine-tune a causal LM on (retriever order, perturbed order) prompt pairs run in one stacked "
            "forward. --loss cord: CE + lam * KL(teacher || student) with the lower-CE ordering as a "
            "stop-gradient teacher; consistency: CE + lam * symmetric JS; shuffle: CE on perturbed orders; "
            "ce: CE on the retriever order. Multi-GPU: `accelerate launch -m ragkit.cli train cord ...`."),
    )
    p.add_argument("--data-file", required=True, help="HotpotQA JSONL (distractor) or MS MARCO QnA JSON")
    p.add_argument("--dataset", choices=["hotpotqa", "msmarco", "nq-open"], default=None,
                   help="format of --data-file (default: detected)")
    p.add_argument("--model", default=None, help="hub id, folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--loss", choices=["cord", "consistency", "shuffle", "ce"], default="cord")
    p.add_argument("--output-dir", required=True, help="checkpoints, final model (HF folder), cord_summary.json")
    p.add_argument("--max-steps", type=int, default=100, help="optimisation steps (default 100)")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (peft) instead of all weights")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    p.add_argument("--no-merge", action="store_true", help="save the LoRA adapter only (default: merged model)")
    p.add_argument("--lam", type=float, default=1.0, help="weight of the KL/JS term (default 1.0)")
    p.add_argument("--gamma", type=float, default=1.0, help="score-aware alpha: alpha_max = 1 - tanh(gamma*margin/std)")
    p.add_argument("--alpha", type=float, default=None, help="fixed interpolation alpha in [0,1] (default: score-aware)")
    p.add_argument("--ce-on", choices=["original", "both"], default="original",
                   help="CE on the retriever order only (default) or on both orderings")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 2e-4 LoRA, 2e-5 full)")
    p.add_argument("--batch-size", type=int, default=2, help="examples per device step (rows = 2x for paired losses)")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--save-steps", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--logging-steps", type=int, default=10, help="log every N steps")
    p.add_argument("--resume", nargs="?", const="last", default=None, metavar="CHECKPOINT",
                   help="resume from CHECKPOINT, or from the newest checkpoint in --output-dir when no value is given")
    p.add_argument("--passage-max-tokens", type=int, default=60, help="truncate each passage (default 60; 0 = off)")
    p.add_argument("--passage-tokens", dest="passage_max_tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--template", default="auto", help="prompt template (auto|short|chat|plain; auto = chat when the model has one)")
    p.add_argument("-k", "--k", type=int, default=None, help="keep the top k BM25-ranked passages (default all)")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N records")
    p.add_argument("--dtype", default="float32", help="model dtype (float32|bfloat16|auto)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    add_output_args(p, out_help="also write the summary JSON to this file")
    p.set_defaults(func=run_cord)


def run_cord(args: argparse.Namespace) -> int:
    """Handler of ``ragkit train cord``."""
    from ragkit.training.cord import CORDSettings, train_cord
    from ragkit.training.data import load_examples

    lr = args.lr if args.lr is not None else (2e-4 if args.lora else 2e-5)
    st = CORDSettings(
        loss=args.loss, lam=args.lam, ce_on=args.ce_on, gamma=args.gamma, alpha=args.alpha,
        template=args.template, passage_max_tokens=args.passage_max_tokens or None,
        max_steps=args.max_steps, batch_size=args.batch_size, grad_accum=args.grad_accum, lr=lr,
        save_steps=args.save_steps, logging_steps=args.logging_steps, seed=args.seed,
        lora=args.lora, lora_r=args.lora_r, lora_alpha=2 * args.lora_r, merge_lora=not args.no_merge,
        dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing,
    )
    st.validate()
    examples = load_examples(args.data_file, dataset=args.dataset, limit=args.limit, k=args.k)
    summary: dict[str, Any] = train_cord(examples, args.model, args.output_dir, st, resume=args.resume)
    brief = {k: v for k, v in summary.items() if k != "log_history"}
    brief["last_log"] = next((h for h in reversed(summary["log_history"]) if "loss" in h), None)
    emit(brief, args, json.dumps(brief, indent=2, default=str))
    return 0


def _register_psgrpo(train_sub: argparse._SubParsersAction) -> None:
    """Add the ``psgrpo`` parser under ``ragkit train``."""
    p = train_sub.add_parser(
        "psgrpo",
        help="PS-GRPO: RL for consistent answers across paraphrased questions",
        description=(
            "Group-similarity GRPO over paraphrase sets on TRL's GRPOTrainer. Each question gets "
            "--paraphrases wordings (the original + rule/LLM rewrites, or the file's own), each wording "
            "--generations sampled answers, and each answer is rewarded by its similarity to the answers "
            "of the other wordings (+ --gold-weight * F1 to the gold answer). GPU: add --use-vllm, and run "
            "several GPUs with `accelerate launch -m ragkit.cli train psgrpo ...`."),
    )
    p.add_argument("--data-file", required=True,
                   help="HotpotQA JSONL, ragkit QA JSONL {id,question,answers,passages}, or paraphrase-set JSONL")
    p.add_argument("--model", default=None, help="policy: hub id, folder, .gguf (default: embedded SmolLM2-135M)")
    p.add_argument("--paraphrases", type=int, default=4, help="members per set, original included (default 4)")
    p.add_argument("--generations", type=int, default=4, help="rollouts per member g (default 4)")
    p.add_argument("--output-dir", required=True, help="checkpoints, final/ model and psgrpo_summary.json")
    p.add_argument("--max-steps", type=int, default=50, help="optimisation steps (default 50)")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient to the reference (default 0.04)")
    p.add_argument("--epsilon", type=float, default=0.2, help="PPO clip range (default 0.2)")
    p.add_argument("--kappa", type=int, default=3,
                   help="other members drawn per member for the approximate reward; 0 = exact (default 3)")
    p.add_argument("--s", type=int, default=1, help="rollouts drawn per drawn member (default 1)")
    p.add_argument("--reward", choices=["bleu2", "rougel", "f1", "cosine"], default="bleu2",
                   help="similarity (default bleu2)")
    p.add_argument("--gold-weight", type=float, default=0.5, help="weight w of F1(answer, gold) (default 0.5)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 1e-6 full, 1e-4 LoRA)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0 = full fine-tuning)")
    p.add_argument("--paraphraser", choices=["rule", "llm"], default="rule",
                   help="how rewrites are made when the file has none (default rule)")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N questions")
    p.add_argument("--max-passages", type=int, default=None,
                   help="passages per prompt (gold kept, distractors fill up; default all)")
    p.add_argument("--passage-max-tokens", type=int, default=None, help="truncate each passage")
    p.add_argument("--passage-tokens", dest="passage_max_tokens", type=int, help=argparse.SUPPRESS)
    p.add_argument("--template", default="auto", help="prompt template (auto|short|chat|plain; auto = chat when the model has one)")
    p.add_argument("--max-completion-length", type=int, default=16, help="new tokens per rollout")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
    p.add_argument("--sets-per-batch", type=int, default=1, help="paraphrase sets per optimisation step")
    p.add_argument("--save-steps", type=int, default=50, help="checkpoint every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--use-vllm", action="store_true", help="vLLM rollouts (GPU; pip install vllm)")
    p.add_argument("--vllm-mode", choices=["colocate", "server"], default="colocate")
    p.add_argument("--device", default="auto")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    add_output_args(p, out_help="also write the summary JSON to this file")
    p.set_defaults(func=run_psgrpo)


def run_psgrpo(args: argparse.Namespace) -> int:
    """Handler of ``ragkit train psgrpo``: build paraphrase sets, train, print the summary."""
    from ragkit.paraphrase import LLMParaphraser, ParaphraseSet, RuleParaphraser, build_paraphrase_sets
    from ragkit.training.psgrpo import PSGRPOSettings, load_training_records, select_passages, train_psgrpo

    if args.paraphrases < 2:
        raise ValueError("--paraphrases must be >= 2 (the original plus at least one rewrite)")
    data: Any = load_training_records(args.data_file, limit=args.limit)
    n = args.paraphrases
    if data and isinstance(data[0], ParaphraseSet):
        sets = [s for s in data if len(s) == n]
        if not sets:
            raise ValueError(f"no set in {args.data_file} has {n} members; set --paraphrases to their size")
        if len(sets) < len(data):
            logger.warning("dropped %d sets whose size is not %d", len(data) - len(sets), n)
    else:
        if args.paraphraser == "llm":
            from ragkit.generation import Generator

            para: Any = LLMParaphraser(Generator(args.model, device=args.device), seed=args.seed)
        else:
            para = RuleParaphraser(seed=args.seed)
        mp = args.max_passages
        sets = build_paraphrase_sets(data, para, n=n - 1,
                                     passage_filter=(lambda r: select_passages(r, mp)) if mp else None)
    st = PSGRPOSettings(
        n=n, g=args.generations, sets_per_batch=args.sets_per_batch, max_steps=args.max_steps,
        beta=args.beta, epsilon=args.epsilon, kappa=args.kappa or None, s=args.s, reward=args.reward,
        gold_weight=args.gold_weight, learning_rate=args.lr, temperature=args.temperature,
        max_completion_length=args.max_completion_length, lora_r=args.lora_r, seed=args.seed,
        use_vllm=args.use_vllm, vllm_mode=args.vllm_mode, save_steps=args.save_steps,
    )
    summary = train_psgrpo(sets, args.model, args.output_dir, st, template=args.template,
                           passage_max_tokens=args.passage_max_tokens, resume=args.resume, device=args.device)
    summary.pop("history", None)
    emit(summary, args, json.dumps(summary, indent=2, default=str))
    return 0
