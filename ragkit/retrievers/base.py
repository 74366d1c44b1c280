"""The :class:`Retriever` base class, the on-disk index format and :func:`load_retriever`.

Every retriever indexes :class:`~ragkit.types.Passage` objects and answers many queries in one
batched call with one :class:`~ragkit.types.RankedList` per query.

On-disk format (``FORMAT_NAME`` version ``FORMAT_VERSION``): a folder written atomically through
:func:`ragkit.io.atomic_dir` that holds

* ``manifest.json`` -- format name and version, ``kind`` (``bm25``, ``dense``, ``hybrid``),
  the constructor ``params``, ``n_docs``, backend-specific entries (for a dense index the
  embedder name and dimension, for a hybrid one its sub-index folders), ``files`` (the SHA-256
  of every other file) and ``manifest_sha256``, the SHA-256 of the manifest's own other fields;
* ``passages.jsonl`` -- the indexed passages in index order (row ``i`` is document ``i``);
* backend files: NumPy ``.npy`` arrays (loaded with ``allow_pickle=False``), JSON, a FAISS index
  written by ``faiss.write_index``, or sub-folders (hybrid). Nothing is pickled.

Integrity, checked on every load (it cannot be switched off): the manifest must carry exactly the
fields of its kind (a missing or unknown field is an error), its own checksum must match (so
deleting ``files`` or any other edit is detected), ``files`` must list ``passages.jsonl`` and the
backend's files, and every path it names (``files`` keys, hybrid sub-folders) must be a plain
relative path that resolves inside the index folder -- no ``..``, no absolute path, no symbolic
link leading out. Only then is any listed file opened and hashed.

Size limits (a clear error names the limit and how to raise it): a passage longer than
``RAGKIT_MAX_PASSAGE_CHARS`` characters (default 1,000,000) is refused when indexing, a query
longer than ``RAGKIT_MAX_QUERY_CHARS`` (default 10,000) when searching; set the environment
variable, or ``retriever.max_passage_chars`` / ``retriever.max_query_chars``, to change them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import re
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, ClassVar, TypeVar

import numpy as np

from ragkit.io import TEMP_MARKER, atomic_dir, iter_jsonl, json_digest, parse_json, write_json, write_jsonl
from ragkit.types import Hit, Passage, Query, RankedList, as_query

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Retriever",
    "IndexFormatError",
    "iter_passages",
    "load_retriever",
    "max_passage_chars",
    "max_query_chars",
    "read_manifest",
    "register_retriever",
]

FORMAT_NAME = "ragkit-index"
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"
MANIFEST_CHECKSUM = "manifest_sha256"
_BASE_FIELDS: dict[str, type] = {
    "format": str, "version": int, "kind": str, "class": str, "params": dict, "n_docs": int,
    "files": dict, MANIFEST_CHECKSUM: str,
}
_HEX64 = re.compile(r"[0-9a-f]{64}")

PASSAGE_LIMIT_ENV = "RAGKIT_MAX_PASSAGE_CHARS"
QUERY_LIMIT_ENV = "RAGKIT_MAX_QUERY_CHARS"
DEFAULT_MAX_PASSAGE_CHARS = 1_000_000
DEFAULT_MAX_QUERY_CHARS = 10_000

R = TypeVar("R", bound="Retriever")

_REGISTRY: dict[str, type[Retriever]] = {}
_BUILTIN_MODULES = {
    "bm25": "ragkit.retrievers.bm25",
    "dense": "ragkit.retrievers.dense",
    "hybrid": "ragkit.retrievers.hybrid",
}


class IndexFormatError(ValueError):
    """A saved index folder is missing, damaged, of another version or of another kind."""


def register_retriever(cls: type[R]) -> type[R]:
    """Class decorator: make ``load_retriever`` dispatch manifests of ``cls.kind`` to ``cls``."""
    _REGISTRY[cls.kind] = cls
    return cls


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` except manifests and the temp folder's owner marker,
    skipping nested index folders (those carry their own manifest and are verified when they are
    loaded)."""
    nested = [p.parent for p in folder.rglob(MANIFEST) if p.parent != folder]
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name in (MANIFEST, TEMP_MARKER):
            continue
        if any(n in p.parents for n in nested):
            continue
        out[p.relative_to(folder).as_posix()] = _sha256(p)
    return out


def _limit(env: str, default: int, override: int | None) -> int:
    if override is not None:
        return int(override)
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{env}={raw!r} is not a whole number of characters; "
                         f"set it to e.g. {default}") from None
    if value <= 0:
        raise ValueError(f"{env}={raw!r} must be a positive number of characters")
    return value


def max_passage_chars(override: int | None = None) -> int:
    """The passage size limit: ``override``, else ``$RAGKIT_MAX_PASSAGE_CHARS``, else 1,000,000."""
    return _limit(PASSAGE_LIMIT_ENV, DEFAULT_MAX_PASSAGE_CHARS, override)


def max_query_chars(override: int | None = None) -> int:
    """The query size limit: ``override``, else ``$RAGKIT_MAX_QUERY_CHARS``, else 10,000."""
    return _limit(QUERY_LIMIT_ENV, DEFAULT_MAX_QUERY_CHARS, override)


MAX_ID_CHARS = 4096
"""Longest passage id accepted (a URL fits; a whole text pasted into the id column does not)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")


def check_passage_id(pid: Any, where: str = "") -> str:
    """``pid`` if it is a usable passage id, else ``ValueError`` naming the problem.

    An id is a non-empty string of at most :data:`MAX_ID_CHARS` characters without control
    characters: a newline, NUL or line separator would break every line-based output that names
    the passage (JSONL, TSV, run files), and a megabyte id is a data error, not an id.
    """
    if not isinstance(pid, str):
        raise ValueError(f"{where}passage id {pid!r} is a {type(pid).__name__}; ids are strings")
    if not pid.strip():
        raise ValueError(f"{where}a passage has an empty id; give every passage a non-empty id")
    if len(pid) > MAX_ID_CHARS:
        raise ValueError(f"{where}passage id {pid[:40]!r}... has {len(pid):,} characters, more than the "
                         f"limit of {MAX_ID_CHARS:,}; is the text in the id column? give each passage a short id")
    m = _CONTROL.search(pid)
    if m:
        raise ValueError(f"{where}passage id {pid[:80]!r} holds the control character {m.group()!r} (U+"
                         f"{ord(m.group()):04X}); ids must be one line of printable text: remove it")
    return pid


def _check_passage_size(p: Passage, limit: int, where: str = "") -> None:
    n = len(p.text) + len(p.title)
    if n > limit:
        raise ValueError(
            f"{where}passage {p.id!r} has {n:,} characters, more than the limit of {limit:,}; "
            "split it into smaller passages, or raise the limit with the environment variable "
            f"{PASSAGE_LIMIT_ENV}=N (or retriever.max_passage_chars = N)"
        )


def iter_passages(path: str | os.PathLike[str], max_chars: int | None = None) -> Iterator[Passage]:
    """Stream the passages of a corpus JSONL file (``.gz`` too), one line at a time.

    Lines are ``{"id": ..., "text": ..., "title"?: ..., "metadata"?: ...}``; blank lines are
    skipped. Nothing but the current line is held in memory.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A line that is not JSON, not a passage record (null or missing id/text), or a passage
        above the size limit (:func:`max_passage_chars`); the message names ``file:line``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such corpus file: {path}")
    limit = max_passage_chars(max_chars)
    for i, row in iter_jsonl(path):
        where = f"{path}:{i}: "
        try:
            p = Passage.from_dict(row)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}{e}") from e
        check_passage_id(p.id, where)
        _check_passage_size(p, limit, where)
        yield p


def _class_for_kind(kind: Any, where: Path) -> type[Retriever]:
    if isinstance(kind, str) and kind in _BUILTIN_MODULES and kind not in _REGISTRY:
        importlib.import_module(_BUILTIN_MODULES[kind])  # registers the class
    if kind not in _REGISTRY:
        raise IndexFormatError(
            f"{where}: unknown retriever kind {kind!r}; known kinds: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[kind]


def _manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the manifest's fields other than the checksum (canonical JSON)."""
    return json_digest(manifest, MANIFEST_CHECKSUM)


def index_path(folder: Path, rel: Any, what: str) -> Path:
    """``folder / rel`` for a path named in a manifest, refused unless it stays inside ``folder``.

    ``rel`` must be a non-empty relative POSIX path without ``.``/``..`` parts, drive or
    backslash, and ``folder / rel`` must resolve (symbolic links followed) inside ``folder``.
    """
    bad = (
        not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel
        or PurePosixPath(rel).is_absolute() or bool(PureWindowsPath(rel).drive)
        or PurePosixPath(rel).as_posix() != rel
        or any(part in (".", "..") for part in rel.split("/"))
    )
    if bad:
        raise IndexFormatError(
            f"index {folder} is damaged: its manifest names {what} {rel!r}, which is not a plain "
            "relative path inside the index folder; rebuild the index with `ragkit index`"
        )
    p = folder / rel
    try:
        p.resolve().relative_to(folder.resolve())
    except ValueError:
        raise IndexFormatError(
            f"index {folder} is damaged: {what} {rel!r} leads outside the index folder (a symbolic "
            "link?); ragkit reads nothing outside an index; rebuild the index with `ragkit index`"
        ) from None
    return p


def _check_manifest(folder: Path, manifest: dict[str, Any]) -> type[Retriever]:
    """Fields, types, own checksum and paths of a parsed manifest; returns the retriever class."""
    mpath = folder / MANIFEST
    cls = _class_for_kind(manifest.get("kind"), folder)
    fields = {**_BASE_FIELDS, **cls.manifest_fields}
    missing = [k for k in fields if k not in manifest]
    if missing:
        raise IndexFormatError(
            f"index {folder} is damaged: {mpath.name} lacks the field(s) {missing} "
            "(an index manifest without its file list or checksum cannot be trusted); "
            "rebuild it with `ragkit index`"
        )
    unknown = sorted(k for k in manifest if k not in fields)
    if unknown:
        raise IndexFormatError(
            f"index {folder}: {mpath.name} has unknown field(s) {unknown} (known for a "
            f"{cls.kind} index: {sorted(fields)}); it was edited or written by another "
            "ragkit; rebuild it with `ragkit index`"
        )
    for k, t in fields.items():
        v = manifest[k]
        if not isinstance(v, t) or (t is int and isinstance(v, bool)):
            raise IndexFormatError(
                f"index {folder} is damaged: manifest field {k!r} should be a "
                f"{t.__name__}, got {type(v).__name__}; rebuild it with `ragkit index`"
            )
    if manifest[MANIFEST_CHECKSUM] != _manifest_digest(manifest):
        raise IndexFormatError(
            f"index {folder} is damaged: {mpath.name} does not match its own checksum (it was "
            "edited or corrupted); rebuild it with `ragkit index`"
        )
    if manifest["n_docs"] < 1:
        raise IndexFormatError(f"index {folder} is damaged: n_docs = {manifest['n_docs']}")
    files = manifest["files"]
    for rel, digest in files.items():
        index_path(folder, rel, "the file")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise IndexFormatError(
                f"index {folder} is damaged: the checksum of {rel!r} is not a SHA-256 hex digest; "
                "rebuild it with `ragkit index`"
            )
    required = {PASSAGES, *cls._required_files(manifest)}
    absent = sorted(required - set(files))
    if absent:
        raise IndexFormatError(
            f"index {folder} is damaged: its manifest does not list {absent}; "
            "rebuild it with `ragkit index`"
        )
    for what, rel in cls._manifest_paths(manifest):
        index_path(folder, rel, what)
    return cls


def read_manifest(path: str | os.PathLike[str], verify: bool = True) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a saved index folder.

    The manifest's fields, its own checksum and every path it names are always checked (see
    the module docstring); :meth:`Retriever.load` always verifies the files too.

    Parameters
    ----------
    path
        The index folder.
    verify
        Also hash every listed file against its recorded SHA-256 (``False`` only to inspect a
        manifest cheaply; loading an index never skips it).

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    IndexFormatError
        The manifest is missing, unreadable, of another format/version, has missing, unknown or
        mistyped fields, does not match its checksum, names a path outside the folder, or a file
        is missing or corrupt.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no index folder at {folder}; build one with `ragkit index --out {folder}`"
        )
    mpath = folder / MANIFEST
    if not mpath.is_file():
        raise IndexFormatError(
            f"{folder} has no {MANIFEST}: it is not a ragkit index or it is damaged; "
            "rebuild it with `ragkit index`"
        )
    try:
        index_path(folder, MANIFEST, "its manifest")
        manifest = parse_json(mpath.read_text(encoding="utf-8"), mpath)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexFormatError(f"{mpath} is not valid JSON ({e}); rebuild the index") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(
            f"{mpath} is not a {FORMAT_NAME} manifest; rebuild the index with `ragkit index`"
        )
    version = manifest.get("version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{folder} uses index format version {version}, this ragkit reads version "
            f"{FORMAT_VERSION}; rebuild the index with this ragkit (`ragkit index`)"
        )
    _check_manifest(folder, manifest)
    if verify:
        for rel, digest in manifest["files"].items():
            f = index_path(folder, rel, "the file")
            if not f.is_file():
                raise IndexFormatError(
                    f"index {folder} is damaged: {rel} is missing; rebuild it with `ragkit index`"
                )
            if _sha256(f) != digest:
                raise IndexFormatError(
                    f"index {folder} is damaged: {rel} does not match its checksum; "
                    "rebuild it with `ragkit index`"
                )
    return manifest


def load_retriever(path: str | os.PathLike[str], **kwargs: Any) -> Retriever:
    """Load any saved retriever, dispatching on the ``kind`` in its manifest.

    Parameters
    ----------
    path
        Folder written by :meth:`Retriever.save`.
    **kwargs
        Passed to the class's ``load`` (e.g. ``model=`` to assert which embedder a dense index
        must have been built with, ``device=``).
    """
    manifest = read_manifest(path, verify=False)
    return _class_for_kind(manifest["kind"], Path(path)).load(path, **kwargs)


def check_passages(
    passages: Iterable[Passage], existing: Mapping[str, int] | None = None,
    max_chars: int | None = None,
) -> list[Passage]:
    """Validate passages for indexing: non-empty, ``Passage`` objects, unique ids, size limit.

    ``passages`` may be any iterable (a generator such as :func:`iter_passages` is consumed once).

    Raises
    ------
    ValueError
        Empty input, a non-``Passage`` item, an id that :func:`check_passage_id` refuses (too
        long, a control character), ids that repeat (inside ``passages`` or with ``existing``;
        every repeated id is named, up to 20) or that differ only in Unicode normalisation, or a
        passage above :func:`max_passage_chars`.
    """
    if isinstance(passages, (str, Passage)):
        raise ValueError("pass a list of Passage objects, not a single item")
    limit = max_passage_chars(max_chars)
    ps: list[Passage] = []
    seen: set[str] = set()
    dups: dict[str, int] = {}
    nfc: dict[str, str] = {}  # NFC form -> the id seen first
    if existing:
        nfc = {unicodedata.normalize("NFC", x): x for x in existing}
    for p in passages:
        if not isinstance(p, Passage):
            raise ValueError(
                f"expected Passage objects, got {type(p).__name__}; "
                "convert with ragkit.types.as_passages(...)"
            )
        check_passage_id(p.id)
        _check_passage_size(p, limit)
        if p.id in seen or (existing is not None and p.id in existing):
            dups[p.id] = dups.get(p.id, 1) + 1
        else:
            key = unicodedata.normalize("NFC", p.id)
            first = nfc.setdefault(key, p.id)
            if first != p.id:
                raise ValueError(
                    f"passage ids {first!r} and {p.id!r} differ only in their Unicode normalisation (they "
                    "look the same but are different code points, e.g. a precomposed 'é' and 'e' + accent); "
                    "normalise the corpus ids to NFC (unicodedata.normalize('NFC', id)) so each id means one "
                    "passage"
                )
        seen.add(p.id)
        ps.append(p)
    if not ps:
        raise ValueError(
            "cannot index an empty corpus; pass at least one Passage "
            "(corpus JSONL lines look like {\"id\": ..., \"text\": ..., \"title\": ...})"
        )
    if dups:
        shown = ", ".join(f"{d!r} ({n}x)" for d, n in list(dups.items())[:20])
        more = f" and {len(dups) - 20} more" if len(dups) > 20 else ""
        raise ValueError(
            f"duplicate passage id{'s' if len(dups) > 1 else ''} {shown}{more}; passage ids must be unique in "
            "an index (de-duplicate the corpus or give each passage its own id)"
        )
    return ps


def check_queries(queries: Sequence[str | Query] | str | Query,
                  max_chars: int | None = None) -> list[Query]:
    """Coerce queries to ``Query`` objects; a bare string or ``Query`` is one query.

    Raises
    ------
    ValueError
        No queries, a query that is not a string (e.g. JSON ``null``), an empty /
        whitespace-only query text, or one above :func:`max_query_chars`.
    """
    if isinstance(queries, (str, Query)):
        queries = [queries]
    limit = max_query_chars(max_chars)
    qs: list[Query] = []
    for i, q in enumerate(queries):
        if not isinstance(q, (str, Query)):
            raise ValueError(f"query {i} is {q!r} ({type(q).__name__}), not a string; "
                             "give every query some text")
        text = q if isinstance(q, str) else q.text
        if not text.strip():
            raise ValueError(f"query {i} is empty; give every query some text")
        if len(text) > limit:
            raise ValueError(
                f"query {i} has {len(text):,} characters, more than the limit of {limit:,}; "
                f"shorten it, or raise the limit with the environment variable "
                f"{QUERY_LIMIT_ENV}=N (or retriever.max_query_chars = N)"
            )
        qs.append(as_query(q))
    if not qs:
        raise ValueError("no queries given; pass a list with at least one query string")
    return qs


class Retriever(ABC):
    """Base class of all retrievers.

    Subclasses set ``kind``, implement ``_build`` (index from scratch), ``_search`` (batched
    top-k over document positions), ``params`` and the two persistence hooks ``_save_files`` /
    ``_from_saved``; ``_add`` is optional.
    """

    kind: ClassVar[str] = ""
    manifest_fields: ClassVar[dict[str, type]] = {}
    """Manifest fields of this kind beyond the common ones (name -> JSON type), all required."""
    max_passage_chars: int | None = None
    """Per-instance passage size limit (``None``: ``$RAGKIT_MAX_PASSAGE_CHARS`` or 1,000,000)."""
    max_query_chars: int | None = None
    """Per-instance query size limit (``None``: ``$RAGKIT_MAX_QUERY_CHARS`` or 10,000)."""

    def __init__(self) -> None:
        self._passages: list[Passage] = []
        self._pos: dict[str, int] = {}

    # ------------------------------------------------------------------ corpus
    @property
    def passages(self) -> list[Passage]:
        """The indexed passages in index order."""
        return list(self._passages)

    @property
    def is_indexed(self) -> bool:
        return bool(self._passages)

    def __len__(self) -> int:
        return len(self._passages)

    def passage(self, pid: str) -> Passage:
        """The indexed passage with id ``pid``."""
        try:
            return self._passages[self._pos[pid]]
        except KeyError:
            raise KeyError(f"no passage with id {pid!r} in this index") from None

    def _set_passages(self, passages: list[Passage]) -> None:
        self._passages = passages
        self._pos = {p.id: i for i, p in enumerate(passages)}

    def index(self: R, passages: Iterable[Passage]) -> R:
        """Index ``passages`` from scratch (replacing any previous index); returns ``self``.

        ``passages`` may be a generator (e.g. :func:`iter_passages` of a corpus file): it is read
        once, and backends tokenise / encode it in chunks.
        """
        ps = check_passages(passages, max_chars=self.max_passage_chars)
        self._build(ps)
        self._set_passages(ps)
        logger.info("%s indexed %d passages", type(self).__name__, len(ps))
        return self

    def add(self: R, passages: Sequence[Passage]) -> R:
        """Add passages to the index (indexes from scratch when nothing is indexed yet).

        Raises
        ------
        ValueError
            A new id is already in the index, or the input is empty.
        NotImplementedError
            The backend cannot grow an index (the message says what to do instead).
        """
        if not self.is_indexed:
            return self.index(passages)
        ps = check_passages(passages, existing=self._pos, max_chars=self.max_passage_chars)
        self._add(ps)
        self._set_passages(self._passages + ps)
        return self

    def search(
        self, queries: Sequence[str | Query] | str | Query, k: int = 10
    ) -> list[RankedList]:
        """Top-``k`` passages for every query, in one batched call.

        Parameters
        ----------
        queries
            Query strings or :class:`~ragkit.types.Query` objects (a single one is accepted too).
        k
            Number of hits per query; ``k`` larger than the corpus returns the whole corpus.

        Returns
        -------
        list[RankedList]
            One ranked list per query, best first (ties broken by index position). A list can
            be shorter than ``k``: BM25 returns only passages that contain a query term (empty
            for a query none of whose terms is indexed).
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if not self.is_indexed:
            raise ValueError(
                f"{type(self).__name__} has no index yet; call .index(passages) first "
                "or load a saved one with load_retriever(dir)"
            )
        qs = check_queries(queries, max_chars=self.max_query_chars)
        kk = min(int(k), len(self._passages))
        results = self._search(qs, kk)
        out: list[RankedList] = []
        for q, (idx, scores) in zip(qs, results):
            idx = np.asarray(idx, dtype=np.int64)
            scores = np.asarray(scores, dtype=np.float64)
            keep = idx >= 0
            idx, scores = idx[keep], scores[keep]
            order = np.lexsort((idx, -scores))[:kk]
            hits = tuple(
                Hit(self._passages[int(idx[j])], float(scores[j]), r) for r, j in enumerate(order)
            )
            out.append(RankedList(hits, q))
        return out

    # ------------------------------------------------------------------ subclass hooks
    @abstractmethod
    def _build(self, passages: list[Passage]) -> None:
        """Build the backend index for ``passages`` (positions 0..n-1)."""

    @abstractmethod
    def _search(self, queries: list[Query], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per query: (document positions, scores) of its top ``k`` (any order, -1 = none)."""

    def _add(self, passages: list[Passage]) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot add passages to an existing index; "
            "call .index(old_passages + new_passages) instead"
        )

    @property
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """JSON-serialisable constructor arguments (stored in the manifest)."""

    def _manifest_extra(self) -> dict[str, Any]:
        """Extra manifest entries (e.g. the embedder of a dense index); their names and types
        are declared in ``manifest_fields``."""
        return {}

    @classmethod
    def _required_files(cls, manifest: Mapping[str, Any]) -> set[str]:
        """Files (relative paths) that a manifest of this kind must list besides passages."""
        return set()

    @classmethod
    def _manifest_paths(cls, manifest: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """Other paths the manifest names, as ``(what, relative path)`` (checked to stay inside)."""
        return []

    @abstractmethod
    def _save_files(self, folder: Path) -> None:
        """Write the backend files into ``folder`` (a fresh temp folder)."""

    @classmethod
    @abstractmethod
    def _from_saved(
        cls: type[R],
        folder: Path,
        manifest: dict[str, Any],
        passages: list[Passage],
        **kwargs: Any,
    ) -> R:
        """Rebuild a retriever from its saved folder (passages already read)."""

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Write the index atomically to the folder ``path``; returns the path.

        ``path`` may be new, empty or a previous ragkit index (which is replaced) that holds nothing
        but the files ragkit wrote; a folder holding any other file is never replaced, and another
        ragkit artifact or a file only with ``overwrite=True`` (see
        :func:`ragkit.io.check_writable_dir`). A symbolic link at ``path`` is kept and its target
        written.
        """
        if not self.is_indexed:
            raise ValueError("nothing to save: call .index(passages) before .save(dir)")
        path = Path(path)
        with atomic_dir(path, kind="index", overwrite=overwrite) as tmp:
            self._write_into(tmp)
        logger.info("saved %s index of %d passages to %s", self.kind, len(self), path)
        return path

    def _write_into(self, folder: Path) -> None:
        """Write the full index folder contents (used by ``save`` and by hybrid sub-folders)."""
        write_jsonl(folder / PASSAGES, (p.to_dict() for p in self._passages))
        self._save_files(folder)
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "class": type(self).__name__,
            "params": self.params,
            "n_docs": len(self._passages),
            **self._manifest_extra(),
            "files": _file_digests(folder),
        }
        manifest = json.loads(json.dumps(manifest, ensure_ascii=False, default=str))
        manifest[MANIFEST_CHECKSUM] = _manifest_digest(manifest)
        write_json(folder / MANIFEST, manifest)

    @classmethod
    def load(cls: type[R], path: str | os.PathLike[str], **kwargs: Any) -> R:
        """Load an index saved by :meth:`save`, after checking it (always: see the module
        docstring -- manifest fields and checksum, paths inside the folder, every file's SHA-256).

        Parameters
        ----------
        path
            The index folder.
        **kwargs
            Backend options (see the subclass).

        Raises
        ------
        IndexFormatError
            Missing/corrupt files or manifest, another format version, a path leading outside
            the folder, or an index of another kind.
        """
        if "verify" in kwargs:
            raise TypeError("index checks cannot be switched off: drop verify=")
        folder = Path(path)
        manifest = read_manifest(folder, verify=True)
        if manifest["kind"] != cls.kind:
            raise IndexFormatError(
                f"{folder} holds a {manifest['kind']!r} index, not {cls.kind!r}; "
                "open it with ragkit.retrievers.load_retriever(dir)"
            )
        passages: list[Passage] = []
        lineno = 0
        with open(index_path(folder, PASSAGES, "the file"), encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):  # noqa: B007 - named in the error below
                if not line.strip():
                    continue
                try:
                    passages.append(Passage.from_dict(parse_json(line, f"{PASSAGES}:{lineno}")))
                except (ValueError, TypeError, AttributeError, KeyError) as e:
                    raise IndexFormatError(
                        f"index {folder} is damaged: {PASSAGES} line {lineno}: {e}; rebuild it"
                    ) from e
        if len(passages) != manifest["n_docs"]:
            raise IndexFormatError(
                f"index {folder} is damaged: {len(passages)} passages but the manifest says "
                f"{manifest['n_docs']}; rebuild it"
            )
        obj = cls._from_saved(folder, manifest, passages, **kwargs)
        obj._set_passages(passages)
        return obj

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args}) [{len(self)} passages]"
