"""Checkpoint helpers shared by the training methods: find the latest checkpoint, save the final model.

Our own files are safetensors / JSON only. ``transformers.Trainer`` checkpoints also hold its
optimizer, scheduler and RNG state as torch files (``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth``); the Trainer writes and reads those itself (``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["latest_checkpoint", "resolve_resume", "save_final_model"]

logger = logging.getLogger(__name__)

_CKPT = re.compile(r"^checkpoint-(\d+)$")


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The ``checkpoint-N`` folder with the largest ``N`` in ``output_dir`` that has a
    ``trainer_state.json`` (a complete checkpoint), or ``None``."""
    d = Path(output_dir)
    if not d.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for p in d.iterdir():
        m = _CKPT.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").exists():
            n = int(m.group(1))
            if best is None or n > best[0]:
                best = (n, p)
    return None if best is None else str(best[1])


def resolve_resume(resume: str | bool | None, output_dir: str | os.PathLike[str]) -> str | None:
    """Turn a ``--resume`` value into a checkpoint path for ``Trainer.train``.

    ``None``/``False``/``""``: no resume. ``"last"``/``True``: :func:`latest_checkpoint` of
    ``output_dir`` (``None`` with an info log when there is none). Any other string: an existing
    checkpoint folder (``FileNotFoundError`` otherwise).
    """
    if resume is None or resume is False or resume == "":
        return None
    if resume is True or (isinstance(resume, str) and resume.lower() == "last"):
        ckpt = latest_checkpoint(output_dir)
        logger.info("resume: %s", ckpt or f"no checkpoint in {output_dir}; starting from scratch")
        return ckpt
    p = Path(str(resume))
    if not p.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {p}; pass 'last' or an existing checkpoint-N folder")
    return str(p)


def save_final_model(model: Any, tokenizer: Any, output_dir: str | os.PathLike[str], merge_lora: bool = True) -> Path:
    """Save a (possibly LoRA-wrapped) model + tokenizer as a normal Hugging Face folder.

    With a ``peft`` model and ``merge_lora`` the adapter is merged into a copy-free unwrapped model
    (``merge_and_unload``; the passed model is modified) and the full weights are saved, so that
    ``Generator(model=output_dir)`` loads it; without ``merge_lora`` only the adapter is saved.
    Files go to a temp folder first and are then moved into ``output_dir`` one by one with
    ``os.replace`` (each file appears complete or not at all). Weights are safetensors.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    m = model
    if hasattr(m, "module") and not hasattr(m, "save_pretrained"):
        m = m.module
    if merge_lora and hasattr(m, "merge_and_unload"):
        m = m.merge_and_unload()
    if getattr(getattr(m, "config", None), "use_cache", None) is False:
        m.config.use_cache = True  # training turned the KV cache off; inference wants it back
    tmp = Path(tempfile.mkdtemp(prefix=".final-", dir=out))
    try:
        m.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for f in tmp.iterdir():
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("saved final model to %s", out)
    return out
