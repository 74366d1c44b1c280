"""Distil Mixture-of-Intervention into a one-pass cross-encoder reranker.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) needs ``M`` generator passes over the ``k`` passages per
question (``M = k + 1`` for the default leave-one-out design, ``M = k`` for the cyclic one). Its
``gold``-outcome utilities ``u`` on training questions (:mod:`ragkit.training.labels`) become the
targets of a student cross-encoder ``f(q, p)`` that scores each (question, passage) pair once;
the paper reports that a cheap reranker keeps about half of MoI's gain at a small fraction of
its cost.

Student: a sentence-transformers ``CrossEncoder`` (one logit per pair) initialised from an
encoder (default: the embedded all-MiniLM-L6-v2 weights; any sentence-transformers or Hugging
Face encoder/cross-encoder path or hub id), trained with ``CrossEncoderTrainer`` on, per query,
the targets ``y_i = (u_i - mean(u)) / (std(u) · T)`` (z-scored utilities, temperature ``T``):

* ``"ranknet"`` (pairwise; Burges et al., ICML 2005):
  ``L = mean_{(i,j): y_i > y_j} log2(1 + exp(-(f_i - f_j)))``;
* ``"listnet"`` (listwise; Cao et al., ICML 2007): ``L = CE(softmax(y), softmax(f))``;
* ``"lambdaloss"`` (Wang et al., CIKM 2018): RankNet pairs weighted by the NDCG-Loss2++ scheme.

The trained student is a :class:`ragkit.debias.student.DistilledReranker` (the inference side lives
in ``ragkit.debias`` so that evaluation and serving never import the trainers): at inference all
(query, passage) pairs of all queries go through one batched ``predict`` call, ``k`` encoder
passes per query and no generator pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.debias.cross_encoder import pair_text
from ragkit.debias.student import META_FILE, DistilledReranker
from ragkit.io import check_writable_dir, progress_enabled
from ragkit.training.labels import LabelRecord, read_labels

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
    "train_residual_student",
    "train_student",
]

LOSSES = ("ranknet", "listnet", "lambdaloss")


# ----------------------------------------------------------------------------- checkpoints
CHECKPOINT_EVERY = 20
"""Optimiser steps between two checkpoints of a student run with a ``checkpoint_dir`` (about 4 to 6
minutes of training on 2 CPU cores with the default batch sizes; seconds on a GPU)."""


def student_settings(recipe: str, labels: Sequence[LabelRecord], **settings: Any) -> dict[str, Any]:
    """What a student run's checkpoints must share to be resumed: the recipe, a digest of the labels
    (question ids, passage ids, utilities) and every training setting."""
    blob = json.dumps([[lab.qid, list(lab.passage_ids), [float(x) for x in lab.u]] for lab in labels])
    return {"recipe": recipe, "labels": hashlib.sha256(blob.encode("utf-8")).hexdigest(),
            "num_queries": len(labels), **{k: (str(v) if isinstance(v, os.PathLike) else v)
                                           for k, v in settings.items()}}


@dataclass
class _Run:
    """Where an HF-Trainer student run writes: a temporary folder, or a resumable checkpoint folder."""

    output_dir: str
    checkpoint: str | None
    before: dict[str, Any]
    resumable: bool
    step: int = 0

    def trainer_args(self, every: int) -> dict[str, Any]:
        if not self.resumable:
            return {"output_dir": self.output_dir, "save_strategy": "no"}
        return {"output_dir": self.output_dir, "save_strategy": "steps", "save_steps": every,
                "save_total_limit": 1}

    def add_callback(self, trainer: Any, settings: Mapping[str, Any], progress: Callable[[], dict[str, Any]]) -> None:
        from ragkit.training.checkpoint import SettingsCallback

        if self.resumable:
            trainer.add_callback(SettingsCallback(settings, progress=progress))

    def finish(self, saved: bool) -> None:
        """Remove the checkpoints once the trained student is saved; a student returned unsaved keeps
        them (its caller saves it, then removes the folder: :func:`ragkit.training.students.distill`)."""
        if self.resumable and saved:
            shutil.rmtree(self.output_dir, ignore_errors=True)


def resumable_run(checkpoint_dir: str | os.PathLike[str], settings: Mapping[str, Any]) -> _Run:
    """A student run folder of kind ``student-run`` that resumes from its latest checkpoint (refusing
    one of other settings); the caller removes it with :meth:`_Run.finish` after saving the student,
    so a kill in between loses nothing."""
    from ragkit.training.checkpoint import read_progress, start_or_resume

    state = start_or_resume(checkpoint_dir, "student-run", settings)
    return _Run(str(state.run_dir), state.checkpoint, read_progress(state.checkpoint), True, state.step)


@contextmanager
def student_run(checkpoint_dir: str | os.PathLike[str] | None, settings: Mapping[str, Any],
                prefix: str) -> Iterator[_Run]:
    """The output folder of a ``transformers.Trainer`` student run: a temporary folder without
    checkpoints (``None``), else :func:`resumable_run`'s."""
    if checkpoint_dir is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield _Run(tmp, None, {}, False)
        return
    yield resumable_run(checkpoint_dir, settings)


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
        rows["docs"].append([pair_text(p) for p in lab.passages()])
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
    loss: str = "listnet",
    epochs: float = 3.0,
    batch_size: int = 4,
    lr: float = 1e-4,
    seed: int = 0,
    *,
    overwrite: bool = False,
    max_length: int = 256,
    temperature: float = 1.0,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    device: str = "auto",
    report_loss: bool = True,
    show_progress: bool | None = None,
    bf16: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> StudentTrainResult:
    """Train a cross-encoder student on MoI labels with ``CrossEncoderTrainer``.

    Parameters
    ----------
    labels
        Label records or a label file (:func:`ragkit.training.labels.read_labels`).
    out_dir
        Where the trained student is saved (atomically); ``None`` keeps it in memory only. Checked
        before training: it may only be new, empty or a previous distilled reranker.
    overwrite
        Also replace another ragkit artifact or a file at ``out_dir`` (never a folder of other files).
    base_model
        Encoder to start from (``None``: embedded all-MiniLM-L6-v2).
    loss
        ``"listnet"`` (listwise, default), ``"ranknet"`` (pairwise) or ``"lambdaloss"``;
        see the module docstring for the formulas. The defaults (ListNet, lr 1e-4, 3 epochs) won
        on 50 held-out train questions of the reference generator's labels (held-out MRR@10 0.761
        against 0.604 for RankNet at lr 3e-5 and 0.540 at lr 1e-4; ``experiments/distill/distill_recipes.py``).
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
    bf16
        Mixed precision: forward and backward under bfloat16 autocast, fp32 master weights and
        optimiser. Faster on GPUs and on CPUs with AVX512-BF16 or AMX (``benchmarks/cpu_dtype.py``
        measures the generator's side); off by default, since CPUs without them run it slower.
    checkpoint_dir, checkpoint_every
        Make the run resumable: a checkpoint every ``checkpoint_every`` optimiser steps in
        ``checkpoint_dir``; started again with the same labels and settings, the run continues
        from the latest one (other settings are refused, naming each difference). The folder is
        removed once the student is saved to ``out_dir`` (with ``out_dir=None`` the caller removes
        it after saving the student). ``None``: no checkpoints.

    Returns
    -------
    StudentTrainResult
    """
    if out_dir is not None:
        check_writable_dir(out_dir, "reranker", overwrite)  # before any training
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from transformers import PrinterCallback

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
    settings = student_settings("cross-encoder", labs, base_model=base_model, loss=loss, epochs=epochs,
                                batch_size=batch_size, lr=lr, seed=seed, max_length=max_length,
                                temperature=temperature, warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                                bf16=bf16)
    student = DistilledReranker.from_base(base_model, device=dev, max_length=max_length, seed=seed)
    rows = _training_rows(labs, temperature)
    dataset = Dataset.from_dict(rows)
    loss_fn = _make_loss(loss, student.model)
    with student_run(checkpoint_dir, settings, "ragkit-distill-") as run:
        initial = run.before.get("initial_loss") if run.checkpoint else (
            ranking_loss(student, labs, loss, temperature) if report_loss else None)
        t0 = time.perf_counter()
        args = CrossEncoderTrainingArguments(
            **run.trainer_args(checkpoint_every),
            num_train_epochs=epochs,
            per_device_train_batch_size=batch_size,
            learning_rate=lr,
            warmup_steps=warmup_ratio,
            weight_decay=weight_decay,
            seed=seed,
            data_seed=seed,
            logging_steps=1,
            report_to="none",
            disable_tqdm=not progress_enabled(show_progress),
            use_cpu=dev == "cpu",
            dataloader_num_workers=0,
            bf16=bf16,
        )
        trainer = CrossEncoderTrainer(model=student.model, args=args, train_dataset=dataset, loss=loss_fn)
        trainer.remove_callback(PrinterCallback)  # library code logs, never prints
        before = float(run.before.get("seconds", 0.0))
        run.add_callback(trainer, settings, lambda: {"seconds": before + time.perf_counter() - t0,
                                                     "initial_loss": initial})
        trainer.train(resume_from_checkpoint=run.checkpoint)
        history = [float(h["loss"]) for h in trainer.state.log_history if "loss" in h]
    seconds = before + time.perf_counter() - t0
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
            "bf16": bf16,
            "initial_loss": initial,
            "final_loss": final,
            "resumed_from_step": run.step,
        }
    )
    if out_dir is not None:
        student.save(out_dir, overwrite=overwrite)
    run.finish(saved=out_dir is not None)
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


# ----------------------------------------------------------------------------- residual student
def _query_loss(name: str, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One query's loss on scores ``s`` and targets ``y`` (the module docstring's ListNet / RankNet)."""
    import math

    import torch

    if name == "listnet":
        return -(torch.softmax(y, 0) * torch.log_softmax(s, 0)).sum()
    diff_y = y[:, None] - y[None, :]
    pairs = diff_y > 0
    if not bool(pairs.any()):
        return s.sum() * 0.0
    diff_s = (s[:, None] - s[None, :])[pairs]
    return torch.nn.functional.softplus(-diff_s).mean() / math.log(2.0)


def train_residual_student(
    labels: Sequence[LabelRecord] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None,
    base_model: str | None = None,
    loss: str = "listnet",
    epochs: float = 3.0,
    batch_size: int = 4,
    lr: float = 1e-4,
    seed: int = 0,
    *,
    overwrite: bool = False,
    max_length: int = 256,
    temperature: float = 1.0,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    prior: str = "rank",
    prior_weight: float = 1.0,
    device: str = "auto",
    report_loss: bool = True,
    show_progress: bool | None = None,
    bf16: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY,
) -> StudentTrainResult:
    """Train a residual cross-encoder student ``s = w · z(retriever) + f(q, p)`` on MoI labels.

    :class:`~ragkit.debias.student.ResidualReranker` starts with ``f ≡ 0`` (zero scoring
    head), ranking exactly like the first stage; training fits ``f`` so that ``s`` (prior
    included) minimises ``loss`` against the per-query targets of :func:`label_targets`
    (``"listnet"`` or ``"ranknet"``, the module docstring's formulas), with AdamW, a linear warm-up
    over ``warmup_ratio`` of the steps and linear decay. The prior ``z`` of a label record is that
    of its given order (``prior="rank"``), or its ``metadata["retriever_scores"]`` with
    ``prior="score"`` (the given order when a record has none).

    Parameters are those of :func:`train_student` (``bf16``: the encoder's forward under bfloat16
    autocast, the loss and the weights in fp32; ``checkpoint_dir``: resumable, with checkpoints of
    :func:`ragkit.training.checkpoint.save_loop_checkpoint` that hold the data order and RNG
    states too, so a resumed run trains as an uninterrupted one), plus ``prior`` and
    ``prior_weight`` (``r`` and ``w`` of :mod:`ragkit.debias.student`). Returns a
    :class:`StudentTrainResult` whose ``reranker`` is a ``ResidualReranker``.
    """
    import torch
    from transformers import get_linear_schedule_with_warmup

    from ragkit.debias.student import ResidualReranker
    from ragkit.models import resolve_device

    if out_dir is not None:
        check_writable_dir(out_dir, "reranker", overwrite)
    if loss not in ("listnet", "ranknet"):
        raise ValueError(f"the residual student trains with 'listnet' or 'ranknet', not {loss!r}")
    if epochs <= 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"epochs ({epochs}), batch_size ({batch_size}) and lr ({lr}) must be positive")
    labs = _as_labels(labels)
    dev = resolve_device(device)
    settings = student_settings("residual", labs, base_model=base_model, loss=loss, epochs=epochs,
                                batch_size=batch_size, lr=lr, seed=seed, max_length=max_length,
                                temperature=temperature, warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                                prior=prior, prior_weight=prior_weight, bf16=bf16)
    from ragkit.training.checkpoint import load_loop_checkpoint, save_loop_checkpoint

    run = resumable_run(checkpoint_dir, settings) if checkpoint_dir is not None else None
    student = ResidualReranker.from_base(base_model, device=dev, max_length=max_length, seed=seed,
                                         prior=prior, prior_weight=prior_weight)
    ce = student.model
    hf, tok = ce.model, ce.tokenizer
    rows = _training_rows(labs, temperature)
    priors = [torch.tensor(student.prior(len(lab.passage_ids), _label_scores(lab)), dtype=torch.float32)
              for lab in labs]
    targets = [torch.tensor(t, dtype=torch.float32) for t in rows["labels"]]

    def batch_loss(idx: Sequence[int]) -> torch.Tensor:
        qs = [rows["query"][i] for i in idx for _ in rows["docs"][i]]
        ds = [d for i in idx for d in rows["docs"][i]]
        enc = tok(qs, ds, padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(hf.device)
        with torch.autocast(device_type=hf.device.type, dtype=torch.bfloat16, enabled=bf16):
            f = hf(**enc).logits
        f = f.view(-1).float().cpu()
        total, start = f.new_zeros(()), 0
        for i in idx:
            n = len(rows["docs"][i])
            total = total + _query_loss(loss, priors[i] + f[start : start + n], targets[i])
            start += n
        return total / len(idx)

    def mean_loss() -> float:
        hf.eval()
        with torch.no_grad():
            vals = [float(batch_loss(list(range(i, min(i + 8, len(labs)))))) * min(8, len(labs) - i)
                    for i in range(0, len(labs), 8)]
        return sum(vals) / len(labs)

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    steps_per_epoch = -(-len(labs) // batch_size)
    total_steps = max(1, int(round(epochs * steps_per_epoch)))
    opt = torch.optim.AdamW(hf.parameters(), lr=lr, weight_decay=weight_decay)
    warmup = int(warmup_ratio * total_steps)
    sched = get_linear_schedule_with_warmup(opt, warmup, total_steps)  # sets each group's initial_lr
    history: list[float] = []
    order: list[int] = []
    start, before = 0, 0.0
    if run is not None and run.checkpoint is not None:
        state = load_loop_checkpoint(run.checkpoint, hf, opt)
        start, before, initial = run.step, float(state["seconds"]), state["initial_loss"]
        history, order = [float(x) for x in state["history"]], [int(i) for i in state["order"]]
        rng.bit_generator.state = state["rng"]
        sched = get_linear_schedule_with_warmup(opt, warmup, total_steps, last_epoch=start - 1)
    else:
        initial = mean_loss() if report_loss else None
    t0 = time.perf_counter()
    hf.train()
    from ragkit.io import progress

    step_iter = progress(range(start, total_steps), show=show_progress, desc="residual student", unit="step")
    for step in step_iter:
        if len(order) < batch_size:
            order += rng.permutation(len(labs)).tolist()
        idx, order = order[:batch_size], order[batch_size:]
        value = batch_loss(idx)
        opt.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        sched.step()
        history.append(float(value.detach()))
        if run is not None and (step + 1) % checkpoint_every == 0 and step + 1 < total_steps:
            save_loop_checkpoint(run.output_dir, step + 1, hf, opt, settings=settings, state={
                "order": order, "rng": rng.bit_generator.state, "history": history, "initial_loss": initial,
                "seconds": before + time.perf_counter() - t0})
    hf.eval()
    seconds = before + time.perf_counter() - t0
    final = mean_loss() if report_loss else None
    student.metadata.update({
        "loss": loss, "epochs": epochs, "batch_size": batch_size, "lr": lr, "temperature": temperature,
        "num_queries": len(labs), "label_sources": sorted({lab.source for lab in labs if lab.source}),
        "label_generators": sorted({lab.generator for lab in labs if lab.generator}),
        "label_outcomes": sorted({lab.outcome for lab in labs if lab.outcome}),
        "train_seconds": seconds, "bf16": bf16, "initial_loss": initial, "final_loss": final,
        "steps": total_steps, "resumed_from_step": start,
    })
    if out_dir is not None:
        student.save(out_dir, overwrite=overwrite)
    if run is not None:
        run.finish(saved=out_dir is not None)
    logger.info("trained residual student on %d queries in %.1f s (loss %s -> %s)", len(labs), seconds,
                initial, final)
    return StudentTrainResult(reranker=student, out_dir=None if out_dir is None else str(out_dir),
                              loss_history=history, initial_loss=initial, final_loss=final, seconds=seconds,
                              num_queries=len(labs), num_pairs=sum(len(lab.passage_ids) for lab in labs))


def _label_scores(lab: LabelRecord) -> list[float] | None:
    """The retriever scores a label record carries (``metadata["retriever_scores"]``), if any."""
    s = lab.metadata.get("retriever_scores") if lab.metadata else None
    if isinstance(s, list) and len(s) == len(lab.passage_ids):
        return [float(x) for x in s]
    return None
