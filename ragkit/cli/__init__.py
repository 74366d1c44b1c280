"""The ``ragkit`` command line: the top layer, it imports the library and nothing imports it.

One module per command group, each with ``register(subparsers)``:

========================  ==========================================
``ragkit.cli.index``      ``index``, ``search``
``ragkit.cli.rerank``     ``rerank``, ``bias-profile``
``ragkit.cli.ask``        ``ask``
``ragkit.cli.eval``       ``eval`` (+ ``eval sweep``, ``eval consistency``)
``ragkit.cli.train``      ``train cord``, ``train psgrpo``
``ragkit.cli.distill``    ``distill`` (+ ``distill labels``)
``ragkit.cli.serve``      ``serve`` (a reranker over HTTP)
========================  ==========================================

Shared argument groups and the one way to print/write a result live in
:mod:`ragkit.cli._common`. Handlers import heavy dependencies lazily so ``ragkit --help`` is fast.

Errors: a :class:`~ragkit.types.RagkitError`, ``ValueError``, ``FileNotFoundError``,
``RuntimeError`` or ``OSError`` is printed as one line ``ragkit: error: <message>`` (exit 1);
any other exception is a bug: one line and "run again with -v for the traceback" (exit 1), or
the traceback itself with ``-v``.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle  # only for its exception type: ragkit never loads a pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from ragkit.cli import ask, distill, index, rerank, serve, train
from ragkit.cli import eval as eval_cmd
from ragkit.cli._common import add_verbosity_args, emit
from ragkit.types import RagkitError

__all__ = ["main", "build_parser", "emit"]

_GROUPS = (index, rerank, ask, eval_cmd, train, distill, serve)

_USER_ERRORS = (RagkitError, ValueError, FileNotFoundError, RuntimeError, OSError)


def _version() -> str:
    from ragkit import __version__

    return __version__


def _subparsers_of(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    for action in parser._actions:  # argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):
            for sp in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                out.append(sp)
                out.extend(_subparsers_of(sp))
    return out


def _show_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return show


def build_parser() -> argparse.ArgumentParser:
    """The ``ragkit`` parser with every command group registered."""
    parser = argparse.ArgumentParser(
        prog="ragkit",
        description="Order- and wording-robust retrieval-augmented generation.",
    )
    parser.add_argument("--version", action="version", version=f"ragkit {_version()}")
    add_verbosity_args(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in _GROUPS:
        group.register(sub)
    for sp in _subparsers_of(parser):
        if "--quiet" not in sp._option_string_actions:
            add_verbosity_args(sp)
        if sp.get_default("func") is None:  # a group without a handler of its own: list its commands
            sp.set_defaults(func=_show_help(sp))
    return parser


def _check_device(args: argparse.Namespace) -> None:
    """``--device cuda`` on a machine without CUDA: say so before any model loads."""
    dev = str(getattr(args, "device", "") or "")
    if dev and dev != "auto":
        import torch

        try:
            torch.device(dev)
        except (RuntimeError, ValueError):
            raise RagkitError(f"--device {dev[:40]!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise RagkitError(f"--device {dev}: this machine has no CUDA device; run on the CPU with "
                              "--device cpu (or --device auto, which picks CUDA when there is one)")


def _check_out(args: argparse.Namespace) -> None:
    """An ``--out`` file that is a folder is refused before any work (not after a whole evaluation)."""
    out = getattr(args, "out", None)
    if out and getattr(args, "_out_is_folder", True) is False and os.path.isdir(out):
        raise RagkitError(f"--out {out} is a folder; pass a file path, e.g. --out {os.path.join(out, 'result.json')}")


def _check_extras(args: argparse.Namespace) -> None:
    """The optional packages this command needs with these flags (``set_requirements``), before any work."""
    from ragkit.types import require_extra

    requires = getattr(args, "_requires", None)
    for modules, what in (requires(args) if requires else ()):
        require_extra(modules, what)


def _check_models(args: argparse.Namespace) -> None:
    """An explicit ``--model`` / ``--embedder`` that cannot load fails here, in about a second (not after
    an index build and a minute of hub retries): :func:`ragkit.models.check_model_available`."""
    from ragkit.models import check_model_available, looks_like_hub_id

    for attr, kind in (("model", "generator"), ("embedder", "embedder")):
        name = getattr(args, attr, None)
        if isinstance(name, str) and name:
            _check_url(f"--{attr}", name)
        # an --embedder given with an --index must match the index's own: loading the index says
        # which embedder built it, the more useful error when the two differ
        if attr == "embedder" and getattr(args, "index", None):
            continue
        # hub ids only: a local path is checked where it loads, after the command's own argument checks
        if isinstance(name, str) and name and looks_like_hub_id(name) and not os.path.exists(name):
            check_model_available(name, kind=kind)


def _check_url(flag: str, name: str) -> None:
    """A served model's URL (``http://host:port/v1``) with no host or a port outside 1-65535 is named
    here, not after five connection retries or as an internal ``InvalidURL``; credentials are masked."""
    from urllib.parse import urlsplit

    from ragkit.io import redact_url

    if not name.lower().startswith(("http://", "https://")):
        return
    example = "e.g. http://127.0.0.1:8000/v1"
    try:
        parts = urlsplit(name)
        port = parts.port
    except ValueError as e:
        raise RagkitError(f"{flag} {redact_url(name)}: not a valid URL ({e}); a port is 1-65535, {example}") from None
    if not parts.hostname:
        raise RagkitError(f"{flag} {redact_url(name)}: the URL names no host; {example}")
    if port == 0:
        raise RagkitError(f"{flag} {redact_url(name)}: port 0 cannot be connected to; a port is 1-65535, {example}")


_LOCKED_COMMANDS = ("index", "eval", "distill", "train", "bias-profile")
"""Commands whose outputs take long to make: a second run writing the same output stops at once."""


def _lock_targets(args: argparse.Namespace) -> list[str]:
    """The outputs of a long-running command, locked for the run (:func:`ragkit.io.exclusive_lock`).

    ``--out`` (``ragkit eval``: its default report too) and a training run's ``--output_dir``.
    """
    if getattr(args, "command", None) not in _LOCKED_COMMANDS:
        return []
    out = getattr(args, "out", None)
    targets = [str(t) for t in (out, getattr(args, "output_dir", None)) if t]
    return list(dict.fromkeys(os.path.abspath(t) for t in targets))


def _run_locked(func: Any, args: argparse.Namespace) -> Any:
    """Run ``func(args)`` holding the lock of every output it writes (two runs never race on one)."""
    from contextlib import ExitStack

    from ragkit.io import exclusive_lock

    with ExitStack() as stack:
        for target in _lock_targets(args):
            stack.enter_context(exclusive_lock(target, what=f"output of `ragkit {args.command}`"))
        return func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragkit`` console script (and ``python -m ragkit.cli``)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version (0) and usage errors (2, already printed by argparse)
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    verbose = int(getattr(args, "verbose", 0) or 0)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "quiet", False):
        os.environ["RAGKIT_NO_PROGRESS"] = "1"
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # also silences transformers' weight-loading bar
    func: Any = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    if getattr(args, "_data_file_required", False) and not getattr(args, "data_file", None):
        print(f"ragkit {args.command}: error: the following arguments are required: --data-file", file=sys.stderr)
        return 2
    default_out = getattr(args, "_default_out", None)
    if default_out is not None and not getattr(args, "out", None):
        args.out = default_out(args)  # before the lock: the lock and the run use the same file
    try:
        _check_out(args)
        _check_device(args)
        _check_extras(args)
        _check_models(args)
        rc = _run_locked(func, args)
    except KeyboardInterrupt:
        print("ragkit: interrupted", file=sys.stderr)
        return 130
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) refused a pickled .bin / .pt
        if verbose:
            traceback.print_exc()
        print("ragkit: error: refused to load pickled model weights (a .bin/.pt file): ragkit loads only "
              f"safetensors; save the model with safe_serialization=True ({' '.join(str(e).split())[:120]})",
              file=sys.stderr)
        return 1
    except _USER_ERRORS as e:
        if verbose:
            traceback.print_exc()
        text = str(e)
        if isinstance(e, OSError) and e.strerror:  # "[Errno 28] ..." -> the message and the path it names
            text = e.strerror + (f": {e.filename}" if e.filename else "")
        msg = " ".join(text.split()) or type(e).__name__
        print(f"ragkit: error: {msg}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: its traceback helps, but only when asked for
        if verbose:
            traceback.print_exc()
        else:
            msg = " ".join(str(e).split())
            print(f"ragkit: error: {type(e).__name__}: {msg} (an unexpected error; "
                  "run again with -v for the traceback)", file=sys.stderr)
        return 1
    return int(rc or 0)
