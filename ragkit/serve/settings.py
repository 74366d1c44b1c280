"""Settings of ``ragkit serve``: batching, queue and request limits, authentication."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ragkit.debias.long_docs import LongDocs
from ragkit.io import redact_url

__all__ = ["ServeSettings"]


@dataclass(frozen=True)
class ServeSettings:
    """Knobs of the reranking service.

    Parameters
    ----------
    max_batch_size
        Most requests merged into one ``rank_many`` call.
    max_wait_ms
        How long the first request of a batch waits for companions before the batch runs
        (a batch also runs as soon as it is full). ``0``: run whatever is queued at once.
    max_queue
        Most requests waiting for the model; one more is refused with 503 + ``Retry-After``.
    max_documents
        Most documents in one request (more: 413).
    max_chars
        Most characters in the query (more: 413) and the document size the body limit is sized for
        (:attr:`max_body_bytes`). A longer document is not refused: the reranker reads it by its
        long-document rule (``long_docs``) and the response's ``meta`` counts it as truncated or
        chunked.
    max_request_chars
        The per-request work budget: most characters of (query, document) pairs in one request,
        each pair counted as ``min(len(query) + len(doc), max_pair_chars)`` (more: 413). A
        reranker's time grows with the pairs it reads, so a request that would hold the model for
        minutes is refused at once rather than run while every other request waits.
    max_pair_chars
        The most characters of one pair the work budget counts: rerankers read a bounded window
        of each pair (a cross-encoder cuts query and document to its token budget before
        tokenising), so text past it adds no work. The default covers a 512-token window.
    max_batch_documents
        Most documents merged into one reranker call (a request with more runs alone or, for a
        cross-encoder, in slices).
    slice_documents
        A cross-encoder (pointwise: each pair scored on its own) ranks a request of more documents
        than this in slices of this many, one slice per reranker call, taken round-robin with the
        other requests, so a small request sent meanwhile waits for one slice, not for the whole
        large request; the merged ranking equals the unsliced one. ``0``: never slice. (32 pairs
        fill two encoder forwards at the default ``max_batch_tokens`` for 256-token pairs.)
    request_timeout_s
        The deadline of a request, queueing included: one not answered by then gets 504 (its work
        is dropped when it has not started), and ``/health`` reports a backend call running longer
        as stuck.
    max_pending_bytes
        Most request-body bytes held by the server at once, over all requests being read or
        ranked (``None``: twice :attr:`max_body_bytes`); a body that would pass it gets 503 +
        ``Retry-After``, so that concurrent large bodies cannot exhaust memory.
    shutdown_grace_s
        On SIGTERM / Ctrl-C, how long requests in flight may finish before they are cancelled.
    api_key
        When set, every rerank request must send ``Authorization: Bearer <api_key>`` (else 401);
        surrounding whitespace is stripped (as it is from the client's token) and the key is
        compared as UTF-8 bytes. ``/health`` (status only) and ``/metrics`` stay open.
    retry_after_s
        The ``Retry-After`` value (seconds) sent with a 503.
    model_name
        The name reported in responses and ``/health``.
    max_batch_tokens
        For a cross-encoder reranker (the student): most padded tokens (rows x longest pair) in
        one encoder forward of a merged batch; set on the reranker
        (:class:`ragkit.debias.cross_encoder.CrossEncoderReranker`).
    forward_cost_tokens
        For a cross-encoder reranker: the fixed cost of one encoder forward in tokens, which the
        reranker weighs against padding when it cuts a merged batch into length buckets
        (:func:`ragkit.batching.length_buckets`; ``0``: minimise padding only).
    long_docs
        For a pointwise reranker (cross-encoder, student, ``llm:``): how documents longer than the
        encoder are read (:class:`ragkit.debias.long_docs.LongDocs`: ``max_tokens_per_doc``,
        truncation side, chunk-then-max); ``None``: the reranker's own rule.
    cache_size
        Most (query, document) scores kept in the LRU cache of a pointwise reranker
        (:mod:`ragkit.serve.cache`); ``0``: no cache.
    effect_threshold
        For MoI: a document ``helps`` when its utility is above ``+effect_threshold``, ``hurts``
        when below ``-effect_threshold``, else it is ``neutral``.
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 256
    max_documents: int = 1000
    max_chars: int = 20_000
    max_request_chars: int = 1_000_000
    max_pair_chars: int = 2048
    max_batch_documents: int = 256
    slice_documents: int = 32
    request_timeout_s: float = 60.0
    max_pending_bytes: int | None = None
    shutdown_grace_s: float = 5.0
    api_key: str | None = None
    retry_after_s: int = 1
    model_name: str = "ragkit-reranker"
    max_batch_tokens: int = 4096
    forward_cost_tokens: int = 128
    long_docs: LongDocs | None = None
    cache_size: int = 10_000
    effect_threshold: float = 0.05

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue", "max_documents", "max_chars", "retry_after_s",
                     "max_batch_tokens", "max_request_chars", "max_pair_chars", "max_batch_documents"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ServeSettings.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.slice_documents, int) or isinstance(self.slice_documents, bool) \
                or self.slice_documents < 0:
            raise ValueError(f"ServeSettings.slice_documents must be an integer >= 0, got {self.slice_documents!r}")
        if not isinstance(self.forward_cost_tokens, int) or isinstance(self.forward_cost_tokens, bool) \
                or self.forward_cost_tokens < 0:
            raise ValueError(f"ServeSettings.forward_cost_tokens must be an integer >= 0, got "
                             f"{self.forward_cost_tokens!r}")
        if not isinstance(self.cache_size, int) or isinstance(self.cache_size, bool) or self.cache_size < 0:
            raise ValueError(f"ServeSettings.cache_size must be an integer >= 0 (0: no cache), got {self.cache_size!r}")
        if self.long_docs is not None and not isinstance(self.long_docs, LongDocs):
            raise ValueError(f"ServeSettings.long_docs must be a ragkit.debias.long_docs.LongDocs or None, got "
                             f"{type(self.long_docs).__name__}")
        if not isinstance(self.effect_threshold, (int, float)) or isinstance(self.effect_threshold, bool) \
                or not math.isfinite(self.effect_threshold) or self.effect_threshold < 0:
            raise ValueError(f"ServeSettings.effect_threshold must be a finite number >= 0, got "
                             f"{self.effect_threshold!r}")
        if self.max_pending_bytes is not None and (not isinstance(self.max_pending_bytes, int)
                                                   or isinstance(self.max_pending_bytes, bool)
                                                   or self.max_pending_bytes < 1):
            raise ValueError(f"ServeSettings.max_pending_bytes must be an integer >= 1 or None, got "
                             f"{self.max_pending_bytes!r}")
        # a wait of inf or nan would never end (and nan compares false with everything): finite numbers only
        for name, low, high in (("max_wait_ms", 0.0, 60_000.0), ("request_timeout_s", 1e-3, 86_400.0),
                                ("shutdown_grace_s", 0.0, 3_600.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not low <= v <= high:
                raise ValueError(f"ServeSettings.{name} must be a finite number from {low:g} to {high:g}, got {v!r}")
        if self.api_key is not None:
            if not isinstance(self.api_key, str) or not self.api_key.strip():
                raise ValueError("ServeSettings.api_key is empty; pass a non-empty key, or None to serve without "
                                 "authentication")
            object.__setattr__(self, "api_key", self.api_key.strip())
        object.__setattr__(self, "model_name", redact_url(str(self.model_name)))

    @property
    def max_body_bytes(self) -> int:
        """Largest request body accepted (413 above): every document at ``max_chars`` UTF-8 worst case."""
        return 4 * self.max_chars * (self.max_documents + 1) + 65_536

    @property
    def pending_bytes_limit(self) -> int:
        """:attr:`max_pending_bytes`, or twice :attr:`max_body_bytes` when it is ``None``."""
        return self.max_pending_bytes if self.max_pending_bytes is not None else 2 * self.max_body_bytes

    def public(self) -> dict[str, Any]:
        """The settings without the API key (for ``/health`` and logs)."""
        d = asdict(self)
        d["api_key"] = "set" if self.api_key else None
        d["long_docs"] = self.long_docs.to_dict() if self.long_docs is not None else None
        return d
