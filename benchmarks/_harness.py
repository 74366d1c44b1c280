"""The benchmarks' shared harness: machine info, the shared data folder, relative paths, JSON output.

Every script in ``benchmarks/`` runs as ``python3 benchmarks/NAME.py``, so this module is importable
as ``_harness`` (the script's folder is first on ``sys.path``).

The shared data folder is ``../shared/data`` next to the repository root, or the folder named by the
environment variable ``RAGKIT_SHARED_DATA``. Results JSON records paths relative to that folder (as
``../shared/data/...``) or to the repository root, never an absolute machine path.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
"""The repository root."""

ENV_VAR = "RAGKIT_SHARED_DATA"

REFERENCE_GGUF_CMD = "bash ../shared/tools/get_qwen05.sh"
"""Assembles the reference generator (Qwen2.5-Coder-0.5B-Instruct, one GGUF file) and prints its path."""


def shared_root() -> Path:
    """The shared data folder: ``$RAGKIT_SHARED_DATA`` or ``../shared/data`` from the repository root."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser().resolve() if env else ROOT.parent / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """A path inside the shared data folder; a clear error when the folder is absent.

    Raises
    ------
    FileNotFoundError
        When the shared data folder does not exist (set ``RAGKIT_SHARED_DATA`` to where it lives).
    """
    base = shared_root()
    if not base.is_dir():
        raise FileNotFoundError(
            f"shared data folder {base} not found: put the data at ../shared/data next to the repository "
            f"or set the environment variable {ENV_VAR} to its folder (or pass the data file explicitly)")
    return base.joinpath(*parts)


def rel(path: str | os.PathLike[str] | None) -> str | None:
    """``path`` as recorded in results JSON: ``../shared/data/...``, repo-relative, or ``~/...``.

    A path inside an installed package is recorded as ``<site-packages>/...``; a path under none of
    these is returned as given (a scratch name such as a temp folder).
    """
    if path is None:
        return None
    p = Path(path).expanduser()
    if "site-packages" in p.parts:
        i = p.parts.index("site-packages")
        return "/".join(("<site-packages>", *p.parts[i + 1:]))
    try:
        p = p.resolve()
    except OSError:  # pragma: no cover
        pass
    for base, name in ((shared_root(), "../shared/data"), (ROOT, None), (Path.home(), "~")):
        try:
            tail = p.relative_to(base.resolve())
        except (ValueError, OSError):
            continue
        return str(tail) if name is None else f"{name}/{tail}"
    return str(path)


def model_label(name: str) -> str:
    """A generator's name as recorded in results JSON: a local file or folder via :func:`rel`, a hub id as is."""
    return str(rel(name)) if os.path.isabs(name) else name


def cpu_name() -> str:
    """The CPU model name (``/proc/cpuinfo``) or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info(device: str | None = None) -> dict[str, Any]:
    """Platform, CPU, Python, torch/transformers versions and the device (``cuda`` when available)."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0],
                            "cpu": cpu_name(), "cpu_count": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if str(device).startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        info["torch"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        info["transformers"] = None
    info["device"] = device or "cpu"
    return info


def write_result(path: str | os.PathLike[str], payload: dict[str, Any], device: str | None = None) -> None:
    """Write ``payload`` as JSON atomically (``ragkit.io.write_json``), with ``machine`` added.

    A ``machine`` entry already in ``payload`` is kept: a dict is merged over :func:`machine_info`,
    a string is kept as ``machine["note"]``.
    """
    from ragkit.io import write_json

    info = machine_info(device)
    given = payload.get("machine")
    if isinstance(given, dict):
        info.update(given)
    elif given is not None:
        info["note"] = given
    write_json(path, {**payload, "machine": info})


def gpu_epilog(script: str, example_args: str | None, note: str | None = None, generator: bool = True) -> str:
    """An ``argparse`` epilog: how to reproduce ``script``'s table on a GPU with a hub model, and offline.

    Use it with ``formatter_class=argparse.RawDescriptionHelpFormatter`` so the lines stay as written.

    Parameters
    ----------
    script : str
        The script's file name in ``benchmarks/`` (``"cord.py"``).
    example_args : str or None
        The flags of the GPU command line, only flags the script has (``"--model Qwen/Qwen2.5-7B-Instruct
        --device cuda --out benchmarks/results/cord-gpu.json"``); ``None`` when the script has no GPU run
        (``note`` then says why, and no offline line is added).
    note : str, optional
        One more paragraph (what differs on a GPU, what the hub model replaces).
    generator : bool
        Whether the script's ``--model`` takes a generator; then the offline line names the reference
        GGUF (:data:`REFERENCE_GGUF_CMD`). ``False``: only the embedder or nothing downloads.

    Returns
    -------
    str
        The epilog text.

    Raises
    ------
    ValueError
        When ``script`` is not a file in ``benchmarks/`` (pass the file name, e.g. ``"cord.py"``).
    """
    if not (ROOT / "benchmarks" / script).is_file():
        raise ValueError(f"gpu_epilog: no benchmarks/{script}; pass the script's file name, e.g. 'cord.py'")
    if example_args is None:
        return note.strip() if note else ""
    lines = ["GPU with a hub model (results as benchmarks/results/*-gpu.json; index: benchmarks/README.md):",
             f"  python3 benchmarks/{script} {example_args.strip()}"]
    if note:
        lines.append(note.strip())
    if generator:
        lines += ["Offline (HF_HUB_OFFLINE=1, e.g. a GPU machine without internet: copy the weights there): pass a",
                  f'local folder or the reference generator\'s GGUF, --model "$({REFERENCE_GGUF_CMD})" '
                  "(it prints the path)."]
    else:
        lines.append("Offline (HF_HUB_OFFLINE=1): the embedded defaults need no download; pass a local folder "
                     "instead of a hub id.")
    return "\n".join(lines)
