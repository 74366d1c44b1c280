"""``ragkit train cord|psgrpo``: the command line generated from the training configs.

Every option of ``ragkit train cord`` is a field of :class:`ragkit.training.cord.CORDConfig` (a
``transformers.TrainingArguments``), every option of ``ragkit train psgrpo`` a field of
:class:`ragkit.training.psgrpo.PSGRPOConfig` (a ``trl.GRPOConfig``): the options, their help
texts and defaults come from the dataclass fields through ``transformers.HfArgumentParser``'s
field parser, so a knob is written once. The fields are added the first time the sub-command is
parsed (``ragkit --help`` does not import transformers or TRL).

``--config run.yaml`` (or ``run.json``) sets any field from a file whose keys are the field names;
options given on the command line win. The same command runs on several GPUs::

    ragkit train cord --config run.yaml
    accelerate launch -m ragkit.cli train cord --config run.yaml --learning_rate 5e-4

Older spellings (``--lr``, ``--batch-size``, ``--grad-accum``, ``--generations``, ``--resume``,
``--no-merge``, ``--data``, ``--passage-tokens``, ``--lambda``) stay as hidden aliases.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import logging
import sys
import typing
from collections.abc import Sequence
from typing import Any

from ragkit.cli._common import add_output_args, emit, set_requirements

logger = logging.getLogger(__name__)

__all__ = ["ConfigParser", "register", "run_cord", "run_psgrpo"]

_LEGACY_COMMON = {"--lr": "learning_rate", "--resume": "resume_from_checkpoint", "--data": "data_file",
                  "--passage-tokens": "passage_max_tokens"}
_LEGACY = {
    "cord": {**_LEGACY_COMMON, "--batch-size": "per_device_train_batch_size",
             "--grad-accum": "gradient_accumulation_steps", "--lambda": "lam"},
    "psgrpo": {**_LEGACY_COMMON, "--generations": "num_generations"},
}


def _find_config(args: Sequence[str]) -> str | None:
    """The value of ``--config FILE`` / ``--config=FILE`` in ``args`` (the last one wins)."""
    path = None
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
    return path


def _whole_number(s: str) -> int:
    """``argparse`` type of the trainers' integer settings: a whole number of magnitude at most 2**31-1
    (negative values keep their meaning, e.g. ``--max_steps -1``)."""
    from ragkit.cli._common import MAX_COUNT

    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s[:40]!r}") from None
    if abs(v) > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be between -{MAX_COUNT:,} and {MAX_COUNT:,}, got {s[:40]!r}")
    return v


def _finite_number(s: str) -> float:
    """``argparse`` type of the trainers' float settings: a finite number (``nan``/``inf`` refused)."""
    import math

    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s[:40]!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {s[:40]!r}")
    return v


class ConfigParser(argparse.ArgumentParser):
    """A sub-command parser whose options are the fields of a config dataclass.

    Parameters
    ----------
    config
        ``(module, class name)`` of the config dataclass; imported and turned into options on
        first use (:meth:`config_class`).
    legacy
        Hidden old spellings: ``{"--lr": "learning_rate", ...}``.
    """

    def __init__(self, *args: Any, config: tuple[str, str] | None = None, legacy: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self._config_ref = config
        self._legacy = dict(legacy or {})
        self._config_cls: type | None = None
        if config is not None:
            self.add_argument("--config", metavar="FILE", default=None,
                              help="YAML (.yaml/.yml) or JSON file of settings: keys are the option names below "
                                   "(e.g. learning_rate: 5e-4); options given on the command line win")

    # -- options from the dataclass
    def config_class(self) -> type:
        """The config dataclass; its fields become options the first time this is called."""
        if self._config_cls is not None or self._config_ref is None:
            return self._config_cls  # type: ignore[return-value]
        module, name = self._config_ref
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError as e:
            self.error(f"{self.prog} needs {getattr(e, 'name', None) or e}: pip install \"ragkit[train]\"")
        from transformers import HfArgumentParser

        hints = typing.get_type_hints(cls)
        own = {n: i for i, n in enumerate(vars(cls).get("__annotations__", {}))}  # declared by the class itself
        base = cls.__mro__[1].__name__
        groups = {True: self.add_argument_group(f"{name}: the method's settings and defaults (keys of --config)"),
                  False: self.add_argument_group(f"{base} settings (keys of --config too)")}
        fields = [f for f in dataclasses.fields(cls) if f.init]
        for f in sorted(fields, key=lambda f: (f.name not in own, own.get(f.name, 0))):  # the method's first
            f.type = hints[f.name]
            HfArgumentParser._parse_dataclass_field(groups[f.name in own], f)
        for act in self._actions:  # plain int/float fields: a 30-digit or non-finite value is named here,
            if act.type is int:    # not as an islice/overflow error deep inside the trainer
                act.type = _whole_number
            elif act.type is float:
                act.type = _finite_number
        self._add_legacy()
        self._config_cls = cls
        return cls

    def _add_legacy(self) -> None:
        by_dest = {a.dest: a for a in self._actions if a.option_strings}
        for flag, dest in self._legacy.items():
            act = by_dest.get(dest)
            if act is None or flag in self._option_string_actions:
                continue
            self.add_argument(flag, dest=dest, type=act.type, nargs=act.nargs, const=act.const,
                              choices=act.choices, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if "merge_lora" in by_dest and "--no-merge" not in self._option_string_actions:
            self.add_argument("--no-merge", dest="merge_lora", action="store_false", default=argparse.SUPPRESS,
                              help=argparse.SUPPRESS)

    # -- --config FILE
    def _apply_config_file(self, path: str) -> None:
        from ragkit.training.config import check_known_keys, read_config_file

        try:
            values = read_config_file(path)
            check_known_keys(self.config_class(), values.keys(), source=path)
        except (ValueError, FileNotFoundError) as e:
            self.error(str(e))
        except RecursionError:
            self.error(f"{path}: nested too deeply to read (thousands of levels); a config file is a flat mapping "
                       "of setting: value")
        for key, value in values.items():
            # every option writing this field (e.g. --merge_lora and --no_merge_lora) gets the file's value
            acts = [a for a in self._actions
                    if a.dest == key and a.option_strings and a.default is not argparse.SUPPRESS]
            if not acts:  # cannot happen for a dataclass field; be safe
                self.error(f"{path}: setting {key!r} has no command-line option")
            for act in acts:
                act.default = value
                act.required = False

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self.config_class()
        arg_list = list(sys.argv[1:] if args is None else args)
        path = _find_config(arg_list)
        if path:
            self._apply_config_file(path)
        return super().parse_known_args(arg_list, namespace)


def _config_from_args(parser_cls: type, args: argparse.Namespace) -> Any:
    """Build the config dataclass from the parsed options (one value per field)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(parser_cls)
              if f.init and hasattr(args, f.name)}
    return parser_cls(**values)


def _text(summary: dict[str, Any]) -> str:
    keys = ("method", "global_step", "steps_this_run", "train_loss", "final_dir", "resumed_from")
    return "\n".join(f"{k}: {summary.get(k)}" for k in keys if k in summary)


def _requires(args: argparse.Namespace) -> list[tuple[list[str], str]]:
    """Optional packages of ``ragkit train cord|psgrpo`` with these settings (checked before any work)."""
    method = args.train_method
    out: list[tuple[list[str], str]] = []
    if method == "psgrpo":
        out.append((["trl", "datasets"], "ragkit train psgrpo"))
    if getattr(args, "lora", False) or (getattr(args, "lora_r", 0) or 0) > 0:
        out.append((["peft"], f"ragkit train {method} with LoRA"))
    return out


def run_cord(args: argparse.Namespace) -> int:
    """Handler of ``ragkit train cord``."""
    from ragkit.training.cord import CORDConfig, train_cord

    config = _config_from_args(CORDConfig, args)
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for --json
        summary: dict[str, Any] = train_cord(None, config)
    brief = {k: v for k, v in summary.items() if k != "log_history"}
    brief["last_log"] = next((h for h in reversed(summary.get("log_history", [])) if "loss" in h), None)
    emit(brief, args, _text(brief))
    return 0


def run_psgrpo(args: argparse.Namespace) -> int:
    """Handler of ``ragkit train psgrpo``: build paraphrase sets, train, print the summary."""
    from ragkit.training.psgrpo import PSGRPOConfig, train_psgrpo

    config = _config_from_args(PSGRPOConfig, args)
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for --json
        summary = dict(train_psgrpo(None, config))
    summary.pop("history", None)
    emit(summary, args, _text(summary))
    return 0


# method -> ((config module, config class), help, description, handler)
_METHODS: dict[str, tuple[tuple[str, str], str, str, Any]] = {
    "cord": (
        ("ragkit.training.cord", "CORDConfig"),
        "CORD: train the generator to answer consistently under passage reorderings",
        "CORD (Lee et al., NAACL 2025, arXiv 2412.14581): fine-tune a causal LM on (retriever order, "
        "perturbed order) prompt pairs run in one stacked forward. --loss cord: CE + lambda * KL(teacher || "
        "student) with the lower-CE ordering as a stop-gradient teacher; consistency: CE + lambda * JS; "
        "shuffle: CE on uniformly shuffled orders; score_aware: CE on score-aware perturbed orders; ce: CE on "
        "the retriever order. Every option is a field of CORDConfig (transformers.TrainingArguments). "
        "Multi-GPU: `accelerate launch -m ragkit.cli train cord --config run.yaml`.",
        run_cord,
    ),
    "psgrpo": (
        ("ragkit.training.psgrpo", "PSGRPOConfig"),
        "PS-GRPO: RL for consistent answers across paraphrased questions",
        "PS-GRPO (Hamman et al., NeurIPS 2025, arXiv 2510.04392): group-similarity GRPO over paraphrase "
        "sets on TRL's GRPOTrainer. Each question gets --paraphrases wordings, each wording "
        "--num_generations sampled answers, each answer is rewarded by consistency_weight times its similarity "
        "to the answers of the other wordings (+ gold_weight * F1 to the gold answer). The default, "
        "--consistency_weight 0, is GRPO with the accuracy reward alone (ragkit's pre-registered confirmation "
        "found no consistency gain from the term); --consistency_weight 1 is the paper's reward. Every option "
        "is a field of PSGRPOConfig (trl.GRPOConfig). GPU: --use_vllm; several GPUs: "
        "`accelerate launch -m ragkit.cli train psgrpo --config run.yaml`.",
        run_psgrpo,
    ),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ragkit train`` with its ``cord`` and ``psgrpo`` sub-commands."""
    train = subparsers.add_parser(
        "train", help="fine-tune a generator against position/wording bias (cord, psgrpo)",
        description="Fine-tune a generator: `ragkit train cord ...` or `ragkit train psgrpo ...`. "
                    "`ragkit train METHOD --help` lists every setting; `--config run.yaml` reads them from a file.")
    train_sub = train.add_subparsers(dest="train_method", metavar="{cord,psgrpo}", parser_class=ConfigParser)
    for method, (config, help_, description, handler) in _METHODS.items():
        p = train_sub.add_parser(method, config=config, legacy=_LEGACY[method], help=help_, description=description)
        add_output_args(p, out_help="also write the run summary JSON to this file")
        p.set_defaults(func=handler)
        set_requirements(p, _requires)
