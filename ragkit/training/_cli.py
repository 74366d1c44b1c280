"""``ragkit train cord|psgrpo`` and ``ragkit distill``: each method module registers its own parser."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

_TRAIN_MODULES = ("ragkit.training.cord_cli", "ragkit.training.psgrpo_cli")
_TOP_MODULES = ("ragkit.training.distill_cli",)


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return None


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="fine-tune a generator against position/wording bias")
    train_sub = train.add_subparsers(dest="train_method", metavar="METHOD")
    for name in _TRAIN_MODULES:
        mod = _optional(name)
        if mod is not None:
            mod.register(train_sub)
    for name in _TOP_MODULES:
        mod = _optional(name)
        if mod is not None:
            mod.register(sub)
