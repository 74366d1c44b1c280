"""``BiEncoderReranker``: the bi-encoder student of MoI at inference, ``s(q, p) = cos(E(q), E(p))``.

The student is the dense retriever's embedder fine-tuned on MoI utilities (training:
:func:`ragkit.training.bi_encoder.train_bi_encoder`). It reranks a question's candidates by
cosine similarity: one encoder pass for the question and one per passage, no generator pass.
Its folder is a sentence-transformers model plus ``ragkit_distill.json`` (format
:data:`BI_META_FORMAT`); ``student:PATH`` loads it (:func:`ragkit.debias.get_reranker`), so
``ragkit eval``, ``ragkit rerank`` and ``ragkit serve`` take it like a cross-encoder student.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.debias.cross_encoder import pair_text
from ragkit.debias.student import META_FILE, _check_folder_files
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["BI_META_FORMAT", "BiEncoderReranker", "is_bi_encoder_folder"]

BI_META_FORMAT = "ragkit-bi-encoder-student/1"


def is_bi_encoder_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a bi-encoder student (its ``ragkit_distill.json`` says so)."""
    meta = Path(path) / META_FILE
    try:
        return json.loads(meta.read_text(encoding="utf-8")).get("format") == BI_META_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


class BiEncoderReranker(Reranker):
    """Rerank by ``cos(E(q), E(p))`` with a fine-tuned sentence-transformers embedder.

    Parameters
    ----------
    model
        A ``SentenceTransformer``.
    metadata
        Training provenance (``ragkit_distill.json``).
    batch_size
        Texts per encoder forward.
    """

    name = "bi-encoder-student"

    def __init__(self, model: Any, metadata: Mapping[str, Any] | None = None, batch_size: int = 64) -> None:
        self.model = model
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.batch_size = batch_size
        self.forward_passes = 0

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str = "auto", batch_size: int = 64) -> BiEncoderReranker:
        """Load a folder saved by ``ragkit distill --student bi-encoder`` (safetensors weights only)."""
        from sentence_transformers import SentenceTransformer

        from ragkit.models import resolve_device

        p = Path(path)
        if not is_bi_encoder_folder(p):
            raise ValueError(f"{p} is not a ragkit bi-encoder student (no {META_FILE} of format {BI_META_FORMAT!r}); "
                             "train one with `ragkit distill --student bi-encoder`")
        _check_folder_files(p)
        meta = json.loads((p / META_FILE).read_text(encoding="utf-8"))
        model = SentenceTransformer(str(p), device=resolve_device(device), local_files_only=True)
        return cls(model, meta.get("metadata", {}), batch_size=batch_size)

    @classmethod
    def from_pretrained(cls, name: str, *, device: str = "auto", batch_size: int = 64) -> BiEncoderReranker:
        """A stock sentence-transformers embedder as a reranker (``bi-encoder:NAME``): a folder, a hub id, or
        ``all-MiniLM-L6-v2`` (the embedded default, offline). Untrained, it is the reference a bi-encoder
        student must beat: the student's gain over it is what the MoI labels taught, not the embedder."""
        from ragkit.models import load_embedder

        return cls(load_embedder(name, device=device), {"base_model": name, "trained": False}, batch_size=batch_size)

    def scores(self, questions: list[str], passages: list[list[Passage]]) -> list[np.ndarray]:
        """Cosine scores of each question's candidates (one encode call for questions, one for passages)."""
        enc: dict[str, Any] = dict(normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False,
                                   batch_size=self.batch_size)
        q = self.model.encode(list(questions), **enc)
        flat = [pair_text(p) for ps in passages for p in ps]
        d = self.model.encode(flat, **enc) if flat else np.zeros((0, q.shape[1]))
        self.forward_passes += len(questions) + len(flat)
        out, start = [], 0
        for i, ps in enumerate(passages):
            out.append(d[start : start + len(ps)] @ q[i])
            start += len(ps)
        return out

    def _rank_many(self, queries: list[Query], passages: list[list[Passage]],
                   scores: list[list[float] | None]) -> list[RankedList]:
        del scores  # the student's own similarity; ties keep the retriever order
        s = self.scores([q.text for q in queries], passages)
        # the call's encoder passes (each question and each passage once), shared by its queries as RankInfo says
        info = RankInfo(forward_passes=len(queries) + sum(len(ps) for ps in passages))
        return [RankedList.from_scores(ps, x.astype(float).tolist(), q, info=info)
                for q, ps, x in zip(queries, passages, s)]
