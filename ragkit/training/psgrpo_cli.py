"""``ragkit train psgrpo``: PS-GRPO consistency training (Hamman et al., NeurIPS 2025, arXiv 2510.04392)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["register", "run"]


def register(train_sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--limit", type=int, default=None, help="use the first N questions")
    p.add_argument("--max-passages", type=int, default=None,
                   help="passages per prompt (gold kept, distractors fill up; default all)")
    p.add_argument("--passage-max-tokens", type=int, default=None, help="truncate each passage")
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
    p.add_argument("--json", dest="json_path", default=None, help="also write the summary JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handler: build paraphrase sets, train, print the summary."""
    from ragkit.cli import emit
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
    emit(summary, args.json_path, True)
    return 0
