"""Distil Mixture-of-Intervention into a one-pass cross-encoder reranker.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) needs ``M`` generator passes over all ``k`` passages per
question (``M = k`` for the cyclic design). Its ``gold``-outcome utilities ``u`` on training
questions (:mod:`ragkit.training.labels`) become the targets of a student cross-encoder
``f(q, p)`` that scores each (question, passage) pair once; the paper reports that a cheap
reranker keeps about half of MoI's gain at a small fraction of its cost.

Student: a sentence-transformers ``CrossEncoder`` (one logit per pair) initialised from an
encoder (default: the embedded all-MiniLM-L6-v2 weights; any sentence-transformers or Hugging
Face encoder/cross-encoder path or hub id), trained with ``CrossEncoderTrainer`` on, per query,
the targets ``y_i = (u_i - mean(u)) / (std(u) · T)`` (z-scored utilities, temperature ``T``):

* ``"ranknet"`` (pairwise; Burges et al., ICML 2005):
  ``L = mean_{(i,j): y_i > y_j} log2(1 + exp(-(f_i - f_j)))``;
* ``"listnet"`` (listwise; Cao et al., ICML 2007): ``L = CE(softmax(y), softmax(f))``;
* ``"lambdaloss"`` (Wang et al., CIKM 2018): RankNet pairs weighted by the NDCG-Loss2++ scheme.

At inference all (query, passage) pairs of all queries go through one batched ``predict`` call:
``k`` encoder passes per query and no generator pass.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.io import atomic_dir, progress_enabled
from ragkit.reranking import Reranker
from ragkit.training.labels import LabelRecord, read_labels
from ragkit.types import Passage, Query, RankedList

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from sentence_transformers import CrossEncoder

logger = logging.getLogger(__name__)

__all__ = [
    "LOSSES",
    "META_FILE",
    "DistilledReranker",
    "StudentTrainResult",
    "label_targets",
    "ranking_loss",
    "train_student",
]

LOSSES = ("ranknet", "listnet", "lambdaloss")
META_FILE = "ragkit_distill.json"
_META_FORMAT = "ragkit-distilled-reranker/1"


def label_targets(u: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Per-query training targets: ``(u - mean(u)) / (std(u) · temperature)``.

    A query whose utilities are all equal gets all-zero targets (no preferred pair).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    a = np.asarray(u, dtype=np.float64)
    sd = float(a.std())
    if sd < 1e-12:
        return [0.0] * len(a)
    return [float(x) for x in (a - a.mean()) / (sd * temperature)]


def _pair_text(p: Passage) -> str:
    return p.contents


class DistilledReranker(Reranker):
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
        Progress bar in ``predict`` (``None``: off unless logging at INFO).

    Examples
    --------
    >>> student = DistilledReranker.load("students/minilm-moi")       # doctest: +SKIP
    >>> student.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris ..."]).top_k(1)
    """

    def __init__(
        self,
        model: CrossEncoder,
        metadata: Mapping[str, Any] | None = None,
        batch_size: int = 64,
        show_progress: bool | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if model.num_labels != 1:
            raise ValueError(
                f"the student cross-encoder must have 1 output label, this one has {model.num_labels}; "
                "build it with DistilledReranker.from_base(...)"
            )
        self.model = model
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.forward_passes = 0  # encoder sequences scored so far (cost accounting)

    # ------------------------------------------------------------------ construction
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
        import torch
        from sentence_transformers import CrossEncoder

        from ragkit.models import resolve_device

        model = CrossEncoder(name_or_path, device=resolve_device(device), max_length=max_length,
                             activation_fn=torch.nn.Identity())
        return cls(model, {"base_model": name_or_path}, batch_size=batch_size)

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

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save weights (safetensors), tokenizer, config and ``ragkit_distill.json`` atomically."""
        out = Path(path)
        with atomic_dir(out) as tmp:
            self.model.save(str(tmp), safe_serialization=True)
            meta = {"format": _META_FORMAT, "metadata": self.metadata}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False, default=str),
                                         encoding="utf-8")
        logger.info("saved distilled reranker to %s", out)
        return out

    # ------------------------------------------------------------------ scoring
    def score_pairs(self, queries: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[np.ndarray]:
        """Raw student scores, one array per query, from ONE batched ``predict`` over all pairs."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        pairs = [(q, _pair_text(p)) for q, ps in zip(queries, passages) for p in ps]
        if not pairs:
            return [np.zeros(0, dtype=np.float32) for _ in queries]
        show = self.show_progress if self.show_progress is not None else False
        flat = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=show and progress_enabled(),
                                  convert_to_numpy=True)
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


# ----------------------------------------------------------------------------- training
def _make_loss(name: str, model: CrossEncoder) -> torch.nn.Module:
    from sentence_transformers.cross_encoder import losses

    if name == "ranknet":
        return losses.RankNetLoss(model, mini_batch_size=-1)
    if name == "listnet":
        return losses.ListNetLoss(model, mini_batch_size=-1)
    if name == "lambdaloss":
        return losses.LambdaLoss(model, mini_batch_size=-1)
    raise ValueError(f"unknown loss {name!r}; choose one of {LOSSES}")


def _as_labels(labels: Sequence[LabelRecord] | str | os.PathLike[str]) -> list[LabelRecord]:
    if isinstance(labels, (str, os.PathLike)):
        return read_labels(labels)
    out = list(labels)
    if not out:
        raise ValueError("no labels to train on; make some with `ragkit distill labels`")
    return out


def _training_rows(labels: Sequence[LabelRecord], temperature: float) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"query": [], "docs": [], "labels": []}
    for lab in labels:
        rows["query"].append(lab.question)
        rows["docs"].append([_pair_text(p) for p in lab.passages()])
        rows["labels"].append(label_targets(lab.u, temperature))
    return rows


def ranking_loss(
    reranker: DistilledReranker,
    labels: Sequence[LabelRecord] | str | os.PathLike[str],
    loss: str = "ranknet",
    temperature: float = 1.0,
    queries_per_batch: int = 8,
) -> float:
    """Mean training loss of ``reranker`` on ``labels`` (eval mode, no gradient).

    Batches of ``queries_per_batch`` queries, each scored in one forward over its pairs.
    """
    import torch

    labs = _as_labels(labels)
    fn = _make_loss(loss, reranker.model)
    rows = _training_rows(labs, temperature)
    was_training = reranker.model.training
    reranker.model.eval()
    total, weight = 0.0, 0
    try:
        with torch.no_grad():
            for i in range(0, len(labs), queries_per_batch):
                q = rows["query"][i : i + queries_per_batch]
                d = rows["docs"][i : i + queries_per_batch]
                y = [torch.tensor(t, dtype=torch.float32) for t in rows["labels"][i : i + queries_per_batch]]
                total += float(fn([q, d], y)) * len(q)
                weight += len(q)
    finally:
        reranker.model.train(was_training)
    return total / max(weight, 1)


@dataclass
class StudentTrainResult:
    """What :func:`train_student` produced."""

    reranker: DistilledReranker
    out_dir: str | None
    loss_history: list[float] = field(default_factory=list)
    initial_loss: float | None = None
    final_loss: float | None = None
    seconds: float = 0.0
    num_queries: int = 0
    num_pairs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "loss_history": self.loss_history,
            "initial_loss": self.initial_loss,
            "final_loss": self.final_loss,
            "seconds": self.seconds,
            "num_queries": self.num_queries,
            "num_pairs": self.num_pairs,
            "metadata": self.reranker.metadata,
        }


def train_student(
    labels: Sequence[LabelRecord] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None,
    base_model: str | None = None,
    loss: str = "ranknet",
    epochs: float = 2.0,
    batch_size: int = 4,
    lr: float = 2e-5,
    seed: int = 0,
    *,
    max_length: int = 256,
    temperature: float = 1.0,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    device: str = "auto",
    report_loss: bool = True,
    show_progress: bool | None = None,
) -> StudentTrainResult:
    """Train a cross-encoder student on MoI labels with ``CrossEncoderTrainer``.

    Parameters
    ----------
    labels
        Label records or a label file (:func:`ragkit.training.labels.read_labels`).
    out_dir
        Where the trained student is saved (atomically); ``None`` keeps it in memory only.
    base_model
        Encoder to start from (``None``: embedded all-MiniLM-L6-v2).
    loss
        ``"ranknet"`` (pairwise, default), ``"listnet"`` or ``"lambdaloss"`` (listwise);
        see the module docstring for the formulas.
    epochs, batch_size, lr, seed
        Passes over the labels, questions per optimisation step (each brings all its
        passages), AdamW learning rate, seed of the head initialisation and data order.
    max_length
        Token limit of a (query, passage) pair.
    temperature
        Target temperature ``T`` (z-scored utilities divided by ``T``; matters for ListNet).
    warmup_ratio, weight_decay
        Linear warm-up fraction and AdamW weight decay.
    device
        ``"auto"``, ``"cpu"``, ``"cuda"``; multi-GPU through ``accelerate launch``.
    report_loss
        Also measure the mean training loss before and after training (one extra eval pass each).

    Returns
    -------
    StudentTrainResult
    """
    from datasets import Dataset
    from transformers import PrinterCallback
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments

    from ragkit.models import resolve_device

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose one of {LOSSES}")
    if epochs <= 0:
        raise ValueError(f"epochs must be > 0, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    labs = _as_labels(labels)
    dev = resolve_device(device)
    student = DistilledReranker.from_base(base_model, device=dev, max_length=max_length, seed=seed)
    initial = ranking_loss(student, labs, loss, temperature) if report_loss else None

    rows = _training_rows(labs, temperature)
    dataset = Dataset.from_dict(rows)
    loss_fn = _make_loss(loss, student.model)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragkit-distill-") as tmp:
        args = CrossEncoderTrainingArguments(
            output_dir=tmp,
            num_train_epochs=epochs,
            per_device_train_batch_size=batch_size,
            learning_rate=lr,
            warmup_steps=warmup_ratio,
            weight_decay=weight_decay,
            seed=seed,
            data_seed=seed,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=not progress_enabled(show_progress),
            use_cpu=dev == "cpu",
            dataloader_num_workers=0,
        )
        trainer = CrossEncoderTrainer(model=student.model, args=args, train_dataset=dataset, loss=loss_fn)
        trainer.remove_callback(PrinterCallback)  # library code logs, never prints
        trainer.train()
        history = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    seconds = time.perf_counter() - t0
    student.model.eval()
    final = ranking_loss(student, labs, loss, temperature) if report_loss else None
    student.metadata.update(
        {
            "loss": loss,
            "epochs": epochs,
            "batch_size": batch_size,
            "lr": lr,
            "temperature": temperature,
            "num_queries": len(labs),
            "label_sources": sorted({lab.source for lab in labs if lab.source}),
            "label_generators": sorted({lab.generator for lab in labs if lab.generator}),
            "train_seconds": seconds,
            "initial_loss": initial,
            "final_loss": final,
        }
    )
    if out_dir is not None:
        student.save(out_dir)
    logger.info("trained student on %d queries in %.1f s (loss %s -> %s)", len(labs), seconds, initial, final)
    return StudentTrainResult(
        reranker=student,
        out_dir=None if out_dir is None else str(out_dir),
        loss_history=history,
        initial_loss=initial,
        final_loss=final,
        seconds=seconds,
        num_queries=len(labs),
        num_pairs=sum(len(lab.passage_ids) for lab in labs),
    )
