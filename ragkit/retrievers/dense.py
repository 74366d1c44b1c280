"""Dense retrieval: a sentence-transformers bi-encoder and a FAISS inner-product index.

Passages (``title\\ntext``) and queries are encoded in batches into L2-normalised vectors, so
the inner product is the cosine similarity (Reimers & Gurevych, "Sentence-BERT", EMNLP 2019).
A corpus is encoded ``64 * batch_size`` passages at a time and each chunk goes straight into
FAISS (an IVF index gathers all vectors first: its k-means needs them)::

    score(q, d) = <e(q), e(d)> / (||e(q)|| ||e(d)||)

Index types (Johnson, Douze & Jégou, "Billion-scale similarity search with GPUs", 2019):

* ``flat``: ``IndexFlatIP``, exact search;
* ``hnsw``: ``IndexHNSWFlat`` with the inner-product metric (Malkov & Yashunin, TPAMI 2018),
  approximate; ``hnsw_m`` links per node, ``ef_search`` candidates at query time;
* ``ivf``: ``IndexIVFFlat`` over an ``IndexFlatIP`` coarse quantiser trained with k-means on the
  corpus vectors; ``nlist`` cells (default ``round(sqrt(n))``), ``nprobe`` cells visited per query.

When FAISS is built with GPU support and ``faiss.get_num_gpus() > 0``, flat and IVF indexes are
moved to GPU 0 (``use_gpu="auto"``); HNSW stays on the CPU (FAISS has no GPU HNSW). Saved files
are always CPU indexes written with ``faiss.write_index``; row ``i`` of the index is line ``i``
of ``passages.jsonl`` (the id map).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.io import progress, progress_enabled
from ragkit.models import DEFAULT_EMBEDDER, load_embedder, resolve_embedder_path
from ragkit.retrievers.base import IndexFormatError, Retriever, check_passages, register_retriever
from ragkit.types import Passage, Query

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

__all__ = ["DenseRetriever", "INDEX_TYPES", "embedder_name"]

INDEX_TYPES = ("flat", "hnsw", "ivf")
INDEX_FILE = "index.faiss"


def embedder_name(model: str | None) -> str:
    """Canonical name of an embedder: the default's aliases map to ``DEFAULT_EMBEDDER``,
    existing local paths to their absolute path, anything else (hub ids) stays as given."""
    if model is None:
        return DEFAULT_EMBEDDER
    try:
        if resolve_embedder_path(model) == resolve_embedder_path(None):
            return DEFAULT_EMBEDDER
    except Exception:  # default not installed: compare by name only
        pass
    if model.lower() in ("default", DEFAULT_EMBEDDER.lower(),
                         f"sentence-transformers/{DEFAULT_EMBEDDER}".lower()):
        return DEFAULT_EMBEDDER
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else model


@register_retriever
class DenseRetriever(Retriever):
    """Bi-encoder retriever over a FAISS index (formulas in the module docstring).

    Parameters
    ----------
    model
        Embedder: ``None`` = the embedded ``all-MiniLM-L6-v2``, or any sentence-transformers hub
        id or local folder (loaded through :func:`ragkit.models.load_embedder`).
    index_type
        ``"flat"``, ``"hnsw"`` or ``"ivf"``.
    nprobe
        IVF cells searched per query.
    device
        Torch device of the encoder (``"auto"`` = CUDA when present).
    batch_size
        Encoder batch size.
    nlist
        IVF cells (``None``: ``round(sqrt(n_docs))``, at least 1).
    hnsw_m, ef_construction, ef_search
        HNSW graph degree and beam widths (``ef_search`` is raised to ``k`` when smaller).
    use_gpu
        ``"auto"`` (GPU FAISS when available), ``True`` (required) or ``False``.
    show_progress
        Progress bar while encoding the corpus.
    """

    kind = "dense"
    manifest_fields = {"embedder": dict, "faiss": dict}

    def __init__(
        self,
        model: str | None = None,
        index_type: str = "flat",
        nprobe: int = 8,
        device: str = "auto",
        batch_size: int = 64,
        nlist: int | None = None,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 64,
        use_gpu: bool | str = "auto",
        show_progress: bool | None = None,
    ) -> None:
        super().__init__()
        if index_type not in INDEX_TYPES:
            raise ValueError(f"unknown index_type {index_type!r}; use one of {INDEX_TYPES}")
        if nprobe <= 0 or batch_size <= 0 or hnsw_m <= 0 or ef_search <= 0:
            raise ValueError("nprobe, batch_size, hnsw_m and ef_search must be positive")
        if nlist is not None and nlist <= 0:
            raise ValueError(f"nlist must be positive or None, got {nlist}")
        if use_gpu not in ("auto", True, False):
            raise ValueError("use_gpu must be 'auto', True or False")
        self.model_name = model
        self.embedder = embedder_name(model)
        self.index_type = index_type
        self.nprobe = int(nprobe)
        self.device = device
        self.batch_size = int(batch_size)
        self.nlist = nlist
        self.hnsw_m, self.ef_construction, self.ef_search = hnsw_m, ef_construction, ef_search
        self.use_gpu = use_gpu
        self.show_progress = show_progress
        self._encoder: SentenceTransformer | None = None
        self._index: Any = None
        self._gpu_res: Any = None
        self.dimension: int | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {
            "model": self.model_name, "index_type": self.index_type, "nprobe": self.nprobe,
            "batch_size": self.batch_size, "nlist": self.nlist, "hnsw_m": self.hnsw_m,
            "ef_construction": self.ef_construction, "ef_search": self.ef_search,
        }

    def _manifest_extra(self) -> dict[str, Any]:
        return {
            "embedder": {"name": self.embedder, "dimension": self.dimension,
                         "normalized": True, "similarity": "inner_product"},
            "faiss": {"index_type": self.index_type, "ntotal": int(self._index.ntotal),
                      "file": INDEX_FILE},
        }

    # ------------------------------------------------------------------ encoding
    @property
    def encoder(self) -> SentenceTransformer:
        """The sentence-transformers model (loaded on first use)."""
        if self._encoder is None:
            enc = load_embedder(self.model_name, device=self.device)
            dim = enc.get_embedding_dimension()
            if self.dimension is not None and dim != self.dimension:
                raise ValueError(
                    f"embedder {self.embedder} gives {dim}-dim vectors but this index holds "
                    f"{self.dimension}-dim vectors; use the embedder the index was built with"
                )
            self._encoder = enc
        return self._encoder

    def encode_passages(
        self, passages: list[Passage], show_progress: bool | None = None
    ) -> np.ndarray:
        """Encode passages (``title\\ntext``) into L2-normalised float32 rows, in batches."""
        show = progress_enabled(self.show_progress if show_progress is None else show_progress)
        vecs = self.encoder.encode_document(
            [p.contents for p in passages], batch_size=self.batch_size,
            normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=show)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Encode query strings into L2-normalised float32 rows, in batches."""
        vecs = self.encoder.encode_query(
            list(queries), batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    # ------------------------------------------------------------------ FAISS
    def _new_index(self, vecs: np.ndarray) -> Any:
        import faiss

        d = vecs.shape[1]
        if self.index_type == "flat":
            index = faiss.IndexFlatIP(d)
        elif self.index_type == "hnsw":
            index = faiss.IndexHNSWFlat(d, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
        else:
            nlist = self.nlist or max(1, int(round(np.sqrt(len(vecs)))))
            nlist = min(nlist, len(vecs))
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            self._quantizer = quantizer  # keep the Python wrapper alive with the index
            index.cp.seed = 1234
            index.train(vecs)
        return self._maybe_gpu(index)

    def _maybe_gpu(self, index: Any) -> Any:
        import faiss

        if self.use_gpu is False or self.index_type == "hnsw":
            return index
        has_gpu = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
        if not has_gpu:
            if self.use_gpu is True:
                raise RuntimeError("use_gpu=True but this FAISS build sees no GPU: pip install \"ragkit[gpu]\" "
                                   "(faiss-gpu-cu12) on a CUDA machine, or pass use_gpu=\"auto\"")
            return index
        # GPU path (faiss-gpu builds only; not exercised on CPU-only machines).
        if self._gpu_res is None:
            self._gpu_res = faiss.StandardGpuResources()
        logger.info("moving the %s FAISS index to GPU 0", self.index_type)
        return faiss.index_cpu_to_gpu(self._gpu_res, 0, index)

    def _cpu_index(self) -> Any:
        import faiss

        if self._gpu_res is not None:
            return faiss.index_gpu_to_cpu(self._index)
        return self._index

    def _encoded_chunks(self, passages: list[Passage]) -> Iterator[np.ndarray]:
        """Vectors of ``64 * batch_size`` passages at a time: the texts of the whole corpus are
        never copied into one list, and FAISS receives each chunk as it is encoded."""
        step = 64 * self.batch_size
        show = progress_enabled(self.show_progress)
        starts = range(0, len(passages), step)
        for start in progress(starts, show=show and len(starts) > 1, desc="encode", leave=False):
            yield self.encode_passages(passages[start:start + step],  # one batch: no bar
                                       show_progress=show and len(starts) == 1 and len(passages) > self.batch_size)

    def _build(self, passages: list[Passage]) -> None:
        chunks = self._encoded_chunks(passages)
        first = next(chunks)
        self.dimension = int(first.shape[1])
        if self.index_type == "ivf":  # k-means needs every vector before the first add
            vecs = np.empty((len(passages), self.dimension), dtype=np.float32)
            vecs[: len(first)] = first
            pos = len(first)
            for c in chunks:
                vecs[pos:pos + len(c)] = c
                pos += len(c)
            index = self._new_index(vecs)
            index.add(vecs)
        else:
            index = self._new_index(first)
            index.add(first)
            for c in chunks:
                index.add(c)
        self._index = index

    def _add(self, passages: list[Passage]) -> None:
        for vecs in self._encoded_chunks(passages):
            self._index.add(vecs)

    def index_vectors(self, passages: Sequence[Passage], vectors: np.ndarray) -> DenseRetriever:
        """Index precomputed passage vectors (row ``i`` belongs to ``passages[i]``).

        The rows are L2-normalised here. They must come from this retriever's embedder for
        text queries to make sense; :meth:`search_vectors` works with any query vectors.
        """
        ps = check_passages(passages)
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != len(ps):
            raise ValueError(
                f"need one vector row per passage: got shape {vecs.shape} for {len(ps)} passages"
            )
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs = np.ascontiguousarray(vecs / np.maximum(norms, 1e-12))
        self.dimension = int(vecs.shape[1])
        index = self._new_index(vecs)
        index.add(vecs)
        self._index = index
        self._set_passages(ps)
        return self

    def _search(self, queries: list[Query], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        qv = self.encode_queries([q.text for q in queries])
        return self.search_vectors(qv, k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` (positions, scores) for already-encoded query vectors (one row each)."""
        idx = self._index
        if self.index_type == "ivf":
            idx.nprobe = min(self.nprobe, idx.nlist)
        elif self.index_type == "hnsw":
            idx.hnsw.efSearch = max(self.ef_search, k)
        scores, ids = idx.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return list(zip(ids, scores))

    # ------------------------------------------------------------------ persistence
    def _save_files(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self._cpu_index(), str(folder / INDEX_FILE))

    @classmethod
    def _required_files(cls, manifest: Any) -> set[str]:
        return {INDEX_FILE}

    @classmethod
    def load(cls, path: Any, model: str | None = None, **kwargs: Any) -> DenseRetriever:
        """Load a saved dense index.

        Parameters
        ----------
        path
            The index folder.
        model
            If given, the embedder the caller expects; an index built with another embedder
            raises ``IndexFormatError`` (queries would be encoded into a foreign vector space).
        **kwargs
            Runtime options: ``device``, ``batch_size``, ``nprobe``, ``ef_search``, ``use_gpu``,
            ``show_progress``.
        """
        return super().load(path, model=model, **kwargs)

    @classmethod
    def _from_saved(cls, folder: Path, manifest: dict[str, Any], passages: list[Passage],
                    **kwargs: Any) -> DenseRetriever:
        import faiss

        emb = manifest.get("embedder") or {}
        stored = emb.get("name")
        requested = kwargs.pop("model", None)
        if requested is not None and embedder_name(requested) != stored:
            raise IndexFormatError(
                f"index {folder} was built with embedder {stored!r}, not {requested!r}; "
                f"search it with {stored!r} or rebuild it with `ragkit index --kind dense "
                f"--embedder {requested}`"
            )
        params = dict(manifest.get("params") or {})
        runtime = {k: kwargs[k] for k in ("device", "batch_size", "nprobe", "ef_search",
                                          "use_gpu", "show_progress") if k in kwargs}
        unknown = set(kwargs) - set(runtime)
        if unknown:
            raise ValueError(f"unknown options for DenseRetriever.load: {sorted(unknown)}")
        params.update(runtime)
        try:
            obj = cls(**params)
        except TypeError as e:
            raise IndexFormatError(f"{folder}: bad dense parameters in the manifest ({e}); "
                                   "rebuild the index") from e
        if obj.embedder != stored:
            raise IndexFormatError(f"index {folder}: the manifest's embedder entries disagree")
        try:
            index = faiss.read_index(str(folder / INDEX_FILE))
        except RuntimeError as e:
            raise IndexFormatError(f"index {folder} is damaged ({e}); rebuild it") from e
        if index.ntotal != len(passages) or index.d != emb.get("dimension"):
            raise IndexFormatError(
                f"index {folder} is damaged: FAISS holds {index.ntotal} vectors of dim {index.d}, "
                f"the manifest says {len(passages)} of dim {emb.get('dimension')}; rebuild it"
            )
        obj.dimension = int(index.d)
        obj._index = obj._maybe_gpu(index)
        return obj
