"""What the training configs share: config files, unknown-key checks, warm-up ratio, resume checks.

The configs themselves live beside their trainers, the TRL way:
:class:`ragkit.training.cord.CORDConfig` (a ``transformers.TrainingArguments``) and
:class:`ragkit.training.psgrpo.PSGRPOConfig` (a ``trl.GRPOConfig``). Each knob is one dataclass
field with its help text and its one default; the command line is generated from the fields
(``transformers.HfArgumentParser``), and a YAML / JSON file holds the same keys::

    # run.yaml
    data_file: /path/to/data/hotpotqa/train.jsonl   # e.g. under $RAGKIT_DATA
    output_dir: runs/cord
    loss: cord
    lora: true
    max_steps: 300

    ragkit train cord --config run.yaml --learning_rate 5e-4     # the command line wins
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "RESUME_MAY_CHANGE",
    "RagkitConfigMixin",
    "check_warmup_ratio",
    "check_known_keys",
    "config_from_mapping",
    "read_config_file",
    "settings_dict",
    "settings_diff",
    "warmup_steps_for",
    "warn_inert",
]

logger = logging.getLogger(__name__)

C = TypeVar("C")

RESUME_MAY_CHANGE: frozenset[str] = frozenset({
    # where and how often things are written or shown: they do not change what is trained
    "output_dir", "resume_from_checkpoint", "overwrite_output_dir", "logging_dir", "logging_steps",
    "logging_strategy", "logging_first_step", "save_steps", "save_strategy", "save_total_limit", "report_to",
    "disable_tqdm", "run_name", "log_level", "log_level_replica", "push_to_hub", "hub_model_id", "hub_token",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "log_completions",
    "num_completions_to_print", "config",
    # a finished or stopped run may be continued for more steps
    "max_steps", "num_train_epochs",
})
"""Settings a ``--resume`` may change; any other difference is refused (:func:`settings_diff`)."""


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a training config: a YAML (``.yaml``/``.yml``) or JSON (``.json``) mapping of field -> value."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    suffix = p.suffix.lower()
    text = p.read_text(encoding="utf-8")
    try:
        if suffix in (".yaml", ".yml"):
            from ragkit.types import require_extra

            require_extra(["yaml"], f"reading the YAML config {p}")
            import yaml

            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ValueError(f"config file {p} must end in .yaml, .yml or .json")
    except (json.JSONDecodeError, ImportError) as e:
        raise ValueError(f"cannot read config file {p}: {e}") from e
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        if type(e).__module__.startswith("yaml"):
            raise ValueError(f"config file {p} is not valid YAML: {e}") from e
        raise
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping of setting: value, got {type(data).__name__}")
    return data


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def check_known_keys(cls: type, keys: Any, source: str = "settings") -> None:
    """Raise ``ValueError`` naming every key that is not a field of the config class ``cls``.

    Nothing is dropped silently: a misspelled or retired setting (``warmup_ratio`` on a
    transformers without that field, say) is an error that names the closest known fields.
    """
    known = _field_names(cls)
    unknown = [k for k in keys if k not in known]
    if not unknown:
        return
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(str(k), known, n=3, cutoff=0.6)
        hints.append(f"{k!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise ValueError(f"unknown setting(s) in {source} for {cls.__name__}: {'; '.join(hints)}. "
                     f"`ragkit train ... --help` lists every setting")


def config_from_mapping(cls: type[C], values: Mapping[str, Any], source: str = "settings") -> C:
    """``cls(**values)`` after :func:`check_known_keys` (a clear error instead of a ``TypeError``)."""
    check_known_keys(cls, values.keys(), source)
    return cls(**dict(values))


def check_warmup_ratio(cfg: Any) -> None:
    """Validate a config's ``warmup_ratio`` (in ``[0, 1]``, not together with ``warmup_steps``).

    transformers 5 dropped ``TrainingArguments.warmup_ratio`` (a ratio is now a float
    ``warmup_steps`` below 1). ragkit's configs keep a ``warmup_ratio`` field so that the setting
    is never lost, and read it in ``get_warmup_steps`` (:func:`warmup_steps_for`), the method the
    Trainer's scheduler asks; the field itself is never rewritten, so a config rebuilt from its
    saved settings (or ``dataclasses.replace``) stays the same.
    """
    ratio = float(getattr(cfg, "warmup_ratio", 0.0) or 0.0)
    if not 0.0 <= ratio <= 1.0 or math.isnan(ratio):
        raise ValueError(f"warmup_ratio must lie in [0, 1], got {ratio}")
    if ratio and getattr(cfg, "warmup_steps", 0):
        raise ValueError(f"set warmup_ratio ({ratio}) or warmup_steps ({cfg.warmup_steps}), not both")


def warmup_steps_for(cfg: Any, num_training_steps: int) -> int | None:
    """``ceil(warmup_ratio * num_training_steps)`` when the config has a ``warmup_ratio``, else ``None``."""
    ratio = float(getattr(cfg, "warmup_ratio", 0.0) or 0.0)
    if not ratio:
        return None
    return max(1, math.ceil(ratio * int(num_training_steps)))


def warn_inert(cfg: Any, rules: Sequence[tuple[bool, Sequence[str], str]]) -> list[str]:
    """Log a warning naming every setting given a non-default value where it has no effect.

    ``rules`` holds ``(applies, names, reason)``: when ``applies`` is true, each of ``names`` that
    differs from its field default is named with ``reason`` (e.g. ``"lora_r: no effect without
    lora=True"``). Returns the warned names.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    warned: list[str] = []
    for applies, names, reason in rules:
        if not applies:
            continue
        for n in names:
            if n in defaults and getattr(cfg, n) != defaults[n]:
                logger.warning("setting %s=%r has no effect: %s", n, getattr(cfg, n), reason)
                warned.append(n)
    return warned


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "value") and isinstance(v.value, (str, int)):  # enums
        return v.value
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if callable(v):
        return getattr(v, "__name__", type(v).__name__)
    return str(v)


def settings_dict(cfg: Any) -> dict[str, Any]:
    """Every init field of a config dataclass as a JSON-ready dict (secrets left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        if not f.init or f.name.endswith("_token"):
            continue
        out[f.name] = _plain(getattr(cfg, f.name))
    return out


class RagkitConfigMixin:
    """What ragkit's training configs share (``CORDConfig``, ``PSGRPOConfig``); mixed in before the
    ``TrainingArguments`` subclass so these methods win. It holds no fields."""

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warm-up steps of the schedule: from ``warmup_ratio`` when set, else ``warmup_steps``."""
        steps = warmup_steps_for(self, num_training_steps)
        return super().get_warmup_steps(num_training_steps) if steps is None else steps  # type: ignore[misc]

    def settings(self) -> dict[str, Any]:
        """Every setting as plain JSON values (what the run's ``*_settings.json`` holds)."""
        return settings_dict(self)


def settings_diff(saved: Mapping[str, Any], current: Mapping[str, Any],
                  may_change: frozenset[str] = RESUME_MAY_CHANGE) -> dict[str, tuple[Any, Any]]:
    """``{name: (saved, current)}`` for every setting that differs, except those in ``may_change``.

    A setting missing on one side (a version that added a field) reads as ``None`` there; numbers
    compare with a relative tolerance of 1e-12 (JSON round trips).
    """
    diff: dict[str, tuple[Any, Any]] = {}
    for k in sorted(set(saved) | set(current)):
        if k in may_change:
            continue
        a, b = saved.get(k), current.get(k)
        if _plain(a) != _plain(b):
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                    and not isinstance(b, bool) and math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0):
                continue
            diff[k] = (a, b)
    return diff
