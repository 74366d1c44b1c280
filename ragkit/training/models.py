"""The one model-loading helper of the trainers: tokenizer + causal LM (+ optional LoRA).

CORD (:mod:`ragkit.training.cord`) and PS-GRPO (:mod:`ragkit.training.psgrpo`) both load their
model here, through :func:`ragkit.models.load_generator` (embedded SmolLM2, ``.gguf`` files, hub
ids and folders alike). LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
ICLR 2022, arXiv 2106.09685) comes from ``peft``: the frozen weight ``W`` gets a trainable update
``W + (alpha / r) * B A`` with ``A`` (r x d_in), ``B`` (d_out x r), ``B = 0`` at the start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # pragma: no cover
    from peft import LoraConfig
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["LoadedModel", "load_for_training", "lora_config", "newline_token_ids"]

logger = logging.getLogger(__name__)


class LoadedModel(NamedTuple):
    """A model loaded for training, its tokenizer and the folder it came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    path: str


def lora_config(r: int, alpha: int, target_modules: str | list[str] = "all-linear") -> LoraConfig:
    """The ``peft.LoraConfig`` of both trainers (causal LM, dropout 0).

    Raises
    ------
    ImportError
        ``peft`` is not installed (the message names ``pip install "ragkit[train]"``).
    ValueError
        ``r < 1`` or ``alpha <= 0``.
    """
    if r < 1:
        raise ValueError(f"LoRA rank r must be >= 1, got {r}")
    if alpha <= 0:
        raise ValueError(f"LoRA alpha must be > 0, got {alpha}")
    try:
        from peft import LoraConfig
    except ImportError as e:  # pragma: no cover - peft is in the train extra
        raise ImportError('LoRA needs peft: pip install "ragkit[train]"') from e
    return LoraConfig(r=int(r), lora_alpha=int(alpha), lora_dropout=0.0, target_modules=target_modules,
                      task_type="CAUSAL_LM")


def newline_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of every vocabulary token whose text contains a newline (one batched decode).

    Added to a policy's EOS ids so that rollouts end with the short answer's line, as
    ``Generator.answer`` does at evaluation time.
    """
    ids = list(range(len(tokenizer)))
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return [i for i, t in zip(ids, texts) if "\n" in t]


def load_for_training(
    model: str | None,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    lora: LoraConfig | None = None,
    gradient_checkpointing: bool = False,
    stop_at_newline: bool = False,
) -> LoadedModel:
    """Load a causal LM for training: train mode, no KV cache, optional LoRA wrapper.

    Parameters
    ----------
    model
        Hub id, folder or ``.gguf`` file (``None``: the embedded SmolLM2), resolved by
        :func:`ragkit.models.resolve_generator_path` to a folder on disk (TRL rebuilds its
        reference model from that folder).
    dtype
        ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``.
    device
        Where the weights are loaded (the Trainer moves them to its own device afterwards).
    lora
        A :func:`lora_config`: wrap the model with ``peft.get_peft_model`` (``None``: all weights train).
    gradient_checkpointing
        With LoRA, make the input embeddings require grad so checkpointed blocks get gradients.
    stop_at_newline
        Add every newline token to ``generation_config.eos_token_id`` (rollouts stop at the end of
        the answer line; the original value is kept in ``generation_config.ragkit_original_eos``).

    Returns
    -------
    LoadedModel
        ``(model, tokenizer, path)``; the tokenizer has a pad token (its EOS when it had none).
    """
    from ragkit.models import load_generator, resolve_generator_path

    path = resolve_generator_path(model)
    hf, tok = load_generator(path, device=device, dtype=dtype)
    hf.train()
    if getattr(hf.config, "use_cache", None):
        hf.config.use_cache = False  # training recomputes everything; the cache only costs memory
    if stop_at_newline:
        eos = hf.generation_config.eos_token_id
        eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        if tok.eos_token_id is not None and tok.eos_token_id not in eos_list:
            eos_list.insert(0, tok.eos_token_id)
        hf.generation_config.ragkit_original_eos = eos
        hf.generation_config.eos_token_id = eos_list + [i for i in newline_token_ids(tok) if i not in eos_list]
    if lora is not None:
        from peft import get_peft_model

        hf = get_peft_model(hf, lora)
        if gradient_checkpointing:
            hf.enable_input_require_grads()
    logger.info("loaded %s for training (%s%s)", path, dtype, ", LoRA" if lora is not None else "")
    return LoadedModel(hf, tok, path)
