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
