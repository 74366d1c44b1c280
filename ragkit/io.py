"""Small file utilities: atomic writes, JSONL, progress-bar switch. No pickle anywhere."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "atomic_write_text",
    "atomic_dir",
    "artifact_kind",
    "artifact_files",
    "check_writable_dir",
    "ARTIFACT_MARKER",
    "TEMP_MARKER",
    "json_digest",
    "file_sha256",
    "parse_json",
    "remove_stale_temps",
    "read_appended_jsonl",
    "exclusive_lock",
    "LockedError",
    "read_jsonl",
    "iter_jsonl",
    "write_jsonl",
    "write_json",
    "save_figure",
    "append_jsonl",
    "partial_path",
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


def temp_dir_beside(path: str | os.PathLike[str], mark: bool = False) -> Path:
    """A new temp folder ``<name>.tmp-*`` beside ``path`` (to be renamed onto it) with
    :func:`creation_mode`'s bits, not ``mkdtemp``'s private 0700.

    ``mark``: put :data:`TEMP_MARKER` inside, naming this process (host, PID, start time), so that
    a later save can tell a temp folder left by a killed run (its process is gone) from one in use
    or one that is not ragkit's (:func:`remove_stale_temps`). The caller removes the marker before
    renaming the folder into place.
    """
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".tmp-", dir=path.parent))
    try:
        tmp.chmod(creation_mode(path, directory=True))
        if mark:
            owner = {"ragkit_temp": 1, "host": socket.gethostname(), "pid": os.getpid(),
                     "start": _process_start(os.getpid())}
            (tmp / TEMP_MARKER).write_text(json.dumps(owner) + "\n", encoding="utf-8")
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
"""Name of the JSON file that marks a folder written by ragkit: ``{"kind", "format": 2, "files",
"marker_sha256"}``, where ``files`` maps every file ragkit wrote there (relative POSIX path) to its
SHA-256 and ``marker_sha256`` is the checksum of the marker's other fields (:func:`json_digest`)."""

TEMP_MARKER = ".ragkit-tmp.json"
"""Name of the file inside a temp folder of :func:`atomic_dir` naming the process that writes it."""

MARKER_FORMAT = 2
_MARKER_CHECKSUM = "marker_sha256"
_HEX64 = re.compile(r"[0-9a-f]{64}")

# Folders written before the marker existed are recognised by their own manifest file.
_LEGACY_MARKERS: dict[str, tuple[str, str]] = {
    "manifest.json": ("index", '"ragkit-index"'),
    "ragkit_distill.json": ("reranker", '"ragkit-distilled-reranker/'),
}
# Files a Hugging Face / sentence-transformers save writes at the top of a model folder: the
# only files ragkit replaces in a model or reranker folder written before markers listed files.
_LEGACY_MODEL_FILE = re.compile(
    r"(config|generation_config|tokenizer_config|tokenizer|special_tokens_map|added_tokens|vocab|merges"
    r"|sentence_bert_config|config_sentence_transformers|modules|adapter_config|chat_template"
    r"|preprocessor_config|ragkit_distill|ragkit_settings)\.(json|txt|jinja)"
    r"|(model|adapter_model)(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?"
    r"|tokenizer\.model|spiece\.model|sentencepiece\.bpe\.model|README\.md|" + re.escape(ARTIFACT_MARKER))


def json_digest(obj: Any, skip: str = "") -> str:
    """SHA-256 of ``obj`` (a JSON object) without its key ``skip``, as canonical JSON (sorted keys,
    no spaces, UTF-8): the self-checksum of ragkit's manifests and markers."""
    body = {k: v for k, v in obj.items() if k != skip}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_json(text: str | bytes, where: str | os.PathLike[str]) -> Any:
    """``json.loads(text)``; a document nested deeper than the parser can follow (e.g. 100,000 ``[``)
    raises ``ValueError`` naming ``where`` instead of a bare ``RecursionError`` ("maximum recursion
    depth exceeded"). Invalid JSON raises ``json.JSONDecodeError`` as ``json.loads`` does."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: the JSON is nested too deeply to read (thousands of levels of [ or {{); "
                         "it is damaged or not a ragkit input: pass the right file") from None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes (hex), read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain_rel(rel: Any) -> bool:
    """``rel`` is a non-empty relative POSIX path without ``.``/``..`` parts, backslash or NUL."""
    return (isinstance(rel, str) and bool(rel) and "\\" not in rel and "\x00" not in rel
            and not rel.startswith("/") and all(part not in ("", ".", "..") for part in rel.split("/")))


def _entries(folder: Path) -> list[str]:
    """Every entry under ``folder`` that is not a folder (files, symbolic links -- to folders too --,
    FIFOs, ...), as relative POSIX paths; symbolic links are never followed."""
    out: list[str] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        r = Path(root)
        for name in files + [d for d in dirs if (r / d).is_symlink()]:
            out.append((r / name).relative_to(folder).as_posix())
    return sorted(out)


def _read_json_file(path: Path) -> Any:
    try:
        if path.is_symlink() or not path.is_file():
            return None
        return parse_json(path.read_text(encoding="utf-8"), path)
    except (OSError, ValueError):
        return None


def _index_listing(folder: Path, prefix: str = "", depth: int = 0) -> dict[str, str | None] | None:
    """The files of an index folder as its verified ``manifest.json`` lists them (sub-indexes of a
    hybrid index included), or ``None`` when the manifest is missing, edited or not an index's."""
    m = _read_json_file(folder / "manifest.json")
    if not isinstance(m, dict) or m.get("format") != "ragkit-index" or depth > 4:
        return None
    v1 = m.get("version") == 1  # format 1 had no self-checksum (its file list may be absent too)
    if not (v1 or m.get("manifest_sha256") == json_digest(m, "manifest_sha256")):
        return None
    files = m.get("files", {} if v1 else None)
    if not isinstance(files, dict):
        return None
    out: dict[str, str | None] = {prefix + "manifest.json": None}
    for rel, digest in files.items():
        if not _plain_rel(rel) or not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            return None
        out[prefix + rel] = digest
    for sub in m.get("retrievers") or []:
        rel = sub.get("dir") if isinstance(sub, dict) else None
        if not _plain_rel(rel):
            return None
        inner = _index_listing(folder / rel, f"{prefix}{rel}/", depth + 1)
        if inner is None:
            return None
        out.update(inner)
    return out


def _marker(folder: Path) -> dict[str, Any] | None:
    m = _read_json_file(folder / ARTIFACT_MARKER)
    return m if isinstance(m, dict) and isinstance(m.get("kind"), str) else None


def artifact_files(path: str | os.PathLike[str]) -> dict[str, str | None] | None:
    """The files ragkit wrote in the artifact folder ``path`` (relative path -> SHA-256, or ``None``
    where only the name is known), or ``None`` when ragkit cannot prove which files it wrote there.

    The list comes from the folder's own, self-verified :data:`ARTIFACT_MARKER`; for folders written
    before the marker listed files: from a verified index ``manifest.json``, or, for a model or
    reranker folder, the file names a Hugging Face save writes. A marker or manifest that was edited,
    or does not verify, proves nothing.
    """
    folder = Path(path)
    if not folder.is_dir() or folder.is_symlink():
        return None
    m = _marker(folder)
    if m is not None and m.get("format") == MARKER_FORMAT:
        files = m.get("files")
        if not isinstance(files, dict) or m.get(_MARKER_CHECKSUM) != json_digest(m, _MARKER_CHECKSUM):
            return None
        if not all(_plain_rel(r) and isinstance(d, str) and _HEX64.fullmatch(d) for r, d in files.items()):
            return None
        return {**files, ARTIFACT_MARKER: None}
    kind = m.get("kind") if m is not None else artifact_kind(folder)
    extra: dict[str, str | None] = {ARTIFACT_MARKER: None} if m is not None else {}
    if kind == "index":
        listing = _index_listing(folder)
        return None if listing is None else {**listing, **extra}
    if kind in ("reranker", "model"):
        return {**{e: None for e in _entries(folder) if _LEGACY_MODEL_FILE.fullmatch(e)}, **extra}
    return None


def artifact_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind of ragkit artifact stored in folder ``path``, or ``None`` when it is not one.

    A folder is a ragkit artifact when it holds :data:`ARTIFACT_MARKER` (or, for folders written by
    older versions, an index manifest / a distilled-reranker metadata file). A marker only claims
    the kind: what ragkit may delete there is decided by :func:`artifact_files`.
    """
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return None
    marker = path / ARTIFACT_MARKER
    if marker.is_file():
        try:
            kind = parse_json(marker.read_text(encoding="utf-8"), marker).get("kind")
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


def _shown(names: list[str], n: int = 5) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def _target(path: str | os.PathLike[str]) -> Path:
    """``path`` with a symbolic link in its last part followed: ragkit writes where the link points
    and keeps the link (it never replaces a user's link by a folder)."""
    path = Path(path)
    if path.is_symlink():
        if not path.exists():
            raise FileExistsError(f"{path} is a dangling symbolic link; remove it or choose another --out")
        return Path(os.path.realpath(path))
    return path


def check_writable_dir(path: str | os.PathLike[str], kind: str, overwrite: bool = False,
                       into: bool = False) -> Path:
    """Check that ragkit may write a ``kind`` artifact folder at ``path``; raise ``FileExistsError`` if not.

    Writing may replace only

    * nothing (``path`` does not exist) or an empty folder;
    * a previous ragkit artifact of the same ``kind`` (with ``overwrite=True``: of another kind)
      that holds nothing but the files ragkit wrote there, as the artifact's own verified list
      says (:func:`artifact_files`);
    * with ``overwrite=True``: a single regular file.

    Anything else is refused, ``overwrite`` or not, naming the files ragkit did not write: a
    folder of a user's files, one that only *looks* like an artifact (a stray marker, a copied
    ``manifest.json``, a web app's own ``manifest.json``), and an index in which the user keeps
    notes. A marker never makes a folder deletable: ragkit deletes only files it can prove it
    wrote. ``into=True`` (a run folder that ragkit writes into, never replaces) accepts any folder
    marked as a ``kind``. A symbolic link at ``path`` is followed (its target is checked and
    written; the link stays). Call it before any long work so that a bad ``--out`` is reported at
    once. Returns the path that will be written.
    """
    path = _target(path)
    if not path.exists():
        return path
    if not path.is_dir():
        if overwrite and path.is_file():
            return path
        if not path.is_file():
            raise FileExistsError(f"{path} exists and is not a regular file or folder; choose another --out")
        raise FileExistsError(
            f"{path} is an existing file, not a ragkit {kind} folder; choose another --out "
            "or pass --overwrite to replace that file"
        )
    entries = _entries(path)
    if not entries:
        return path
    found = artifact_kind(path)
    if found is None:
        raise FileExistsError(
            f"{path} is a folder holding files that ragkit did not write ({_shown(entries)}); ragkit never "
            f"replaces such a folder (even with --overwrite): choose a new or empty folder for the {kind}"
        )
    if found != kind and not overwrite:
        raise FileExistsError(
            f"{path} holds a ragkit {found}, not a {kind}; choose another --out or pass --overwrite to replace it"
        )
    if into and found == kind:
        return path
    listing = artifact_files(path)
    if listing is None:
        raise FileExistsError(
            f"{path} is marked as a ragkit {found}, but its marker or manifest does not verify (it was "
            "edited, copied from elsewhere, or is not ragkit's), so ragkit cannot tell the files it wrote "
            f"from yours ({_shown(entries)}); ragkit deletes only files it can prove it wrote: move your "
            "files out and delete that folder yourself, or choose a new or empty folder for the "
            f"{kind}"
        )
    unlisted = [e for e in entries if e not in listing]
    if unlisted:
        raise FileExistsError(
            f"{path} is marked as a ragkit {found} but holds {len(unlisted)} file(s) that ragkit did not write there "
            f"({_shown(unlisted)}); ragkit never deletes them, so it does not replace that folder: move "
            f"them out of {path} and run again, or choose another --out"
        )
    return path


def _process_start(pid: int) -> str | None:
    """Start time of process ``pid`` (clock ticks since boot, from ``/proc``), or ``None``."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return stat_line.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(owner: dict[str, Any]) -> bool:
    """The process named by a :data:`TEMP_MARKER` still runs (a reused PID does not count)."""
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True  # unknown owner: never ours to remove
    if Path("/proc/self/stat").exists():
        start = _process_start(pid)
        return start is not None and (owner.get("start") is None or start == owner.get("start"))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_listed(folder: Path, listing: dict[str, str | None]) -> list[str]:
    """Delete from ``folder`` the regular files of ``listing`` whose SHA-256 still matches, then the
    folders left empty; return what stays (files ragkit did not write, or changed since)."""
    for rel, digest in listing.items():
        f = folder / rel
        try:
            if f.is_symlink() or not f.is_file():
                continue
            if digest is None or file_sha256(f) == digest:
                f.unlink()
        except OSError:
            continue
    for root, dirs, _files in os.walk(folder, topdown=False, followlinks=False):
        for d in dirs:
            p = Path(root) / d
            if not p.is_symlink():
                try:
                    p.rmdir()
                except OSError:
                    pass
    try:
        folder.rmdir()
    except OSError:
        pass
    return _entries(folder) if folder.exists() else []


def remove_stale_temps(path: str | os.PathLike[str]) -> list[str]:
    """Remove what killed saves of ``path`` left beside it; returns the names removed.

    * ``<name>.tmp-*`` folders that carry :data:`TEMP_MARKER` naming a process of this host that
      is gone (a reused PID is told apart by its start time). Unmarked ones, those of a live
      process and those written on another host are left alone.
    * ``<name>.old-*`` folders (a previous artifact moved aside by a save killed before it was
      deleted): only the files its own verified list names and that still match are deleted.
    """
    path = Path(path)
    removed: list[str] = []
    parent = path.parent
    if not parent.is_dir():
        return removed
    host = socket.gethostname()
    for p in sorted(parent.glob(glob_escape(path.name) + ".tmp-*")):
        if p.is_symlink() or not p.is_dir():
            continue
        owner = _read_json_file(p / TEMP_MARKER)
        if not isinstance(owner, dict) or owner.get("ragkit_temp") != 1 or owner.get("host") != host:
            continue
        if _owner_alive(owner):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p.name)
    for p in sorted(parent.glob(glob_escape(path.name) + ".old-*")):
        if p.is_symlink() or not p.is_dir():
            continue
        listing = artifact_files(p)
        if listing is not None and not [e for e in _entries(p) if e not in listing] and not _remove_listed(p, listing):
            removed.append(p.name)
    if removed:
        logger.warning("removed %d temp folder(s) left beside %s by killed saves: %s", len(removed), path,
                       ", ".join(removed))
    return removed


def glob_escape(name: str) -> str:
    """``name`` with the glob metacharacters ``*?[`` escaped (for ``Path.glob``)."""
    return re.sub(r"([*?[])", r"[\1]", name)


def _write_marker(folder: Path, kind: str) -> None:
    files = {rel: file_sha256(folder / rel) for rel in _entries(folder)
             if rel != ARTIFACT_MARKER and (folder / rel).is_file() and not (folder / rel).is_symlink()}
    marker: dict[str, Any] = {"kind": kind, "format": MARKER_FORMAT, "files": files}
    marker[_MARKER_CHECKSUM] = json_digest(marker, _MARKER_CHECKSUM)
    (folder / ARTIFACT_MARKER).write_text(json.dumps(marker, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


@contextmanager
def atomic_dir(path: str | os.PathLike[str], kind: str, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside ``path``; on success it replaces ``path`` in one rename.

    What may be replaced is decided by :func:`check_writable_dir`: never a folder holding a file
    that ragkit did not write. The new folder gets an :data:`ARTIFACT_MARKER` listing every file in
    it with its SHA-256. A previous artifact is renamed aside (``<name>.old-*``), the new one renamed
    into place, and then only the old files that its own list names and that still match their
    checksum are deleted, file by file (never ``rmtree``); anything else -- a file changed since
    ragkit wrote it, or one that appeared meanwhile -- stays in the ``.old-*`` folder, which a
    warning names. A symbolic link at ``path`` is kept: its target is written. A crash inside the
    block leaves any existing ``path`` untouched; its temp folder names this process
    (:data:`TEMP_MARKER`) and is removed by the next save once the process is gone
    (:func:`remove_stale_temps`).
    """
    path = check_writable_dir(path, kind, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = temp_dir_beside(path, mark=True)
    try:
        yield tmp
        (tmp / TEMP_MARKER).unlink(missing_ok=True)
        _write_marker(tmp, kind)
        check_writable_dir(path, kind, overwrite)  # again: something may have appeared meanwhile
        if path.is_dir():
            listing = artifact_files(path) or {}
            old = path.with_name(path.name + ".old-" + tmp.name.rsplit("-", 1)[-1])
            os.replace(path, old)
            os.replace(tmp, path)
            left = _remove_listed(old, listing)
            if left:
                logger.warning("kept the previous %s's files that ragkit did not write or that changed since "
                               "(%s) in %s; delete that folder when you no longer need them", kind,
                               _shown(left), old)
        elif path.exists():
            old = path.with_name(path.name + ".old-" + tmp.name.rsplit("-", 1)[-1])
            os.replace(path, old)
            os.replace(tmp, path)
            old.unlink(missing_ok=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def iter_text_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a text file, gunzipped when its first bytes are the gzip magic number;
    a UTF-8 byte-order mark at its start is dropped.

    A truncated or damaged gzip stream and bytes that are not UTF-8 raise ``ValueError`` naming the
    file and the line reached (they were ``EOFError``/``UnicodeDecodeError`` tracebacks before).
    """
    import gzip

    path = Path(path)
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    i = 0
    try:
        # utf-8-sig: a byte-order mark at the start (Windows editors write one) is read, not an error
        with (gzip.open(path, "rt", encoding="utf-8-sig") if gz else open(path, encoding="utf-8-sig")) as f:
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
            row = parse_json(line, f"{path}:{i}")
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
    bom = b"\xef\xbb\xbf" if data.startswith(b"\xef\xbb\xbf") else b""  # a byte-order mark is read, not damage
    lines = data[len(bom):].split(b"\n")
    # ``lines[-1]`` is what follows the last newline: empty for a clean file, else an unterminated tail
    body, tail = lines[:-1], lines[-1]
    out: list[Any] = []
    for i, raw in enumerate(body, 1):
        text = raw.strip()
        if not text:
            continue
        try:
            row = parse_json(text.decode("utf-8"), f"{path}:{i}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e}); this is damage inside the file, "
                             "not a torn last line: fix or remove that line") from e
        out.append((i, row) if with_lines else row)
    if tail.strip():
        try:
            row = parse_json(tail.strip().decode("utf-8"), f"{path}:{len(body) + 1}")
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


def partial_path(out: str | os.PathLike[str]) -> Path:
    """The append-only file a resumable run keeps beside its result ``out``: ``<out>.partial.jsonl``."""
    out = Path(out)
    return out.with_name(out.name + ".partial.jsonl")


def append_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Append rows and fsync (used by resumable runs: a killed run loses at most a partial line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def resume_appended_jsonl(path: str | os.PathLike[str], header: dict[str, Any], resume: bool, key: str,
                          with_lines: bool = False) -> list[Any]:
    """Open the append-only file of a resumable run: the rows already done, after a header line.

    The file's first line is ``header``; ``header[key]`` fingerprints the settings that produced
    the rows. With ``resume`` and the same fingerprint, the rows after the header come back (a torn
    tail is repaired by :func:`read_appended_jsonl`). A file without a complete header (new, empty,
    or torn while the header was written) holds nothing, so it is started over with ``header``.
    ``resume=False`` deletes the file first. Another fingerprint raises ``ValueError``: those rows
    are another run's work and are never mixed in nor silently deleted. ``with_lines``: return
    ``(line number, row)`` pairs (for callers that validate the rows and name a bad line).
    """
    path = Path(path)
    if path.exists() and not resume:
        path.unlink()
    numbered = read_appended_jsonl(path, with_lines=True)
    rows = [r for _, r in numbered]
    if rows and (not isinstance(rows[0], dict) or rows[0].get(key) != header[key]):
        raise ValueError(f"{path} was written by a run with other settings; pass --no-resume to start over "
                         "or choose another --out")
    if not rows:
        path.unlink(missing_ok=True)
        append_jsonl(path, [header])
    return numbered[1:] if with_lines else rows[1:]


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

    Written here rather than with ``filelock`` (installed with transformers), which takes the same
    kernel lock but cannot say who holds it: the refusal names the PID of the other run, which is
    what the user needs to decide whether to wait or stop it; and the lock file is removed on
    release (with the inode re-check above), so no ``.lock`` files are left beside outputs.
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


PROGRESS_DELAY_S = 2.0
"""A bar appears only once its work has taken this long: sub-second stages print nothing."""


def progress(iterable: Iterable[Any], show: bool | None = None, **kw: Any) -> Iterable[Any]:
    """Wrap ``iterable`` in a ``tqdm`` bar when progress is enabled.

    The bar is drawn only after :data:`PROGRESS_DELAY_S` (tqdm's ``delay``), so work that ends
    sooner leaves no bar behind; ``kw`` go to ``tqdm`` (``delay=0`` draws at once).
    """
    if not progress_enabled(show):
        return iterable
    from tqdm.auto import tqdm

    kw.setdefault("delay", PROGRESS_DELAY_S)
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

