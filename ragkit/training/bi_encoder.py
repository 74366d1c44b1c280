"""Bi-encoder student: the dense retriever's own embedder fine-tuned on MoI utilities.

The student starts as the embedder the dense retriever already uses (default: the embedded
all-MiniLM-L6-v2), so before training it ranks a question's candidates exactly as dense retrieval
does; training with sentence-transformers' ``SentenceTransformerTrainer`` adds what the labels
teach, with two losses on two datasets built from the label file (one optimiser, batches
alternating between them):

* in-batch negatives (``MultipleNegativesRankingLoss``; Henderson et al., 2017, arXiv 1705.00652):
  ``(q, p⁺)`` rows with ``p⁺`` the question's top-utility passage; for a batch of ``B`` rows,
  ``L = −mean_b log softmax_j(λ · cos(q_b, p⁺_j))_b`` (``λ = 20``);
* a distillation loss on the utilities (``MarginMSELoss``; Hofstätter et al., 2020, arXiv
  2010.02666): for each question and each other candidate ``p⁻``, ``(q, p⁺, p⁻)`` with target
  ``m = c · (y⁺ − y⁻)``, ``y`` the z-scored utilities (:func:`ragkit.training.distill.label_targets`)
  and ``c = margin_scale`` (default 0.1, so that margins fit the cosine range ``[−2, 2]``):
  ``L = mean (cos(q, p⁺) − cos(q, p⁻) − m)²``.

Questions whose utilities are all equal teach nothing and are skipped. The saved folder is a plain
sentence-transformers model (``SentenceTransformer(path)`` loads it; ``ragkit index --embedder
PATH`` indexes with it) plus ``ragkit_distill.json`` with the training metadata; ``student:PATH``
loads it as a reranker (:class:`ragkit.debias.bi_encoder.BiEncoderReranker`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.debias.bi_encoder import BI_META_FORMAT
from ragkit.debias.cross_encoder import pair_text
from ragkit.io import atomic_dir, check_writable_dir, progress_enabled
from ragkit.training.distill import CHECKPOINT_EVERY, _as_labels, label_targets, student_run, student_settings
from ragkit.training.labels import LabelRecord

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

__all__ = ["BiEncoderStudent", "BiEncoderTrainResult", "train_bi_encoder"]



@dataclass
class BiEncoderStudent:
    """A fine-tuned sentence-transformers embedder and its training metadata."""

    model: SentenceTransformer
    metadata: dict[str, Any] = field(default_factory=dict)

    def scores(self, questions: Sequence[str], passages: Sequence[Sequence[Any]]) -> list[list[float]]:
        """``cos(q, p)`` of each question's candidates (one ``encode`` for all questions, one for all passages)."""
        q = self.model.encode(list(questions), normalize_embeddings=True, convert_to_numpy=True,
                              show_progress_bar=False)
        flat = [pair_text(p) for ps in passages for p in ps]
        d = self.model.encode(flat, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
        out, start = [], 0
        for i, ps in enumerate(passages):
            out.append((d[start : start + len(ps)] @ q[i]).astype(float).tolist())
            start += len(ps)
        return out

    def score_fn(self) -> Any:
        """:meth:`scores` as the ``score_fn`` of :func:`ragkit.training.distill.compare_with_first_stage`."""
        return self.scores

    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """Save atomically as a sentence-transformers folder plus ``ragkit_distill.json``."""
        from ragkit.debias.student import META_FILE

        out = Path(path)
        with atomic_dir(out, kind="reranker", overwrite=overwrite) as tmp:
            self.model.save(str(tmp), safe_serialization=True)
            (tmp / META_FILE).write_text(json.dumps({"format": BI_META_FORMAT, "metadata": self.metadata}, indent=2,
                                                    ensure_ascii=False, default=str), encoding="utf-8")
            (tmp / "README.md").write_text(bi_encoder_card(self.metadata, out.name), encoding="utf-8")
        logger.info("saved bi-encoder student to %s", out)
        return out


@dataclass
class BiEncoderTrainResult:
    """What :func:`train_bi_encoder` produced (the fields :class:`~ragkit.training.distill.StudentTrainResult` has)."""

    reranker: BiEncoderStudent
    out_dir: str | None
    loss_history: list[float] = field(default_factory=list)
    initial_loss: float | None = None
    final_loss: float | None = None
    seconds: float = 0.0
    num_queries: int = 0
    num_pairs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": self.out_dir, "loss_history": self.loss_history, "initial_loss": self.initial_loss,
                "final_loss": self.final_loss, "seconds": self.seconds, "num_queries": self.num_queries,
                "num_pairs": self.num_pairs, "metadata": self.reranker.metadata}


def _datasets(labels: Sequence[LabelRecord], temperature: float, margin_scale: float) -> tuple[dict, dict]:
    mnrl: dict[str, list[Any]] = {"anchor": [], "positive": []}
    margin: dict[str, list[Any]] = {"query": [], "positive": [], "negative": [], "label": []}
    for lab in labels:
        y = label_targets(lab.u, temperature)
        if not any(y):
            continue
        texts = [pair_text(p) for p in lab.passages()]
        top = int(np.argmax(y))
        mnrl["anchor"].append(lab.question)
        mnrl["positive"].append(texts[top])
        for j, t in enumerate(texts):
            if j != top:
                margin["query"].append(lab.question)
                margin["positive"].append(texts[top])
                margin["negative"].append(t)
                margin["label"].append(float(margin_scale * (y[top] - y[j])))
    return mnrl, margin


def train_bi_encoder(
    labels: Sequence[LabelRecord] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None,
    base_model: str | None = None,
    loss: str = "margin_mse",
    epochs: float = 3.0,
    batch_size: int = 16,
    lr: float = 2e-5,
    seed: int = 0,
    *,
    overwrite: bool = False,
    max_length: int = 256,
    temperature: float = 1.0,
    margin_scale: float = 0.1,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    device: str = "auto",
    show_progress: bool | None = None,
    bf16: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> BiEncoderTrainResult:
    """Fine-tune the dense retriever's embedder on MoI labels (module docstring's two losses).

    Parameters
    ----------
    labels, out_dir, overwrite
        Label records or file; folder of the saved student (``None``: in memory only).
    base_model
        The dense retriever's embedder (``None``: the embedded all-MiniLM-L6-v2).
    loss
        ``"margin_mse"`` (in-batch negatives + MarginMSE, default) or ``"mnrl"`` (in-batch negatives only).
    epochs, batch_size, lr, seed, warmup_ratio, weight_decay, device
        Trainer settings (``batch_size`` rows per step; in-batch negatives come from the same batch).
    max_length
        Token limit of a question or passage.
    temperature, margin_scale
        Target temperature of the z-scored utilities; ``c`` of the MarginMSE targets.
    bf16, checkpoint_dir, checkpoint_every
        Mixed precision (bfloat16 autocast, fp32 master weights) and resumable checkpoints, as in
        :func:`ragkit.training.distill.train_student`.
    """
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.util import pairwise_cos_sim
    from transformers import PrinterCallback

    from ragkit.models import resolve_device, resolve_embedder_path

    if loss not in ("margin_mse", "mnrl"):
        raise ValueError(f"the bi-encoder student trains with 'margin_mse' or 'mnrl', not {loss!r}")
    if epochs <= 0 or batch_size < 2 or lr <= 0:
        raise ValueError(f"epochs ({epochs}) and lr ({lr}) must be > 0 and batch_size ({batch_size}) >= 2 "
                         "(in-batch negatives need two rows)")
    if out_dir is not None:
        check_writable_dir(out_dir, "reranker", overwrite)
    labs = _as_labels(labels)
    mnrl_rows, margin_rows = _datasets(labs, temperature, margin_scale)
    if not mnrl_rows["anchor"]:
        raise ValueError("every labelled question has equal utilities for all its passages; nothing to learn")
    dev = resolve_device(device)
    path = resolve_embedder_path(base_model)
    import torch

    torch.manual_seed(seed)
    model = SentenceTransformer(path, device=dev)
    model.max_seq_length = max_length
    train = {"mnrl": Dataset.from_dict(mnrl_rows)}
    loss_fns: dict[str, Any] = {"mnrl": losses.MultipleNegativesRankingLoss(model)}
    if loss == "margin_mse" and margin_rows["query"]:
        train["margin"] = Dataset.from_dict(margin_rows)
        loss_fns["margin"] = losses.MarginMSELoss(model, similarity_fct=pairwise_cos_sim)
    settings = student_settings("bi-encoder", labs, base_model=base_model, loss=loss, epochs=epochs,
                                batch_size=batch_size, lr=lr, seed=seed, max_length=max_length,
                                temperature=temperature, margin_scale=margin_scale, warmup_ratio=warmup_ratio,
                                weight_decay=weight_decay, bf16=bf16)
    with student_run(checkpoint_dir, settings, "ragkit-bi-encoder-") as run:
        t0 = time.perf_counter()
        before = float(run.before.get("seconds", 0.0))
        args = SentenceTransformerTrainingArguments(
            **run.trainer_args(checkpoint_every), num_train_epochs=epochs, per_device_train_batch_size=batch_size,
            learning_rate=lr, warmup_steps=warmup_ratio, weight_decay=weight_decay, seed=seed, data_seed=seed,
            logging_steps=1, report_to="none", disable_tqdm=not progress_enabled(show_progress),
            use_cpu=dev == "cpu", dataloader_num_workers=0, bf16=bf16)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss_fns)
        trainer.remove_callback(PrinterCallback)
        run.add_callback(trainer, settings, lambda: {"seconds": before + time.perf_counter() - t0})
        trainer.train(resume_from_checkpoint=run.checkpoint)
        history = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    seconds = before + time.perf_counter() - t0
    model.eval()
    student = BiEncoderStudent(model, {
        "student": "bi-encoder", "base_model": base_model or "all-MiniLM-L6-v2", "base_path": path,
        "loss": loss, "epochs": epochs, "batch_size": batch_size, "lr": lr, "temperature": temperature,
        "margin_scale": margin_scale, "max_length": max_length, "seed": seed, "num_queries": len(labs),
        "label_sources": sorted({lab.source for lab in labs if lab.source}),
        "label_generators": sorted({lab.generator for lab in labs if lab.generator}),
        "train_seconds": seconds, "bf16": bf16, "resumed_from_step": run.step})
    if out_dir is not None:
        student.save(out_dir, overwrite=overwrite)
    run.finish(saved=out_dir is not None)
    return BiEncoderTrainResult(reranker=student, out_dir=None if out_dir is None else str(out_dir),
                                loss_history=history, initial_loss=history[0] if history else None,
                                final_loss=history[-1] if history else None, seconds=seconds,
                                num_queries=len(labs), num_pairs=len(mnrl_rows["anchor"]) + len(margin_rows["query"]))


def bi_encoder_card(metadata: dict[str, Any], name: str) -> str:
    """The bi-encoder student's model card: base embedder, labels, training, and the first-stage comparison."""
    from ragkit.debias.student import _comparison_lines

    m = metadata
    rows = [(k, m.get(k)) for k in ("base_model", "loss", "epochs", "batch_size", "lr", "margin_scale", "num_queries",
                                    "label_generators", "label_sources", "train_seconds")]
    return "\n".join([
        "---", "library_name: sentence-transformers", "tags:", "- ragkit", "- bi-encoder", "- distillation",
        "- mixture-of-intervention", "---", "", f"# {name}", "",
        "The dense retriever's embedder fine-tuned on Mixture-of-Intervention utilities (Lee et al., NAACL Findings "
        "2025, arXiv 2412.10684) with in-batch negatives and MarginMSE; ranks by cosine similarity.", "",
        "| setting | value |", "|---|---|", *[f"| {k} | {v if v not in (None, '') else '-'} |" for k, v in rows], "",
        *_comparison_lines(m.get("comparison")),
        "## Use", "", "```python", "from sentence_transformers import SentenceTransformer", "",
        f'model = SentenceTransformer("{name}")', "```", "",
        f"As a ragkit reranker: `student:{name}` (`ragkit eval`, `ragkit rerank`, `ragkit serve`).", ""])
