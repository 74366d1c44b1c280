"""The :class:`Retriever` base class, the on-disk index format and :func:`load_retriever`.

Every retriever indexes :class:`~ragkit.types.Passage` objects and answers many queries in one
batched call with one :class:`~ragkit.types.RankedList` per query.

On-disk format (``FORMAT_NAME`` version ``FORMAT_VERSION``): a folder written atomically through
:func:`ragkit.io.atomic_dir` that holds

* ``manifest.json`` -- format name and version, ``kind`` (``bm25``, ``dense``, ``hybrid``),
  the constructor ``params``, ``n_docs``, backend-specific entries (for a dense index the
  embedder name and dimension) and the SHA-256 of every other file;
* ``passages.jsonl`` -- the indexed passages in index order (row ``i`` is document ``i``);
* backend files: NumPy ``.npy`` arrays (loaded with ``allow_pickle=False``), JSON, a FAISS index
  written by ``faiss.write_index``, or sub-folders (hybrid). Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from ragkit.io import atomic_dir, read_jsonl, write_json, write_jsonl
from ragkit.types import Hit, Passage, Query, RankedList, as_query

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Retriever",
    "IndexFormatError",
    "load_retriever",
    "read_manifest",
    "register_retriever",
]

FORMAT_NAME = "ragkit-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PASSAGES = "passages.jsonl"

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
    """SHA-256 of every file under ``folder`` except manifests, skipping nested index folders
    (those carry their own manifest and are verified when they are loaded)."""
    nested = [p.parent for p in folder.rglob(MANIFEST) if p.parent != folder]
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name == MANIFEST:
            continue
        if any(n in p.parents for n in nested):
            continue
        out[p.relative_to(folder).as_posix()] = _sha256(p)
    return out


def read_manifest(path: str | os.PathLike[str], verify: bool = True) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a saved index folder.

    Parameters
    ----------
    path
        The index folder.
    verify
        Also check that every file listed in the manifest exists with the recorded SHA-256.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    IndexFormatError
        The manifest is missing, unreadable, of another format/version, or a file is missing or
        corrupt.
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
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
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
    if verify:
        for rel, digest in (manifest.get("files") or {}).items():
            f = folder / rel
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
    kind = manifest.get("kind")
    if kind in _BUILTIN_MODULES and kind not in _REGISTRY:
        importlib.import_module(_BUILTIN_MODULES[kind])  # registers the class
    if kind not in _REGISTRY:
        raise IndexFormatError(
            f"{path}: unknown retriever kind {kind!r}; known kinds: {sorted(_REGISTRY)}"
        )
    return _REGISTRY[kind].load(path, **kwargs)


def check_passages(
    passages: Sequence[Passage], existing: Mapping[str, int] | None = None
) -> list[Passage]:
    """Validate passages for indexing: non-empty, ``Passage`` objects, unique ids.

    Raises
    ------
    ValueError
        Empty input, a non-``Passage`` item, or an id that repeats (inside ``passages`` or with
        ``existing``).
    """
    if isinstance(passages, (str, Passage)):
        raise ValueError("pass a list of Passage objects, not a single item")
    ps = list(passages)
    if not ps:
        raise ValueError(
            "cannot index an empty corpus; pass at least one Passage "
            "(corpus JSONL lines look like {\"id\": ..., \"text\": ..., \"title\": ...})"
        )
    seen: set[str] = set()
    for p in ps:
        if not isinstance(p, Passage):
            raise ValueError(
                f"expected Passage objects, got {type(p).__name__}; "
                "convert with ragkit.types.as_passages(...)"
            )
        if p.id in seen or (existing is not None and p.id in existing):
            raise ValueError(
                f"duplicate passage id {p.id!r}; passage ids must be unique in an index "
                "(de-duplicate the corpus or give each passage its own id)"
            )
        seen.add(p.id)
    return ps


def check_queries(queries: Sequence[str | Query] | str | Query) -> list[Query]:
    """Coerce queries to ``Query`` objects; a bare string or ``Query`` is one query.

    Raises
    ------
    ValueError
        No queries, or an empty / whitespace-only query text.
    """
    if isinstance(queries, (str, Query)):
        queries = [queries]
    qs: list[Query] = []
    for i, q in enumerate(queries):
        if isinstance(q, str) and not q.strip():
            raise ValueError(f"query {i} is empty; give every query some text")
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

    def index(self: R, passages: Sequence[Passage]) -> R:
        """Index ``passages`` from scratch (replacing any previous index); returns ``self``."""
        ps = check_passages(passages)
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
        ps = check_passages(passages, existing=self._pos)
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
            One ranked list per query, best first (ties broken by index position).
        """
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        if not self.is_indexed:
            raise ValueError(
                f"{type(self).__name__} has no index yet; call .index(passages) first "
                "or load a saved one with load_retriever(dir)"
            )
        qs = check_queries(queries)
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
        """Extra manifest entries (e.g. the embedder of a dense index)."""
        return {}

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

        ``path`` may be new, empty or a previous ragkit index (which is replaced); a folder of other
        files is never replaced, and another ragkit artifact or a file only with ``overwrite=True``
        (see :func:`ragkit.io.check_writable_dir`).
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
        write_json(folder / MANIFEST, manifest)

    @classmethod
    def load(cls: type[R], path: str | os.PathLike[str], verify: bool = True, **kwargs: Any) -> R:
        """Load an index saved by :meth:`save`.

        Parameters
        ----------
        path
            The index folder.
        verify
            Check every file against its SHA-256 in the manifest (detects damaged folders).
        **kwargs
            Backend options (see the subclass).

        Raises
        ------
        IndexFormatError
            Missing/corrupt files, another format version, or an index of another kind.
        """
        folder = Path(path)
        manifest = read_manifest(folder, verify=verify)
        if manifest.get("kind") != cls.kind:
            raise IndexFormatError(
                f"{folder} holds a {manifest.get('kind')!r} index, not {cls.kind!r}; "
                "open it with ragkit.retrievers.load_retriever(dir)"
            )
        try:
            rows = read_jsonl(folder / PASSAGES)
        except FileNotFoundError as e:
            raise IndexFormatError(
                f"index {folder} is damaged: {PASSAGES} is missing; rebuild it"
            ) from e
        passages = [Passage.from_dict(r) for r in rows]
        if len(passages) != manifest.get("n_docs"):
            raise IndexFormatError(
                f"index {folder} is damaged: {len(passages)} passages but the manifest says "
                f"{manifest.get('n_docs')}; rebuild it"
            )
        obj = cls._from_saved(folder, manifest, passages, **kwargs)
        obj._set_passages(passages)
        return obj

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args}) [{len(self)} passages]"
