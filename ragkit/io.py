"""Small file utilities: atomic writes, JSONL, progress-bar switch. No pickle anywhere."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write_text",
    "atomic_dir",
    "artifact_kind",
    "check_writable_dir",
    "ARTIFACT_MARKER",
    "read_appended_jsonl",
    "exclusive_lock",
    "LockedError",
    "read_jsonl",
    "iter_jsonl",
    "write_jsonl",
    "write_json",
    "save_figure",
    "append_jsonl",
    "progress_enabled",
    "progress",
    "creation_mode",
    "temp_dir_beside",
    "redact_url",
]


def _umask() -> int:
    """The process's umask (read from ``/proc`` where it can be, so no thread sees it changed)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def creation_mode(path: str | os.PathLike[str], directory: bool = False) -> int:
    """Permission bits an atomic write gives ``path``: those of what it replaces (a folder for
    ``directory=True``, else a file), else what ``open``/``mkdir`` would give under the umask.

    ``tempfile.mkstemp``/``mkdtemp`` create private (0600/0700) temp files; renamed into place
    as they are, a report or index the user shares would become unreadable to others, and a
    rewritten file would lose the mode its owner gave it.
    """
    try:
        st = Path(path).stat()
        if stat.S_ISDIR(st.st_mode) == directory:
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return (0o777 if directory else 0o666) & ~_umask()


def temp_dir_beside(path: str | os.PathLike[str]) -> Path:
    """A new temp folder beside ``path`` (to be renamed onto it) with :func:`creation_mode`'s bits,
    not ``mkdtemp``'s private 0700."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        tmp.chmod(creation_mode(path, directory=True))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``.

    A ``path`` that exists and is not a regular file (``/dev/stdout``, a FIFO, a device) is
    written into, never replaced. A failed write (a full disk) raises an :class:`OSError` naming
    ``path`` and leaves no temp file; the previous ``path`` stays as it was.
    """
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # a stream or device: never replace it
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise OSError(e.errno, f"could not write {path}: {e.strerror}") from None
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = creation_mode(path)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(e.errno, f"could not write {path}: {e.strerror} ({e.filename or path.parent})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"could not write {path}: {e.strerror}; {path} was left as it was") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


ARTIFACT_MARKER = ".ragkit-artifact.json"
"""Name of the small JSON file (``{"kind": ..., "format": 1}``) that marks a folder written by ragkit."""

# Folders written before the marker existed are recognised by their own manifest file.
_LEGACY_MARKERS: dict[str, tuple[str, str]] = {
    "manifest.json": ("index", '"ragkit-index"'),
    "ragkit_distill.json": ("reranker", '"ragkit-distilled-reranker/'),
}


def artifact_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of ragkit artifact stored in folder ``path``, or ``None`` when it is not one.

    A folder is a ragkit artifact when it holds :data:`ARTIFACT_MARKER` (or, for folders written by
    older versions, an index manifest / a distilled-reranker metadata file).
    """
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return None
    marker = path / ARTIFACT_MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            return None
        return kind if isinstance(kind, str) else None
    for name, (kind, needle) in _LEGACY_MARKERS.items():
        f = path / name
        try:
            if f.is_file() and needle in f.read_text(encoding="utf-8")[:4096]:
                return kind
        except (OSError, UnicodeDecodeError):
            continue
    return None


def check_writable_dir(path: str | os.PathLike[str], kind: str, overwrite: bool = False) -> Path:
    """Check that ragkit may write a ``kind`` artifact folder at ``path``; raise ``FileExistsError`` if not.

    Writing may replace only

    * nothing (``path`` does not exist) or an empty folder;
    * a previous ragkit artifact of the same ``kind`` (recognised by its marker);
    * with ``overwrite=True``: a ragkit artifact of another kind, or a single regular file.

    A folder holding anything else (a user's files) is never replaced, ``overwrite`` or not: that is
    how ``ragkit index --out "$PWD"`` once deleted a project. Call it before any long work so that a
    bad ``--out`` is reported at once.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise FileExistsError(f"{path} is a dangling symbolic link; remove it or choose another --out")
    if not path.exists():
        return path
    if not path.is_dir():
        if overwrite:
            return path
        raise FileExistsError(
            f"{path} is an existing file, not a ragkit {kind} folder; choose another --out "
            "or pass --overwrite to replace that file"
        )
    if not any(path.iterdir()):
        return path
    found = artifact_kind(path)
    if found == kind:
        return path
    if found is not None:
        if overwrite:
            return path
        raise FileExistsError(
            f"{path} holds a ragkit {found}, not a {kind}; choose another --out or pass --overwrite to replace it"
        )
    raise FileExistsError(
        f"{path} is a folder holding files that ragkit did not write; ragkit never replaces such a "
        f"folder (even with --overwrite): choose a new or empty folder for the {kind}"
    )


@contextmanager
def atomic_dir(path: str | os.PathLike[str], kind: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside ``path``; on success it replaces ``path`` in one rename.

    What may be replaced is decided by :func:`check_writable_dir` (never a folder of the user's
    files). The folder gets an :data:`ARTIFACT_MARKER` naming ``kind`` so that a later write of the
    same kind may replace it. A crash inside the block leaves any existing ``path`` untouched.
    """
    path = Path(path)
    check_writable_dir(path, kind, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(path)
    try:
        yield tmp
        (tmp / ARTIFACT_MARKER).write_text(json.dumps({"kind": kind, "format": 1}) + "\n", encoding="utf-8")
        check_writable_dir(path, kind, overwrite)  # again: something may have appeared meanwhile
        if path.exists():
            old = path.with_name(path.name + ".old-" + tmp.name.rsplit("-", 1)[-1])
            os.replace(path, old)
            os.replace(tmp, path)
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def iter_text_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a text file, gunzipped when its first bytes are the gzip magic number.

    A truncated or damaged gzip stream and bytes that are not UTF-8 raise ``ValueError`` naming the
    file and the line reached (they were ``EOFError``/``UnicodeDecodeError`` tracebacks before).
    """
    import gzip

    path = Path(path)
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    i = 0
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as f:
            for i, line in enumerate(f, 1):
                yield i, line
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:  # a truncated or damaged .gz
        raise ValueError(f"{path}: the compressed file is damaged or cut short after line {i} ({e}); "
                         "download or compress it again") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{i + 1}: not UTF-8 text ({e.reason}); is it a JSONL file?") from e


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of a JSONL file (gzipped too), skipping blank lines.

    A line that is not JSON, or is JSON but not an object, raises ``ValueError`` naming the file and
    the line; a missing path or a folder raises ``FileNotFoundError`` / ``IsADirectoryError``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such file: {path}")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; pass a JSONL file (one JSON object per line)")
    for i, line in iter_text_lines(path):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}); fix or remove that line") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{i}: a JSON {type(row).__name__}, expected one JSON object per line "
                             '(e.g. {"id": ..., "text": ...})')
        yield i, row


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file (gzipped too); a bad line raises ``ValueError`` naming the line (:func:`iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path)]


def read_appended_jsonl(path: str | os.PathLike[str], with_lines: bool = False) -> list[Any]:
    """Read a JSONL file that ragkit appends to (resumable runs, labels, logs), repairing a torn tail.

    A run killed during a write, or a full disk, can leave the last line incomplete: it then lacks
    its newline (``append_jsonl`` writes each row with its ``"\\n"``). Such a line is dropped: the
    file is truncated to the end of the last complete line (so the next append starts on a clean
    line), a warning names the file and the dropped bytes, and the caller redoes the work it
    recorded. A bad newline-terminated line is real damage and raises ``ValueError`` naming it.

    Parameters
    ----------
    path
        The file; a missing file reads as no rows.
    with_lines
        Return ``(line_number, row)`` pairs instead of rows (for error messages of callers that
        validate the rows).
    """
    import logging

    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    # ``lines[-1]`` is what follows the last newline: empty for a clean file, else an unterminated tail
    body, tail = lines[:-1], lines[-1]
    out: list[Any] = []
    for i, raw in enumerate(body, 1):
        text = raw.strip()
        if not text:
            continue
        try:
            row = json.loads(text.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e}); this is damage inside the file, "
                             "not a torn last line: fix or remove that line") from e
        out.append((i, row) if with_lines else row)
    if tail.strip():
        try:
            row = json.loads(tail.strip().decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            good_end = len(data) - len(tail)
            logging.getLogger(__name__).warning(
                "%s: dropped a torn last line (%d bytes, left by an interrupted write); its work will be redone",
                path, len(tail))
            with open(path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
            return out
        out.append((len(body) + 1, row) if with_lines else row)
        with open(path, "ab") as f:  # a complete row that only lacked its newline: keep it, add one
            f.write(b"\n")
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


def resume_appended_jsonl(path: str | os.PathLike[str], header: dict[str, Any], resume: bool, key: str) -> list[Any]:
    """Open the append-only file of a resumable run: the rows already done, after a header line.

    The file's first line is ``header``; ``header[key]`` fingerprints the settings that produced
    the rows. With ``resume`` and the same fingerprint, the rows after the header come back (a torn
    tail is repaired by :func:`read_appended_jsonl`). A file without a complete header (new, empty,
    or torn while the header was written) holds nothing, so it is started over with ``header``.
    ``resume=False`` deletes the file first. Another fingerprint raises ``ValueError``: those rows
    are another run's work and are never mixed in nor silently deleted.
    """
    path = Path(path)
    if path.exists() and not resume:
        path.unlink()
    rows = read_appended_jsonl(path)
    if rows and (not isinstance(rows[0], dict) or rows[0].get(key) != header[key]):
        raise ValueError(f"{path} was written by a run with other settings; pass --no-resume to start over "
                         "or choose another --out")
    if not rows:
        path.unlink(missing_ok=True)
        append_jsonl(path, [header])
    return rows[1:]


class LockedError(RuntimeError):
    """Another live process holds the lock on an output that ragkit is about to write."""


@contextmanager
def exclusive_lock(target: str | os.PathLike[str], what: str = "output") -> Iterator[Path]:
    """Hold an exclusive lock on ``target`` (a file or folder ragkit writes) for the block.

    The lock is ``<target>.lock`` locked with ``fcntl.flock`` and holding the owner's PID. Two runs
    writing the same ``--out`` would both do all the work and race; the second one now stops at
    once with :class:`LockedError` naming the PID that holds it. A lock left by a killed process is
    stale by construction (the kernel drops ``flock`` locks of dead processes), so it never blocks
    a later run. On platforms without ``fcntl`` the block runs unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield Path(target)
        return
    target = Path(target)
    lock = target.with_name(target.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                owner = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "?"
            finally:
                os.close(fd)
            raise LockedError(
                f"{target} is in use by PID {owner} (another ragkit run writing the same {what}); "
                f"wait for it to finish or stop it, or choose another path (lock file: {lock})"
            ) from None
        try:  # the file we locked may have been unlinked by its previous owner meanwhile
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        yield target
    finally:
        try:
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)


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


def write_json(path: str | os.PathLike[str], obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temp file + ``os.replace``), newline-terminated.

    Non-ASCII text is kept as is; values JSON cannot hold (paths, dates, NumPy scalars) are written
    through ``str``.
    """
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=str) + "\n")


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int = 120, tight: bool = True) -> str:
    """Save a matplotlib figure to ``path`` atomically (temp file + rename) and close it.

    The format follows ``path``'s suffix (``.png``, ``.pdf``, ``.svg``); returns ``str(path)``.
    """
    import matplotlib.pyplot as plt

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    mode = creation_mode(p)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=p.suffix or ".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight" if tight else None)
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    finally:
        Path(tmp).unlink(missing_ok=True)
        plt.close(fig)
    return str(p)


def redact_url(text: str) -> str:
    """``text`` with the secrets of every ``scheme://`` URL in it masked, for logs, errors and responses.

    The password of the user-info part (``http://user:SECRET@host``) and every query-string value
    (``?api_key=SECRET``) become ``***``; a user name without a password is masked too (it may be a
    token, as in ``https://TOKEN@host``). Scheme, host, port and path are kept, so the message still
    says which server was meant.

    >>> redact_url("moi:http://bob:pw@h:8000/v1?key=abc&x=1")
    'moi:http://***:***@h:8000/v1?key=***&x=***'
    """
    import re
    from urllib.parse import parse_qsl, urlencode

    def one(m: re.Match[str]) -> str:
        scheme, rest = m.group(1), m.group(2)
        head, sep, frag = rest.partition("#")
        head, qsep, query = head.partition("?")
        netloc, slash, path = head.partition("/")
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            netloc = ("***:***" if ":" in userinfo else "***") + "@" + host
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, "***") for k, _ in pairs], safe="*") if pairs else "***"
        return f"{scheme}://{netloc}{slash}{path}{qsep}{query}{sep}{'***' if sep else ''}"

    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*)://([^\s'\"<>]*)", one, text)

