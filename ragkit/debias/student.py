"""``DistilledReranker``: the one-pass cross-encoder student of Mixture-of-Intervention.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) needs ``M`` generator passes over all ``k`` passages per question;
its utilities on training questions become the targets of a cross-encoder ``f(q, p)`` that scores
each (question, passage) pair once (training: :mod:`ragkit.training.distill`). This module holds
the inference side only, so evaluation, serving and the pipeline load a student without importing
the trainers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.io import atomic_dir

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import CrossEncoder

__all__ = ["DistilledReranker", "META_FILE"]

logger = logging.getLogger(__name__)

META_FILE = "ragkit_distill.json"
_META_FORMAT = "ragkit-distilled-reranker/1"


class DistilledReranker(CrossEncoderReranker):
    """A cross-encoder student of MoI: one encoder pass per (query, passage) pair.

    Parameters
    ----------
    model
        A sentence-transformers ``CrossEncoder`` with one output (a raw logit per pair).
    metadata
        Training provenance saved beside the weights (base model, loss, label file, ...).
    batch_size
        Pairs per encoder forward in :meth:`score_pairs`.
    show_progress
        Progress bar in ``predict`` (``None``: off).

    Examples
    --------
    >>> student = DistilledReranker.load("students/minilm-moi")       # doctest: +SKIP
    >>> student.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris ..."]).top_k(1)  # doctest: +SKIP
    """

    name = "student"

    def __init__(
        self,
        model: CrossEncoder,
        metadata: Mapping[str, Any] | None = None,
        batch_size: int = 64,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(model, batch_size=batch_size, show_progress=show_progress)
        self.metadata: dict[str, Any] = dict(metadata or {})

    @classmethod
    def from_base(
        cls,
        base_model: str | None = None,
        *,
        device: str = "auto",
        max_length: int = 256,
        seed: int = 0,
        batch_size: int = 64,
    ) -> DistilledReranker:
        """A fresh (untrained head) student from an encoder.

        Parameters
        ----------
        base_model
            ``None`` for the embedded all-MiniLM-L6-v2; any sentence-transformers folder, Hugging
            Face encoder or cross-encoder (path or hub id).
        device
            ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        max_length
            Token limit of a (query, passage) pair; longer pairs are truncated.
        seed
            Seeds the randomly initialised scoring head.
        """
        import torch
        from sentence_transformers import CrossEncoder

        from ragkit.models import resolve_device, resolve_embedder_path

        path = resolve_embedder_path(base_model)
        torch.manual_seed(seed)
        model = CrossEncoder(
            path,
            num_labels=1,
            max_length=max_length,
            device=resolve_device(device),
            activation_fn=torch.nn.Identity(),
        )
        meta = {"base_model": base_model or "all-MiniLM-L6-v2", "base_path": path,
                "max_length": max_length, "seed": seed}
        return cls(model, meta, batch_size=batch_size)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, *, device: str = "auto", batch_size: int = 64, max_length: int | None = None
    ) -> DistilledReranker:
        """Wrap any existing one-output cross-encoder (hub id or folder) without training."""
        plain = CrossEncoderReranker.from_pretrained(name_or_path, device=device, max_length=max_length)
        return cls(plain.model, {"base_model": name_or_path}, batch_size=batch_size)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str = "auto", batch_size: int = 64) -> DistilledReranker:
        """Load a student saved by :meth:`save` (or by ``ragkit distill``)."""
        import torch
        from sentence_transformers import CrossEncoder

        from ragkit.models import resolve_device

        p = Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"no such reranker folder: {p}; train one with `ragkit distill`")
        meta_path = p / META_FILE
        if not meta_path.exists():
            raise ValueError(
                f"{p} is not a ragkit distilled reranker (no {META_FILE}); train one with "
                "`ragkit distill --labels FILE --out DIR`, or wrap a plain cross-encoder with "
                "DistilledReranker.from_pretrained(path)"
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{meta_path} is not valid JSON ({e.msg}); the folder is damaged, retrain") from e
        if meta.get("format") != _META_FORMAT:
            raise ValueError(f"{meta_path}: unknown format {meta.get('format')!r}; expected {_META_FORMAT!r}")
        model = CrossEncoder(str(p), device=resolve_device(device), activation_fn=torch.nn.Identity(),
                             local_files_only=True)
        return cls(model, meta.get("metadata", {}), batch_size=batch_size)

    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Save weights (safetensors), tokenizer, config and ``ragkit_distill.json`` atomically.

        Replaces only a previous distilled reranker (or, with ``overwrite``, another ragkit artifact
        or a file); never a folder of other files (:func:`ragkit.io.check_writable_dir`).
        """
        out = Path(path)
        with atomic_dir(out, kind="reranker", overwrite=overwrite) as tmp:
            self.model.save(str(tmp), safe_serialization=True)
            meta = {"format": _META_FORMAT, "metadata": self.metadata}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False, default=str),
                                         encoding="utf-8")
        logger.info("saved distilled reranker to %s", out)
        return out
