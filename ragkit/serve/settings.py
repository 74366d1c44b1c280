"""Settings of ``ragkit serve``: batching, queue and request limits, authentication."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
        Most characters in the query and in each document (more: 413; nothing is truncated).
    api_key
        When set, every rerank request must send ``Authorization: Bearer <api_key>`` (else 401).
        ``/health`` and ``/metrics`` stay open.
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
    """

    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 256
    max_documents: int = 1000
    max_chars: int = 20_000
    api_key: str | None = None
    retry_after_s: int = 1
    model_name: str = "ragkit-reranker"
    max_batch_tokens: int = 4096
    forward_cost_tokens: int = 128

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_queue", "max_documents", "max_chars", "retry_after_s",
                     "max_batch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"ServeSettings.{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.forward_cost_tokens, int) or isinstance(self.forward_cost_tokens, bool) \
                or self.forward_cost_tokens < 0:
            raise ValueError(f"ServeSettings.forward_cost_tokens must be an integer >= 0, got "
                             f"{self.forward_cost_tokens!r}")
        if not isinstance(self.max_wait_ms, (int, float)) or self.max_wait_ms < 0:
            raise ValueError(f"ServeSettings.max_wait_ms must be >= 0, got {self.max_wait_ms!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("ServeSettings.api_key is empty; pass a non-empty key or None for no auth")

    @property
    def max_body_bytes(self) -> int:
        """Largest request body accepted (413 above): every document at ``max_chars`` UTF-8 worst case."""
        return 4 * self.max_chars * (self.max_documents + 1) + 65_536

    def public(self) -> dict[str, Any]:
        """The settings without the API key (for ``/health`` and logs)."""
        d = asdict(self)
        d["api_key"] = "set" if self.api_key else None
        return d
