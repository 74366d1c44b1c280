"""Generators for speed benchmarks: a real model, or random weights in a named model's shape.

Speed does not need trained weights, so ``--model random:llama-3-8b`` builds a Llama-3-8B-shaped
decoder with random weights directly on the device (bf16 on CUDA), without downloading 16 GB.
The tokenizer is the embedded SmolLM2 one (or the folder in ``$RAGKIT_BENCH_TOKENIZER``); its ids
are all below every shape's vocabulary size, and the LM head keeps the shape's real vocabulary, so
the head's cost is the real model's.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True),
    # meta-llama/Meta-Llama-3-8B-Instruct
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                       rope_theta=500000.0, tie_word_embeddings=False),
}


def add_generator_args(ap: argparse.ArgumentParser) -> None:
    """The ``--model`` and ``--device`` options of a script that builds its generator with :func:`bench_generator`."""
    ap.add_argument("--model", default=None,
                    help="generator (default: the embedded SmolLM2-135M-Instruct); random:<shape> for random weights "
                         f"in a model's shape ({', '.join(SHAPES)}), e.g. --model random:llama-3-8b --device cuda")
    ap.add_argument("--device", default="auto", help="auto (CUDA with bf16 when present, else CPU fp32), cpu, cuda")


def bench_records(path: str, n: int, k: int) -> list[Any]:
    """The first ``n`` HotpotQA records of ``path`` with at least ``k`` passages and an answer
    (read from the first ``3n`` records)."""
    from ragkit.datasets import load_hotpotqa

    return [r for r in load_hotpotqa(path, limit=n * 3) if len(r.passages) >= k and r.answers][:n]


def bench_generator(model: str | None, device: str = "auto", seed: int = 0, **gen_kwargs: Any) -> Any:
    """A :class:`ragkit.generation.Generator` for ``model``; ``random:<shape>`` gives random weights.

    Parameters
    ----------
    model
        ``None`` (the embedded default), any name ``Generator`` accepts, or ``random:<shape>``
        with ``<shape>`` one of :data:`SHAPES`.
    device
        ``"auto"`` (CUDA with bf16 when present, else CPU fp32) or a torch device string.
    seed
        Seed of the random weights.
    """
    from ragkit.generation import Generator

    if not (model or "").startswith("random:"):
        return Generator(model, device=device, **gen_kwargs)
    shape = model.split(":", 1)[1]
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}: use one of {', '.join(SHAPES)}")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ragkit.models import resolve_device, resolve_dtype, resolve_generator_path

    dev = resolve_device(device)
    dtype = resolve_dtype("auto", dev)
    tok_dir = os.environ.get("RAGKIT_BENCH_TOKENIZER") or resolve_generator_path(None)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    cfg = LlamaConfig(**SHAPES[shape], bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: no fp32 copy of 8B weights
    try:
        with torch.device(dev):
            hf = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    hf.eval()
    return Generator.from_components(hf, tokenizer, name=model, **gen_kwargs)
