"""``CrossEncoderReranker``: any sentence-transformers ``CrossEncoder`` as a ragkit reranker.

A cross-encoder scores each (query, passage) pair jointly with one encoder pass, ``s = f(q, p)``
(Nogueira & Cho, "Passage Re-ranking with BERT", arXiv 1901.04085); passages sort by ``s``
descending, ties keeping the retriever order. All pairs of all queries go through one batched
``predict`` call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ragkit.io import progress_enabled
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList

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
        Pairs per encoder forward.
    show_progress
        Progress bar in ``predict`` (``None``: off).

    Examples
    --------
    >>> rr = CrossEncoderReranker("cross-encoder/ms-marco-MiniLM-L6-v2")   # doctest: +SKIP
    >>> rr.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris ..."]).ids()  # doctest: +SKIP
    """

    name = "cross-encoder"

    def __init__(self, model: CrossEncoder | str, batch_size: int = 64, show_progress: bool | None = None) -> None:
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
        self.forward_passes = 0  # encoder sequences scored so far (cost accounting)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str = "auto", batch_size: int = 64, max_length: int | None = None
    ) -> CrossEncoderReranker:
        """Load a one-output cross-encoder from a folder or a hub id (scores are raw logits)."""
        return cls(_load_cross_encoder(name_or_path, device=device, max_length=max_length), batch_size=batch_size)

    def score_pairs(self, queries: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[np.ndarray]:
        """Raw scores, one array per query, from ONE batched ``predict`` over all pairs."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        pairs = [(q, pair_text(p)) for q, ps in zip(queries, passages) for p in ps]
        if not pairs:
            return [np.zeros(0, dtype=np.float32) for _ in queries]
        show = bool(self.show_progress) and progress_enabled(self.show_progress)
        flat = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=show, convert_to_numpy=True)
        self.forward_passes += len(pairs)
        flat = np.asarray(flat, dtype=np.float32).reshape(-1)
        out: list[np.ndarray] = []
        start = 0
        for ps in passages:
            out.append(flat[start : start + len(ps)])
            start += len(ps)
        return out

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        per_query = self.score_pairs([q.text for q in queries], passages)
        return [RankedList.from_scores(ps, s.tolist(), q) for q, ps, s in zip(queries, passages, per_query)]


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
