"""The ``ragkit`` command line.

Each sub-package contributes its sub-commands through a ``_cli.py`` module with a
``register(subparsers)`` function; handlers import their heavy dependencies lazily so that
``ragkit --help`` stays fast. Commands print results to stdout and can write JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "emit"]

_COMMAND_MODULES = (
    "ragkit.retrievers._cli",   # index, search
    "ragkit.debias._cli",       # rerank, ask, bias-profile
    "ragkit.eval._cli",         # eval (+ sweep, consistency)
    "ragkit.training._cli",     # train cord|psgrpo, distill
)


def emit(result: Any, json_path: str | None = None, as_json: bool = False) -> None:
    """Print ``result`` (as JSON with ``as_json``) and optionally write it to ``json_path``."""
    if as_json:
        print(json.dumps(result, indent=2, ensure_ascii=False, default=str))
    if json_path:
        from ragkit.io import atomic_write_text

        atomic_write_text(json_path, json.dumps(result, indent=2, ensure_ascii=False, default=str))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragkit",
        description="Order- and wording-robust retrieval-augmented generation.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:  # a sub-package without commands yet
            if e.name != name:
                raise
            continue
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragkit`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.quiet:
        import os

        os.environ["RAGKIT_NO_PROGRESS"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # also silences transformers' weight-loading bar
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"ragkit: error: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
