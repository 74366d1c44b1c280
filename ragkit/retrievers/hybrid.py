"""Hybrid retrieval: fuse the rankings of several retrievers (typically BM25 + dense).

Each sub-retriever returns its top ``depth`` passages per query; the lists are fused with

* ``rrf`` -- reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009)::

      score(d) = sum_r w_r / (k + rank_r(d)),   rank 1-based, k = 60, w_r = 1 by default

* ``minmax`` -- min-max weighted score fusion (Fox & Shaw, TREC-2 1993)::

      score(d) = sum_r w_r * (s_r(d) - min_r) / (max_r - min_r)

A document that a sub-retriever did not return contributes 0 for that retriever. The fusion
functions live in :mod:`ragkit.retrievers.fusion`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.retrievers.base import (
    MANIFEST_CHECKSUM,
    IndexFormatError,
    Retriever,
    index_path,
    load_retriever,
    read_manifest,
    register_retriever,
)
from ragkit.retrievers.fusion import check_weights, fuse
from ragkit.types import Passage, Query

logger = logging.getLogger(__name__)

__all__ = ["HybridRetriever"]

_SUB_OPTIONS = {
    "dense": {"model", "device", "batch_size", "nprobe", "ef_search", "use_gpu", "show_progress"},
    "bm25": {"n_threads", "scoring_backend", "show_progress"},
}


@register_retriever
class HybridRetriever(Retriever):
    """Fusion of several retrievers (formulas in the module docstring).

    Parameters
    ----------
    retrievers
        The sub-retrievers (indexed or not). ``None`` = ``[BM25Retriever(), DenseRetriever()]``
        with their defaults (the embedded MiniLM encoder).
    method
        ``"rrf"`` or ``"minmax"``.
    weights
        One weight per retriever (default: all 1).
    rrf_k
        The RRF constant ``k``.
    depth
        How many hits each sub-retriever contributes per query (at least the requested ``k``).

    ``index(passages)`` indexes every sub-retriever, except one that already holds exactly
    these passages (same ids, same order), which is reused as it is.
    """

    kind = "hybrid"
    manifest_fields = {"retrievers": list}

    def __init__(
        self,
        retrievers: Sequence[Retriever] | None = None,
        method: str = "rrf",
        weights: Sequence[float] | None = None,
        rrf_k: int = 60,
        depth: int = 100,
    ) -> None:
        super().__init__()
        if retrievers is None:
            from ragkit.retrievers.bm25 import BM25Retriever
            from ragkit.retrievers.dense import DenseRetriever

            retrievers = [BM25Retriever(), DenseRetriever()]
        retrievers = list(retrievers)
        if not retrievers:
            raise ValueError("HybridRetriever needs at least one retriever")
        if not all(isinstance(r, Retriever) for r in retrievers):
            raise ValueError("HybridRetriever takes Retriever objects")
        if method not in ("rrf", "minmax"):
            raise ValueError(f"unknown fusion method {method!r}; use 'rrf' or 'minmax'")
        if weights is not None:
            weights = check_weights(weights, len(retrievers))  # finite, one per retriever
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k <= 0:
            raise ValueError(f"rrf_k must be a positive integer, got {rrf_k!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth <= 0:
            raise ValueError(f"depth must be a positive integer, got {depth!r}")
        self.retrievers = retrievers
        self.method = method
        self.weights = None if weights is None else [float(w) for w in weights]
        self.rrf_k = int(rrf_k)
        self.depth = int(depth)
        self._sub_digests: list[str] = []  # sub-index manifest checksums of the last save

    @property
    def params(self) -> dict[str, Any]:
        return {"method": self.method, "weights": self.weights, "rrf_k": self.rrf_k,
                "depth": self.depth}

    def _manifest_extra(self) -> dict[str, Any]:
        # each sub-index is bound by its manifest's own checksum (read back from what
        # ``_save_files`` just wrote), so a sub-folder cannot be swapped for another index
        return {"retrievers": [{"dir": f"retriever_{i}", "kind": r.kind,
                                "manifest_sha256": self._sub_digests[i]}
                               for i, r in enumerate(self.retrievers)]}

    def _build(self, passages: list[Passage]) -> None:
        ids = [p.id for p in passages]
        for r in self.retrievers:
            # a sub-retriever that already indexes exactly these passages is reused as it is
            if r.is_indexed and [p.id for p in r.passages] == ids:
                continue
            r.index(passages)

    def _add(self, passages: list[Passage]) -> None:
        for r in self.retrievers:
            r.add(passages)

    def _search(self, queries: list[Query], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        depth = max(k, self.depth)
        runs = []
        for r in self.retrievers:
            lists = r.search(queries, k=depth)
            if self.method == "rrf":
                # rank-only run: strictly decreasing pseudo-scores keep the retriever's order
                runs.append({str(i): rl.to_run_dict() for i, rl in enumerate(lists)})
            else:
                runs.append({str(i): {h.id: h.score for h in rl} for i, rl in enumerate(lists)})
        fused = fuse(runs, method=self.method, weights=self.weights, k=self.rrf_k)
        out = []
        for i in range(len(queries)):
            res = fused[str(i)]
            pos = np.fromiter((self._pos[d] for d in res), dtype=np.int64, count=len(res))
            sc = np.fromiter(res.values(), dtype=np.float64, count=len(res))
            order = np.lexsort((pos, -sc))[:k]
            out.append((pos[order], sc[order]))
        return out

    def _save_files(self, folder: Path) -> None:
        self._sub_digests = []
        for i, r in enumerate(self.retrievers):
            sub = folder / f"retriever_{i}"
            sub.mkdir()
            r._write_into(sub)
            self._sub_digests.append(read_manifest(sub, verify=False)[MANIFEST_CHECKSUM])

    @classmethod
    def _manifest_paths(cls, manifest: Mapping[str, Any]) -> list[tuple[str, Any]]:
        entries = manifest.get("retrievers")
        if not entries or not all(isinstance(e, dict)
                                  and set(e) == {"dir", "kind", MANIFEST_CHECKSUM}
                                  for e in entries):
            raise IndexFormatError(
                "a hybrid index manifest must list its sub-indexes as "
                '[{"dir": ..., "kind": ..., "manifest_sha256": ...}, ...]; this one is '
                "damaged: rebuild it")
        return [("the sub-index folder", e["dir"]) for e in entries]

    @classmethod
    def _from_saved(cls, folder: Path, manifest: dict[str, Any], passages: list[Passage],
                    **kwargs: Any) -> HybridRetriever:
        subs = []
        for e in manifest["retrievers"]:
            sub_dir = index_path(folder, e["dir"], "the sub-index folder")  # checked: inside
            allowed = _SUB_OPTIONS.get(e["kind"], set(kwargs))
            opts = {k: v for k, v in kwargs.items() if k in allowed}
            if read_manifest(sub_dir, verify=False)[MANIFEST_CHECKSUM] != e[MANIFEST_CHECKSUM]:
                raise IndexFormatError(
                    f"index {folder} is damaged: {e['dir']} is not the sub-index this hybrid "
                    "index was saved with; rebuild it")
            sub = load_retriever(sub_dir, **opts)
            if sub.kind != e["kind"]:
                raise IndexFormatError(
                    f"index {folder} is damaged: {e['dir']} holds a {sub.kind} index, the "
                    f"manifest says {e['kind']}; rebuild it")
            if [p.id for p in sub.passages] != [p.id for p in passages]:
                raise IndexFormatError(
                    f"index {folder} is damaged: {e['dir']} indexes other passages; rebuild it"
                )
            subs.append(sub)
        params = dict(manifest.get("params") or {})
        try:
            return cls(retrievers=subs, **params)
        except (TypeError, ValueError) as e:
            raise IndexFormatError(f"{folder}: bad hybrid parameters in the manifest ({e}); "
                                   "rebuild the index") from e
