"""``ragkit train cord``: CORD training against passage-order bias (Lee et al., NAACL 2025, arXiv 2412.14581)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["register", "run"]


def register(train_sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--template", default="auto", help="prompt template (auto|short|chat|plain; auto = chat when the model has one)")
    p.add_argument("--k", type=int, default=None, help="keep the top k BM25-ranked passages (default all)")
    p.add_argument("--limit", type=int, default=None, help="use the first N records")
    p.add_argument("--dtype", default="float32", help="model dtype (float32|bfloat16|auto)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, help="also write the summary JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handler of ``ragkit train cord``."""
    from ragkit.cli import emit
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
    emit(brief, args.json_path, as_json=True)
    return 0
