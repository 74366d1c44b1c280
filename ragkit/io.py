"""Small file utilities: atomic writes, JSONL, progress-bar switch. No pickle anywhere."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_text",
    "atomic_dir",
    "read_jsonl",
    "write_jsonl",
    "append_jsonl",
    "progress_enabled",
    "progress",
]


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(path: str | os.PathLike[str], overwrite: bool = True) -> Iterator[Path]:
    """Yield a temp folder beside ``path``; on success it replaces ``path`` in one rename.

    A crash inside the block leaves any existing ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True or choose another folder")
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(path.name + ".old-" + tmp.name.rsplit("-", 1)[-1])
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file (``.gz`` too); a bad line raises ``ValueError`` naming the line."""
    import gzip

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    out: list[dict[str, Any]] = []
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}); fix or remove that line") from e
    return out


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Write rows as JSONL atomically."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def append_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append rows and fsync (used by resumable runs: a killed run loses at most a partial line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def progress_enabled(show: bool | None = None) -> bool:
    """Progress bars are on unless ``show=False`` or ``RAGKIT_NO_PROGRESS`` is set."""
    if show is not None:
        return show
    return not os.environ.get("RAGKIT_NO_PROGRESS")


def progress(iterable: Iterable[Any], show: bool | None = None, **kw: Any) -> Iterable[Any]:
    """Wrap ``iterable`` in a ``tqdm`` bar when progress is enabled."""
    if not progress_enabled(show):
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, **kw)
