"""Argument groups shared by the ``ragkit`` commands, and the one way results are printed/written.

One vocabulary of flags across every command:

* model: ``--model --device --template --passage-max-tokens --batch-size``
  (old ``--passage-tokens`` is a hidden alias);
* output: ``--out`` (the file a command writes, or with ``folder=True`` the folder) ``--json``
  (a boolean: print the result as JSON) ``--quiet`` ``-v`` (``--overwrite`` with folders);
* data: ``--dataset --data-file --limit`` (old ``--data`` is a hidden alias);
* ``-k/--k`` for every count of passages.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = [
    "add_model_args",
    "add_dtype_arg",
    "add_output_args",
    "add_data_args",
    "add_k_arg",
    "add_verbosity_args",
    "positive_int",
    "positive_float",
    "non_negative_int",
    "int_between",
    "float_between",
    "seed_int",
    "emit",
    "set_requirements",
]


MAX_COUNT = 2**31 - 1
"""Largest count a flag takes: beyond it NumPy, torch and the tokenizers overflow ("cannot convert",
"Maximum allowed dimension exceeded") deep inside a run instead of naming the flag."""
MAX_SEED = 2**32 - 1
"""Seeds are 0..2**32-1 (NumPy's and torch's common range)."""


def _shown(s: str) -> str:
    """``s`` for an error message: a 5,000-digit argument is shortened, not echoed whole."""
    return repr(s) if len(s) <= 40 else repr(s[:20]) + f"... ({len(s):,} characters)"


def _int_between(s: str, lo: int, hi: int = MAX_COUNT) -> int:
    try:
        v = int(s)
    except ValueError as e:  # also a number of over 4,300 digits (Python's int-parsing limit)
        raise argparse.ArgumentTypeError(f"expected a whole number, got {_shown(s)}") from e
    if v < lo:
        raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
    if v > hi:
        raise argparse.ArgumentTypeError(f"must be at most {hi:,}, got {_shown(s)}")
    return v


def _int_at_least(s: str, lo: int) -> int:
    return _int_between(s, lo)


def int_between(lo: int, hi: int) -> Any:
    """``argparse`` type factory: a whole number in ``[lo, hi]`` (the error names the range)."""
    def parse(s: str) -> int:
        return _int_between(s, lo, hi)
    parse.__name__ = f"int_{lo}_{hi}"
    return parse


def seed_int(s: str) -> int:
    """``argparse`` type: a seed, 0..2**32-1 (``-1`` and 30-digit seeds are refused by name, not by NumPy)."""
    return _int_between(s, 0, MAX_SEED)


def positive_int(s: str) -> int:
    """``argparse`` type: an integer >= 1 (``--limit -1`` is refused, not read as "all")."""
    return _int_at_least(s, 1)


def _float_above(s: str, low: float, strict: bool, high: float | None = None) -> float:
    import math

    try:
        v = float(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a number, got {_shown(s)}") from e
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {low:g}, got {_shown(s)}")
    if high is not None and v > high:
        raise argparse.ArgumentTypeError(f"must be at most {high:g}, got {_shown(s)}")
    return v


def float_between(low: float, high: float, strict: bool = True) -> Any:
    """``argparse`` type factory: a finite number above ``low`` (``>=`` with ``strict=False``) and at
    most ``high``."""
    def parse(s: str) -> float:
        return _float_above(s, low, strict, high)
    parse.__name__ = f"float_{low:g}_{high:g}"
    return parse


def positive_float(s: str) -> float:
    """``argparse`` type: a finite number > 0 (``nan``, ``inf``, 0 and negatives are refused)."""
    return _float_above(s, 0.0, strict=True)


def non_negative_float(s: str) -> float:
    """``argparse`` type: a finite number >= 0."""
    return _float_above(s, 0.0, strict=False)


def non_negative_int(s: str) -> int:
    """``argparse`` type: an integer >= 0."""
    return _int_at_least(s, 0)


def add_dtype_arg(p: Any) -> None:
    """``--dtype``: the generator's weights (``auto``: bf16 on CUDA, fp32 on a CPU)."""
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="the generator's weights: auto (bf16 on CUDA, else fp32), float32, bfloat16 (about 2x faster "
                        "on CPUs with AVX512-BF16 or AMX: benchmarks/cpu_dtype.py), float16")


def add_model_args(p: argparse.ArgumentParser, passage_max_tokens: int | None = None, batch_size: int | None = 8,
                   template: bool = True) -> None:
    """``--model --device --dtype --template --passage-max-tokens --batch-size`` (generator settings).

    ``template=False`` / ``batch_size=None`` leave out the flags a command cannot honour.
    """
    g = p.add_argument_group("generator")
    g.add_argument("--model", default=None,
                   help="generator: hub id, local folder or .gguf (default: embedded SmolLM2-135M-Instruct)")
    g.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1, mps")
    add_dtype_arg(g)
    if template:
        g.add_argument("--template", default="auto",
                       help="prompt template: auto (chat when the model has one), short, chat, plain")
    g.add_argument("--passage-max-tokens", type=non_negative_int, default=passage_max_tokens,
                   help="cut each passage to this many tokens"
                        + (f" (default {passage_max_tokens})" if passage_max_tokens else " (default: no cut)"))
    g.add_argument("--passage-tokens", dest="passage_max_tokens", type=non_negative_int, help=argparse.SUPPRESS)
    if batch_size is not None:
        g.add_argument("--batch-size", type=positive_int, default=batch_size,
                       help=f"prompts per forward pass (default {batch_size})")


def add_verbosity_args(p: argparse.ArgumentParser, top: bool = False) -> None:
    """``--quiet`` and ``-v``; on a sub-command they default to "unset" so the top-level value stands."""
    default_q: Any = False if top else argparse.SUPPRESS
    default_v: Any = 0 if top else argparse.SUPPRESS
    p.add_argument("--quiet", action="store_true", default=default_q, help="no progress bars")
    p.add_argument("-v", "--verbose", action="count", default=default_v,
                   help="more logging (-vv: debug); tracebacks of unexpected errors")


def add_output_args(p: argparse.ArgumentParser, folder: bool = False, out_help: str | None = None,
                    required: bool = False, default: str | None = None, result: bool = True) -> None:
    """``--out --json`` (+ ``--overwrite`` with ``folder=True``); ``--quiet``/``-v`` come with every command.

    With ``folder=False``, ``--out`` is the JSON file :func:`emit` writes the result to (``result=False``:
    a file the command writes itself, e.g. a label file, which :func:`emit` leaves alone); with
    ``folder=True`` it is the artifact folder the command writes, and ``--overwrite`` allows
    replacing another ragkit artifact there (never a folder of other files).
    """
    g = p.add_argument_group("output")
    g.add_argument("--out", required=required, default=default,
                   help=out_help or ("folder to write" if folder else "also write the JSON result to this file"))
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    if folder:
        g.add_argument("--overwrite", action="store_true",
                       help="replace another ragkit artifact or a file at --out (never a folder of other files)")
    p.set_defaults(_out_is_folder=folder, _out_is_result=result and not folder)


def add_data_args(p: argparse.ArgumentParser, required: bool = False, limit: int | None = None,
                  dataset_help: str | None = None) -> None:
    """``--dataset --data-file --limit`` (``--data`` is a hidden alias of ``--data-file``)."""
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=None,
                   help=dataset_help or "hotpotqa | msmarco | nq-open (default: told from --data-file's content)")
    # not argparse-required: the hidden alias --data must satisfy it too (checked by ragkit.cli.main)
    g.add_argument("--data-file", default=None,
                   help=("(required) " if required else "")
                   + "local dataset file: HotpotQA JSONL, MS MARCO QnA JSON, NQ-open JSONL(.gz)")
    g.add_argument("--data", dest="data_file", help=argparse.SUPPRESS)
    p.set_defaults(_data_file_required=required)
    g.add_argument("--limit", type=positive_int, default=limit,
                   help="first N questions" + (f" (default {limit})" if limit else " (default: all)"))


def add_k_arg(p: argparse.ArgumentParser, default: int = 10, help: str = "passages per question",
              type: Any = positive_int) -> None:
    """``-k/--k``: how many passages (the same spelling in every command)."""
    p.add_argument("-k", "--k", type=type, default=default, help=f"{help} (default {default})")


def set_requirements(p: argparse.ArgumentParser, requires: Any) -> None:
    """Declare a command's optional dependencies: ``requires(args)`` returns ``[(modules, what), ...]``.

    :func:`ragkit.cli.main` checks them (:func:`ragkit.types.require_extra`) before the command
    starts, so a missing extra is named in a second instead of after minutes of work.
    """
    p.set_defaults(_requires=requires)


def emit(result: Any, args: argparse.Namespace, text: str | None = None, write: bool = True) -> None:
    """Print ``result`` and write it to ``--out``.

    With ``--json`` the JSON goes to stdout and ``text`` (a readable summary) to stderr, so that
    ``ragkit ... --json | jq`` works; without it ``text`` goes to stdout.

    The JSON file is written (atomically, :func:`ragkit.io.write_json`) only when ``write`` and the
    command's ``--out`` is a result file (``add_output_args(folder=False)``).
    """
    text = None if not text else (text if text.endswith("\n") else text + "\n")
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n")
        if text and not getattr(args, "quiet", False):
            sys.stderr.write(text)  # the readable summary stays visible; stdout holds only JSON
    elif text:
        sys.stdout.write(text)
    out = getattr(args, "out", None)
    if write and out and getattr(args, "_out_is_result", False):
        from ragkit.io import write_json

        write_json(out, result)
