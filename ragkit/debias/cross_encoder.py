"""``CrossEncoderReranker``: any sentence-transformers ``CrossEncoder`` as a ragkit reranker.

A cross-encoder scores each (query, passage) pair jointly with one encoder pass, ``s = f(q, p)``
(Nogueira & Cho, "Passage Re-ranking with BERT", arXiv 1901.04085); passages sort by ``s``
descending, ties keeping the retriever order. Because every pair is scored on its own, the pairs
of all queries of one ``rank_many`` call can be regrouped freely without changing any score, so
:meth:`CrossEncoderReranker.rank_many`

1. scores each distinct ``(query text, passage text)`` pair once (a popular query, a repeated
   request or a document listed twice costs nothing extra);
2. cuts each pair to the encoder's budget on text, before any pair is tokenised, by the
   reranker's long-document rule (:class:`ragkit.debias.long_docs.LongDocs`: a per-document
   token cap, the truncation side, or chunks scored separately and aggregated by their maximum);
   a document that fits is passed through unchanged;
3. measures each resulting pair's token length with the model's own tokenizer and cuts the pairs
   into length buckets, one encoder forward each (:func:`ragkit.batching.length_buckets`), so that
   a short pair is not padded to the longest pair of the call;
4. rebuilds every query's ranking from its pairs' scores (``RankedList.from_scores``); its
   ``info.details["long_docs"]`` says how many documents were truncated or chunked, and which
   (:meth:`ragkit.debias.long_docs.CutPairs.details`).

``ragkit serve`` micro-batches concurrent requests into one such call, and evaluation gets the
same saving offline.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.batching import length_buckets
from ragkit.debias.calibration import PlattCalibration
from ragkit.debias.long_docs import CutPairs, LongDocs, LongDocStats, cut_pairs
from ragkit.io import progress, progress_enabled
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import CrossEncoder

__all__ = ["CrossEncoderReranker", "pair_text"]

logger = logging.getLogger(__name__)


def pair_text(p: Passage) -> str:
    """The passage side of a (query, passage) pair: title and text, as shown to the generator."""
    return p.contents


class CrossEncoderReranker(Reranker):
    """Rerank with a one-output cross-encoder (raw logits, no activation).

    Parameters
    ----------
    model
        A loaded ``sentence_transformers.CrossEncoder`` with one output label, or a folder /
        hub id to load (see :meth:`from_pretrained` for the loading options).
    batch_size
        Most pairs per encoder forward.
    show_progress
        Progress bar over the encoder batches (``None``: off).
    max_batch_tokens
        Most padded tokens (rows x longest pair) per encoder forward in :meth:`rank_many`;
        ``None``: no cap beyond ``batch_size``.
    forward_cost_tokens
        The fixed cost of one encoder forward in tokens, traded against padding when the pairs
        of a call are cut into length buckets (:func:`ragkit.batching.length_buckets`; ``0``: minimise padding
        only). Small on one CPU thread and on a GPU's launch queue, larger where intra-op threads
        must meet at every operator.
    long_docs
        How documents longer than the encoder are read (:class:`~ragkit.debias.long_docs.LongDocs`:
        ``max_tokens_per_doc``, ``truncation_side``, ``chunking``, ``chunk_tokens``,
        ``chunk_stride``); ``None``: truncate to the encoder's budget, keeping the beginning.

    Attributes
    ----------
    forward_passes
        Encoder sequences scored so far (cost accounting; :meth:`score_pairs` included).
    pairs_requested, pairs_scored, padded_tokens, real_tokens
        Running totals of :meth:`rank_many`: pairs asked for, distinct pairs run through the
        encoder, and their padded / real token counts (``padded_tokens / real_tokens`` is the
        padding overhead).
    docs_truncated, docs_chunked
        Running totals of documents that were truncated / scored as several chunks (metrics; each
        query's own counts come back with its ranking, in ``info.details["long_docs"]``).
    calibration
        A :class:`~ragkit.debias.calibration.PlattCalibration` of the raw scores (read from the
        model folder's ``ragkit_calibration.json``), or ``None``.

    Examples
    --------
    >>> rr = CrossEncoderReranker("cross-encoder/ms-marco-MiniLM-L6-v2")   # doctest: +SKIP
    >>> rr.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris ..."]).ids()  # doctest: +SKIP
    """

    name = "cross-encoder"
    pointwise = True
    """Each (query, passage) score depends on that pair alone (``ragkit serve`` may cache it)."""

    def __init__(self, model: CrossEncoder | str, batch_size: int = 64, show_progress: bool | None = None,
                 max_batch_tokens: int | None = None, forward_cost_tokens: int = 128,
                 long_docs: LongDocs | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if isinstance(model, str):
            model = _load_cross_encoder(model)
        if model.num_labels != 1:
            raise ValueError(
                f"a reranking cross-encoder must have 1 output label, this one has {model.num_labels}; "
                "use a relevance cross-encoder (e.g. cross-encoder/ms-marco-MiniLM-L6-v2), or build a new "
                "student with DistilledReranker.from_base(...)"
            )
        self.model = model
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.max_batch_tokens = max_batch_tokens
        self.forward_cost_tokens = forward_cost_tokens
        self.long_docs = long_docs
        self.calibration: PlattCalibration | None = None  # raw score -> P(relevant); ragkit serve reports it
        self._reset_counters()

    @property
    def long_docs(self) -> LongDocs:
        """The long-document rule (:class:`~ragkit.debias.long_docs.LongDocs`)."""
        return self._long_docs

    @long_docs.setter
    def long_docs(self, value: LongDocs | None) -> None:
        if value is not None and not isinstance(value, LongDocs):
            raise TypeError(f"long_docs must be a ragkit.debias.long_docs.LongDocs or None, got {type(value).__name__}")
        self._long_docs = value or LongDocs()

    @property
    def max_batch_tokens(self) -> int | None:
        """Most padded tokens per encoder forward (``None``: only ``batch_size`` caps a batch)."""
        return self._max_batch_tokens

    @max_batch_tokens.setter
    def max_batch_tokens(self, value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"max_batch_tokens must be an integer >= 1 or None, got {value!r}")
        self._max_batch_tokens = value

    @property
    def forward_cost_tokens(self) -> int:
        """The fixed cost of one encoder forward, in tokens (see :func:`ragkit.batching.length_buckets`)."""
        return self._forward_cost_tokens

    @forward_cost_tokens.setter
    def forward_cost_tokens(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"forward_cost_tokens must be an integer >= 0, got {value!r}")
        self._forward_cost_tokens = value

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str = "auto", batch_size: int = 64, max_length: int | None = None,
        max_batch_tokens: int | None = None, forward_cost_tokens: int = 128, long_docs: LongDocs | None = None,
        backend: str = "torch",
    ) -> CrossEncoderReranker:
        """Load a one-output cross-encoder from a folder or a hub id (scores are raw logits).

        ``backend``: ``"torch"``, ``"onnx"``, ``"onnx-int8"`` (ONNX Runtime) or ``"openvino"``
        (OpenVINO), exported once and cached (:mod:`ragkit.debias.onnx_encoder`).
        """
        rr = cls(_load_cross_encoder(name_or_path, device=device, max_length=max_length), batch_size=batch_size,
                 max_batch_tokens=max_batch_tokens, forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)
        rr.calibration = PlattCalibration.find(name_or_path if Path(name_or_path).is_dir() else None)
        return rr.with_backend(backend, source=name_or_path) if backend != "torch" else rr

    @property
    def backend(self) -> str:
        """The encoder's backend: ``"torch"``, ``"onnx"``, ``"onnx-int8"`` or ``"openvino"``."""
        return str(getattr(self.model, "backend", "torch"))

    def with_backend(self, backend: str, source: str | None = None, threads: int | None = None) -> CrossEncoderReranker:
        """This reranker on another encoder backend: a copy with the same weights, settings and
        metadata, its counters at zero.

        ``"onnx"`` and ``"onnx-int8"`` run the exported graph with ONNX Runtime, ``"openvino"`` the
        fp32 graph compiled by OpenVINO (:func:`ragkit.debias.onnx_encoder.to_backend`; ``source``: the
        model's folder, whose own ``onnx/`` files are used when present; ``threads``: the engine's
        intra-op threads).
        ``"torch"`` returns the reranker itself when it already runs on torch.
        """
        from ragkit.debias.onnx_encoder import check_backend, to_backend

        check_backend(backend)
        if backend == self.backend:
            return self
        if self.backend != "torch":
            raise ValueError(f"this reranker runs on {self.backend}; load the model again with backend={backend!r}")
        clone = copy.copy(self)
        clone.model = to_backend(self.model, backend, source=source if source and Path(source).is_dir() else None,
                                 threads=threads)
        clone._reset_counters()
        return clone

    def _reset_counters(self) -> None:
        self.forward_passes = self.pairs_requested = self.pairs_scored = 0
        self.padded_tokens = self.real_tokens = self.docs_truncated = self.docs_chunked = 0

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[np.ndarray]:
        """Raw scores, one array per query, from ONE batched ``predict`` over all pairs (no deduplication
        beyond identical chunks); long documents are read by :attr:`long_docs` as in :meth:`rank_many`."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        pairs = [(q, pair_text(p)) for q, ps in zip(queries, passages) for p in ps]
        cut = self.cut(pairs)
        units = self._predict(cut.units, show=bool(self.show_progress) and progress_enabled(self.show_progress))
        flat = np.asarray(cut.aggregate(units), dtype=np.float32)
        out: list[np.ndarray] = []
        start = 0
        for ps in passages:
            out.append(flat[start : start + len(ps)])
            start += len(ps)
        return out

    def pair_lengths(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens of each (query, passage text) pair as the encoder sees it (truncated at its maximum length).

        Falls back to ``len(query + text) // 4`` (about 4 characters per English token) for a
        model without a tokenizer.
        """
        tok = getattr(self.model, "tokenizer", None)
        if tok is None or not callable(tok):
            return [max(1, (len(q) + len(t)) // 4) for q, t in pairs]
        max_length = _max_pair_length(self.model)
        enc = tok([q for q, _ in pairs], [t for _, t in pairs], truncation=max_length is not None,
                  max_length=max_length, padding=False, return_attention_mask=False, return_token_type_ids=False)
        return [len(ids) for ids in enc["input_ids"]]

    def cut(self, pairs: Sequence[tuple[str, str]]) -> CutPairs:
        """The pairs cut to the encoder's budget by :attr:`long_docs`, on text, before any pair is
        tokenised (:func:`ragkit.debias.long_docs.cut_pairs`).

        A model without a fast tokenizer (no token offsets) or without a length limit is read as
        before: every pair whole, truncated by the encoder itself, nothing reported.
        """
        tok = getattr(self.model, "tokenizer", None)
        max_length = _max_pair_length(self.model)
        if tok is None or not getattr(tok, "is_fast", False) or not max_length:
            distinct = list(dict.fromkeys(pairs))
            where = {p: i for i, p in enumerate(distinct)}
            return CutPairs(distinct, self.pair_lengths(distinct), [[where[p]] for p in pairs], [False] * len(pairs))
        return cut_pairs(tok, pairs, int(max_length), self.long_docs)

    def _predict(self, pairs: list[tuple[str, str]], show: bool) -> np.ndarray:
        """Raw scores of ``pairs`` (one flat float32 array) from one ``predict`` call."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        flat = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=show, convert_to_numpy=True)
        self.forward_passes += len(pairs)
        return np.asarray(flat, dtype=np.float32).reshape(-1)

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        index: dict[tuple[str, str], int] = {}
        rows: list[list[int]] = []  # per query: the distinct pair of each passage
        for q, ps in zip(queries, passages):
            rows.append([index.setdefault((q.text, pair_text(p)), len(index)) for p in ps])
        pairs = list(index)  # insertion order: pair k is index k
        cut = self.cut(pairs)  # the encoder's units: pairs cut on text, or their chunks
        lengths = cut.lengths
        buckets = length_buckets(lengths, self.batch_size, self.max_batch_tokens, self.forward_cost_tokens)
        units = np.zeros(len(cut.units), dtype=np.float32)
        for b in progress(buckets, bool(self.show_progress), desc="cross-encoder batches", unit="batch"):
            units[b] = self._predict([cut.units[k] for k in b], show=False)
            self.padded_tokens += len(b) * lengths[b[0]]
        flat = np.asarray(cut.aggregate(units), dtype=np.float32)
        self.pairs_requested += sum(len(r) for r in rows)
        self.pairs_scored += len(cut.units)
        self.real_tokens += sum(lengths)
        total = sum((cut.stats(r) for r in rows), LongDocStats())
        self.docs_truncated += total.truncated
        self.docs_chunked += total.chunked
        return [RankedList.from_scores(ps, flat[r].tolist(), q, RankInfo(forward_passes=len(cut.units),
                                                                           details={"long_docs": cut.details(r)}))
                for q, ps, r in zip(queries, passages, rows)]


def _max_pair_length(model: Any) -> int | None:
    """The encoder's truncation length (``max_seq_length`` since sentence-transformers 4, else ``max_length``)."""
    if hasattr(type(model), "max_seq_length"):
        return model.max_seq_length
    return getattr(model, "max_length", None)


def _load_cross_encoder(name_or_path: str, device: str = "auto", max_length: int | None = None) -> CrossEncoder:
    """``CrossEncoder(name_or_path)`` with raw-logit output on the resolved device."""
    import torch
    from sentence_transformers import CrossEncoder

    from ragkit.models import resolve_device

    try:
        return CrossEncoder(name_or_path, device=resolve_device(device), max_length=max_length,
                            activation_fn=torch.nn.Identity())
    except OSError as e:
        raise OSError(f"cannot load the cross-encoder {name_or_path!r} ({e}); pass a local folder or a "
                      "Hugging Face hub id that is downloaded (or unset HF_HUB_OFFLINE)") from e
