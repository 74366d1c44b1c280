"""Run folders, checkpoints and resume for the trainers; the final model's atomic save.

Our own files are safetensors / JSON only. ``transformers.Trainer`` checkpoints also hold its
optimizer, scheduler and RNG state as torch files (``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth``); the Trainer writes and reads those itself (``torch.load(weights_only=True)``).

A training run folder (``output_dir``) is marked as a ragkit artifact of kind ``cord-run`` /
``psgrpo-run``; ragkit refuses to train into a folder holding files it did not write. On start,
temp folders left by killed saves of ragkit's own (``final.tmp-*``, ``final.old-*``,
``.final-*``, ``*.json.*.tmp``) are removed. A resume (:func:`check_resume`) checks the
checkpoint (damaged files are named) and refuses one trained with other settings.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ragkit.io import ARTIFACT_MARKER, artifact_kind, atomic_dir, check_writable_dir, write_json
from ragkit.training.config import RESUME_MAY_CHANGE, settings_diff
from ragkit.types import RagkitError

__all__ = [
    "CheckpointError",
    "ResumeState",
    "SettingsCallback",
    "check_checkpoint",
    "check_resume",
    "latest_checkpoint",
    "load_loop_checkpoint",
    "read_progress",
    "prepare_run_dir",
    "remove_stale_temps",
    "resolve_resume",
    "save_final_model",
    "save_loop_checkpoint",
    "start_or_resume",
]

logger = logging.getLogger(__name__)

_CKPT = re.compile(r"^checkpoint-(\d+)$")
SETTINGS_IN_CHECKPOINT = "ragkit_settings.json"
PROGRESS_IN_CHECKPOINT = "ragkit_progress.json"
"""What a checkpoint adds to the Trainer's state: e.g. the training seconds spent before it."""
_STALE_DIRS = ("final.tmp-*", "final.old-*", ".final-*")
_STALE_FILES = ("*.json.*.tmp",)
FINAL_KIND = "model"
"""Artifact kind of a trained model folder (``output_dir/final``)."""


class CheckpointError(RagkitError, ValueError):
    """A checkpoint cannot be resumed: damaged, or trained with other settings (the message says which)."""


# ------------------------------------------------------------------------------ run folder
def remove_stale_temps(run_dir: str | os.PathLike[str]) -> list[str]:
    """Delete temp folders/files that killed saves of ragkit left directly in ``run_dir``.

    Only ragkit's own patterns are touched: ``final.tmp-*`` / ``final.old-*`` (an interrupted
    :func:`ragkit.io.atomic_dir` of the final model), ``.final-*`` (older ragkit versions) and
    ``*.json.*.tmp`` (an interrupted :func:`ragkit.io.atomic_write_text`). Returns their names.
    """
    d = Path(run_dir)
    removed: list[str] = []
    if not d.is_dir():
        return removed
    for pat in _STALE_DIRS:
        for p in d.glob(pat):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
    for pat in _STALE_FILES:
        for p in d.glob(pat):
            if p.is_file() or p.is_symlink():
                p.unlink(missing_ok=True)
                removed.append(p.name)
    if removed:
        logger.warning("removed %d stale temp file(s)/folder(s) of a killed save in %s: %s",
                       len(removed), d, ", ".join(sorted(removed)))
    return removed


def prepare_run_dir(path: str | os.PathLike[str], kind: str, legacy_files: Sequence[str] = ()) -> Path:
    """Make ``path`` a training run folder of ``kind``; clean stale temps; refuse a user's folder.

    Accepted: a new or empty folder, a run folder of the same ``kind`` (its marker), or a run
    written before the marker existed (one of ``legacy_files`` present); and ``path/final`` must
    be writable as a model folder. Anything else raises ``FileExistsError``
    (:func:`ragkit.io.check_writable_dir`), before any work.
    """
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise FileExistsError(f"output_dir {d} is a file; pass a folder path (new, empty, or an earlier {kind})")
    legacy = d.is_dir() and artifact_kind(d) is None and any((d / f).is_file() for f in legacy_files)
    if not legacy:
        check_writable_dir(d, kind, overwrite=False, into=True)  # a run folder is written into, never replaced
    check_writable_dir(d / "final", FINAL_KIND)  # the final model's folder too, before any training
    d.mkdir(parents=True, exist_ok=True)
    if artifact_kind(d) is None:
        write_json(d / ARTIFACT_MARKER, {"kind": kind, "format": 1}, indent=None)
    remove_stale_temps(d)
    return d


# ------------------------------------------------------------------------------ checkpoints
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


def _damaged(folder: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {folder} is damaged: {what}. Delete that folder to resume from an earlier "
                           "checkpoint, or start a new run in another output_dir")


def _check_safetensors(f: Path, folder: Path) -> None:
    """Header readable and the file as long as the header says (catches truncation)."""
    size = f.stat().st_size
    try:
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise _damaged(folder, f"{f.name} is not a readable safetensors file ({e})") from e
    if not isinstance(header, dict):
        raise _damaged(folder, f"{f.name} has no tensor table")
    end = max((int(v["data_offsets"][1]) for k, v in header.items()
               if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v), default=0)
    if 8 + n + end != size:
        raise _damaged(folder, f"{f.name} holds {size} bytes, its header describes {8 + n + end} (truncated?)")


def check_checkpoint(path: str | os.PathLike[str]) -> int:
    """Check a ``checkpoint-N`` folder before a resume; return its ``global_step``.

    Checked: ``trainer_state.json`` parses and has ``global_step``; model or adapter weights are
    present and every safetensors file is complete; ``adapter_config.json`` parses; the
    Trainer's torch state files are intact zip archives (CRC-checked, nothing unpickled).

    Raises
    ------
    CheckpointError
        Naming the folder and the damaged file.
    """
    d = Path(path)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint {d} is not a folder")
    state_file = d / "trainer_state.json"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        step = int(state["global_step"])
    except FileNotFoundError as e:
        raise _damaged(d, "trainer_state.json is missing") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _damaged(d, f"trainer_state.json is unreadable ({type(e).__name__}: {e})") from e
    weights = sorted(d.glob("*.safetensors"))
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _damaged(d, f"{index.name} is unreadable ({e})") from e
        missing = sorted(s for s in shards if not (d / s).is_file())
        if missing:
            raise _damaged(d, f"weight shard(s) {', '.join(missing)} are missing")
    if not weights:
        raise _damaged(d, "it holds no model weights (model.safetensors or adapter_model.safetensors)")
    for f in weights:
        _check_safetensors(f, d)
    adapter_cfg = d / "adapter_config.json"
    if (d / "adapter_model.safetensors").is_file() or adapter_cfg.exists():
        try:
            json.loads(adapter_cfg.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise _damaged(d, "adapter_config.json is missing beside the adapter weights") from e
        except (OSError, ValueError) as e:
            raise _damaged(d, f"adapter_config.json is unreadable ({e})") from e
    for f in sorted([*d.glob("*.pt"), *d.glob("*.pth")]):
        try:
            with zipfile.ZipFile(f) as z:
                bad = z.testzip()
        except (OSError, zipfile.BadZipFile) as e:
            raise _damaged(d, f"{f.name} is not an intact torch archive ({e})") from e
        if bad is not None:
            raise _damaged(d, f"{f.name} has a corrupt member {bad!r}")
    return step


# ------------------------------------------------------------------------------ resume
@dataclass(frozen=True)
class ResumeState:
    """Where a run starts: the checked checkpoint (``None``: fresh) and its step."""

    checkpoint: str | None
    step: int
    run_dir: Path

    def finished_summary(self, name: str, max_steps: int) -> dict[str, Any] | None:
        """The saved summary when the checkpoint already reached ``max_steps`` and the run's
        summary and ``final/`` model are there (resuming a finished run changes nothing)."""
        if self.checkpoint is None or max_steps <= 0 or self.step < max_steps:
            return None
        p = self.run_dir / name
        if not p.is_file() or not (self.run_dir / "final").is_dir():
            return None
        try:
            summary = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        steps = summary.get("global_step", summary.get("steps")) if isinstance(summary, dict) else None
        return summary if steps == self.step else None

    @staticmethod
    def logged_train_loss(state: Any) -> float | None:
        """Mean training loss over the whole run from the Trainer's log history.

        Each logged ``loss`` is the mean over the steps since the previous log, so the run's
        mean is ``Σ loss_i · (step_i − step_{i−1}) / step_last``; ``None`` without any log.
        """
        prev, total, steps = 0, 0.0, 0
        for h in getattr(state, "log_history", None) or []:
            if "loss" in h and "step" in h:
                n = int(h["step"]) - prev
                if n > 0:
                    total += float(h["loss"]) * n
                    steps += n
                    prev = int(h["step"])
        return total / steps if steps else None


def check_resume(resume: str | bool | None, run_dir: str | os.PathLike[str], settings: Mapping[str, Any],
                 settings_file: str, may_change: frozenset[str] = RESUME_MAY_CHANGE) -> ResumeState:
    """Resolve ``resume``, check the checkpoint and refuse one trained with other settings.

    The checkpoint's settings are read from its ``ragkit_settings.json`` (written at every save)
    or, for checkpoints of older runs, from ``settings_file`` in its parent folder. Every setting
    but those in ``may_change`` (paths of outputs, logging, ``max_steps``) must be equal.

    Raises
    ------
    CheckpointError
        The checkpoint is damaged, or its settings differ (each difference is named).
    FileNotFoundError
        ``resume`` names a folder that does not exist.
    """
    d = Path(run_dir)
    ckpt = resolve_resume(resume, d)
    if ckpt is None:
        return ResumeState(None, 0, d)
    step = check_checkpoint(ckpt)
    saved: dict[str, Any] | None = None
    for f in (Path(ckpt) / SETTINGS_IN_CHECKPOINT, Path(ckpt).parent / settings_file):
        if f.is_file():
            try:
                saved = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise _damaged(Path(ckpt), f"its settings file {f} is unreadable ({e})") from e
            break
    if saved is None:
        logger.warning("checkpoint %s has no saved settings; cannot check that they match", ckpt)
    else:
        diff = settings_diff(saved, settings, may_change)
        if diff:
            parts = [f"{k}: {a!r} (checkpoint) vs {b!r} (now)" for k, (a, b) in diff.items()]
            raise CheckpointError(
                f"checkpoint {ckpt} was trained with other settings: {'; '.join(parts)}. Resume with the same "
                "settings, or start a new run in another output_dir")
    logger.info("resuming from %s (step %d)", ckpt, step)
    return ResumeState(str(ckpt), step, d)


class SettingsCallback(TrainerCallback):
    """Writes the run's settings into every checkpoint (``ragkit_settings.json``) for :func:`check_resume`,
    and, with ``progress``, what it returns (``ragkit_progress.json``, read back by :func:`read_progress`)."""

    def __init__(self, settings: Mapping[str, Any],
                 progress: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.settings = dict(settings)
        self.progress = progress

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not state.is_world_process_zero:
            return
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if ckpt.is_dir():
            write_json(ckpt / SETTINGS_IN_CHECKPOINT, self.settings)
            if self.progress is not None:
                write_json(ckpt / PROGRESS_IN_CHECKPOINT, dict(self.progress()))


def read_progress(checkpoint: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The ``ragkit_progress.json`` of a checkpoint (``{}`` for none, or a checkpoint without one)."""
    if checkpoint is None:
        return {}
    f = Path(checkpoint) / PROGRESS_IN_CHECKPOINT
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise _damaged(Path(checkpoint), f"{f.name} is unreadable ({e})") from e
    return data if isinstance(data, dict) else {}


def start_or_resume(run_dir: str | os.PathLike[str], kind: str, settings: Mapping[str, Any]) -> ResumeState:
    """Prepare ``run_dir`` as a run folder of ``kind`` and resume from its latest checkpoint, if any.

    The automatic resume of trainers that take a checkpoint folder (the distillation students): a
    run killed half-way continues from its last checkpoint when it is started again with the same
    settings; other settings raise :class:`CheckpointError` naming each difference.
    """
    d = prepare_run_dir(run_dir, kind)
    return check_resume("last", d, settings, SETTINGS_IN_CHECKPOINT)


def save_loop_checkpoint(run_dir: str | os.PathLike[str], step: int, model: Any, optimizer: Any,
                         state: Mapping[str, Any], settings: Mapping[str, Any]) -> Path:
    """Checkpoint a plain PyTorch training loop after ``step`` optimiser steps, atomically.

    ``checkpoint-<step>/`` holds the model's weights (``model.safetensors``), the optimiser state
    (``optimizer.pt``, a torch archive read back with ``weights_only=True``: tensors and numbers,
    nothing unpickled), the torch RNG states (``rng_state.safetensors``), ``trainer_state.json``
    (``global_step`` and ``state``: JSON the loop needs, e.g. its data order and loss history) and
    the run's settings. The folder is written beside its final name and renamed, so a kill leaves
    the previous checkpoint whole; the previous one is then deleted.
    """
    import torch
    from safetensors.torch import save_file, save_model

    d = Path(run_dir)
    final = d / f"checkpoint-{step}"
    tmp = d / f".checkpoint-{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda{i}": t for i, t in enumerate(torch.cuda.get_rng_state_all())})
    save_file(rng, str(tmp / "rng_state.safetensors"))
    write_json(tmp / SETTINGS_IN_CHECKPOINT, dict(settings))
    write_json(tmp / "trainer_state.json", {"global_step": int(step), "state": dict(state)})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in d.iterdir():
        m = _CKPT.match(old.name)
        if m and int(m.group(1)) != step and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_loop_checkpoint(checkpoint: str | os.PathLike[str], model: Any, optimizer: Any) -> dict[str, Any]:
    """Restore what :func:`save_loop_checkpoint` wrote into ``model``, ``optimizer`` and torch's RNGs;
    return the loop's ``state``. Check it first with :func:`check_resume`."""
    import torch
    from safetensors.torch import load_file, load_model

    d = Path(checkpoint)
    load_model(model, str(d / "model.safetensors"))
    optimizer.load_state_dict(torch.load(d / "optimizer.pt", weights_only=True, map_location="cpu"))
    rng = load_file(str(d / "rng_state.safetensors"))
    torch.set_rng_state(rng["cpu"])
    cuda = [rng[f"cuda{i}"] for i in range(len(rng) - 1)]  # saved as cpu, cuda0, cuda1, ...
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    return dict(json.loads((d / "trainer_state.json").read_text(encoding="utf-8")).get("state") or {})


# ------------------------------------------------------------------------------ final model
def save_final_model(model: Any, tokenizer: Any, path: str | os.PathLike[str], merge_lora: bool = True,
                     kind: str = FINAL_KIND) -> Path:
    """Save a (possibly LoRA-wrapped) model + tokenizer as a normal Hugging Face folder, atomically.

    With a ``peft`` model and ``merge_lora`` the adapter is merged (``merge_and_unload``; the
    passed model is modified) and the full weights are saved, so that ``Generator(model=path)``
    loads it; without ``merge_lora`` only the adapter is saved. The KV cache flag and the EOS
    ids that training changed are restored. The folder is written by
    :func:`ragkit.io.atomic_dir` (a crash leaves the previous one intact; a folder of the user's
    files is never replaced). Weights are safetensors.
    """
    m = model
    if hasattr(m, "module") and not hasattr(m, "save_pretrained"):
        m = m.module
    if merge_lora and hasattr(m, "merge_and_unload"):
        m = m.merge_and_unload()
    if getattr(getattr(m, "config", None), "use_cache", None) is False:
        m.config.use_cache = True  # training turned the KV cache off; inference wants it back
    gen_cfg = getattr(m, "generation_config", None)
    orig = getattr(gen_cfg, "ragkit_original_eos", None)
    if gen_cfg is not None and orig is not None:
        gen_cfg.eos_token_id = orig
        del gen_cfg.ragkit_original_eos
    with atomic_dir(path, kind=kind) as tmp:
        m.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    logger.info("saved final model to %s", path)
    return Path(path)
