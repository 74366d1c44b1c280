"""``ragkit distill``'s student recipes, and the rule that a student never ranks below its first stage.

Three recipes (``student=``), each trained on MoI labels (:mod:`ragkit.training.labels`):

* ``"residual"`` (default): the first stage's order plus a zero-initialised cross-encoder
  correction (:class:`ragkit.debias.student.ResidualReranker`,
  :func:`ragkit.training.distill.train_residual_student`); before training it ranks exactly like
  the first stage;
* ``"cross-encoder"``: a cross-encoder with a fresh scoring head
  (:func:`ragkit.training.distill.train_student`);
* ``"bi-encoder"``: the dense retriever's embedder fine-tuned with in-batch negatives and
  MarginMSE (:func:`ragkit.training.bi_encoder.train_bi_encoder`).

Never below the first stage: :func:`distill` holds out a seeded fraction of the training
questions, ranks them with the trained student and with the first stage (the candidates' given
order), and refuses to save a student whose MRR@10 or recall@3 is lower
(:class:`StudentBelowFirstStage`, with the numbers) unless forced. A student trained on a few
hundred questions can end below the free retriever order it would replace; this check makes that
visible before the student is used, and the model card records it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragkit.io import check_writable_dir
from ragkit.training.distill import StudentTrainResult, _as_labels, train_residual_student, train_student
from ragkit.training.labels import LabelRecord

logger = logging.getLogger(__name__)

__all__ = ["STUDENTS", "StudentBelowFirstStage", "compare_with_first_stage", "distill", "split_labels"]

STUDENTS = ("residual", "cross-encoder", "bi-encoder")
"""Student recipes of :func:`distill` (``--student``); the residual one is the default."""


# ----------------------------------------------------------------------------- never below the first stage
class StudentBelowFirstStage(ValueError):
    """A trained student ranks held-out training questions below its first stage (``comparison`` holds the numbers)."""

    def __init__(self, message: str, comparison: dict[str, Any]) -> None:
        super().__init__(message)
        self.comparison = comparison


def split_labels(labels: Sequence[LabelRecord], holdout: float, seed: int = 0
                 ) -> tuple[list[LabelRecord], list[LabelRecord]]:
    """``(train, held_out)``: a seeded random ``holdout`` fraction of the questions held out.

    ``holdout = 0`` holds nothing out. Otherwise at least one question is held out and one kept.
    """
    if not 0.0 <= holdout < 1.0:
        raise ValueError(f"holdout must be in [0, 1), got {holdout}")
    labs = list(labels)
    if holdout == 0.0:
        return labs, []
    if len(labs) < 2:
        raise ValueError(f"{len(labs)} labelled question(s) cannot be split into training and held-out questions; "
                         "label more, or pass --holdout 0 (no check against the first stage)")
    n_out = min(len(labs) - 1, max(1, int(round(holdout * len(labs)))))
    perm = np.random.default_rng(seed).permutation(len(labs))
    out = set(perm[:n_out].tolist())
    return [lab for i, lab in enumerate(labs) if i not in out], [lab for i, lab in enumerate(labs) if i in out]


def _relevant(lab: LabelRecord, relevance: str) -> tuple[set[str], str]:
    """The relevant passage ids of a held-out question and where they came from."""
    gold = set(lab.gold_ids) & set(lab.passage_ids)
    if relevance in ("auto", "gold") and gold:
        return gold, "gold"
    if relevance == "gold":
        return set(), "gold"
    u = np.asarray(lab.u)
    if float(u.std()) < 1e-12:
        return set(), "labels"
    return {pid for pid, x in zip(lab.passage_ids, u) if x >= u.max() - 1e-12}, "labels"


def compare_with_first_stage(
    score_fn: Any,
    held_out: Sequence[LabelRecord],
    *,
    relevance: str = "auto",
    metrics: Sequence[str] = ("mrr@10", "recall@3"),
    tolerance: float = 0.0,
    first_stage_name: str = "retriever order",
) -> dict[str, Any]:
    """Held-out quality of a student against the first stage it reranks.

    ``score_fn(questions, passage_lists)`` returns one score list per question (higher first); the
    first stage is each question's given (retriever) order. Relevant passages: the record's gold
    ids (``relevance="auto"`` or ``"gold"``; NQ-open ``hasanswer``, HotpotQA supporting titles),
    else (``"auto"``, ``"labels"``) the passages of highest utility ``u``; a question with none is
    not judged. ``passed`` is ``True`` when the student is not below the first stage by more than
    ``tolerance`` on any metric.
    """
    from ragkit.eval.metrics import ir_metrics

    if relevance not in ("auto", "gold", "labels"):
        raise ValueError(f"relevance must be 'auto', 'gold' or 'labels', got {relevance!r}")
    qrels: dict[str, set[str]] = {}
    sources: set[str] = set()
    for lab in held_out:
        rel, src = _relevant(lab, relevance)
        if rel:
            qrels[lab.qid] = rel
            sources.add(src)
    judged = [lab for lab in held_out if lab.qid in qrels]
    if not judged:
        raise ValueError(f"none of the {len(held_out)} held-out questions has a relevant passage ({relevance} "
                         "relevance); label more questions, or pass --holdout 0 to skip the check")
    scores = score_fn([lab.question for lab in judged], [lab.passages() for lab in judged])
    student_run = {lab.qid: dict(zip(lab.passage_ids, map(float, s))) for lab, s in zip(judged, scores)}
    first_run = {lab.qid: {pid: -float(i) for i, pid in enumerate(lab.passage_ids)} for lab in judged}
    a, b = ir_metrics(qrels, first_run, metrics), ir_metrics(qrels, student_run, metrics)
    below = [m for m in metrics if b[m] < a[m] - tolerance]
    return {"first_stage_name": first_stage_name, "num_queries": len(judged), "relevance": "+".join(sorted(sources)),
            "tolerance": tolerance, "first_stage": a, "student": b,
            "delta": {m: b[m] - a[m] for m in metrics}, "below": below, "passed": not below, "forced": False}


def _reranker_scores(reranker: Any) -> Any:
    def fn(questions: Sequence[str], passages: Sequence[Sequence[Any]]) -> list[list[float]]:
        out = []
        for ps, rl in zip(passages, reranker.rank_many(list(questions), [list(p) for p in passages])):
            by = {id(h.passage): h.score for h in rl}
            out.append([by.get(id(p), float("-inf")) for p in ps])
        return out
    return fn


def distill(
    labels: Sequence[LabelRecord] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None,
    student: str = "residual",
    *,
    holdout: float = 0.2,
    relevance: str = "auto",
    tolerance: float = 0.0,
    force: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    held_out: Sequence[LabelRecord] | str | os.PathLike[str] | None = None,
    **train_kwargs: Any,
) -> StudentTrainResult:
    """Train a student recipe, check it against its first stage on held-out train questions, save it.

    A seeded ``holdout`` fraction of the labelled questions is held out of training; the trained
    student ranks them and :func:`compare_with_first_stage` measures MRR@10 and recall@3 of the
    student and of the given (first-stage) order. A student below the first stage on either metric
    (by more than ``tolerance``) is not saved: :class:`StudentBelowFirstStage` says so with the
    numbers, unless ``force``. The comparison goes into the student's metadata and model card.

    Parameters
    ----------
    labels, out_dir
        Label records or file; the folder of the saved student (``None``: not saved).
    student
        ``"residual"`` (:func:`train_residual_student`), ``"cross-encoder"`` (:func:`train_student`)
        or ``"bi-encoder"`` (:func:`ragkit.training.bi_encoder.train_bi_encoder`).
    holdout
        Fraction of questions held out (``0``: no check; the card says so).
    held_out
        Held-out questions given explicitly (label records or file), e.g. the last questions of a
        file, which a study fixes in advance; all of ``labels`` then trains and ``holdout`` must be 0.
    relevance
        Relevant passages of the check: ``"auto"`` (gold ids where a record has them, else the
        top-utility passages), ``"gold"`` or ``"labels"``.
    tolerance, force
        How far below the first stage a student may fall; save a refused student anyway.
    **train_kwargs
        Passed to the recipe's trainer (``base_model``, ``loss``, ``epochs``, ``lr``, ...);
        ``checkpoint_dir`` makes training resumable, and the folder is removed once the student is
        saved or refused.
    """
    if student not in STUDENTS:
        raise ValueError(f"unknown student {student!r}; choose one of {', '.join(STUDENTS)}")
    if out_dir is not None:
        check_writable_dir(out_dir, "reranker", overwrite)
    labs = _as_labels(labels)
    if held_out is not None:
        if holdout:
            raise ValueError(f"pass either held_out questions or a holdout fraction ({holdout}), not both")
        train, held = labs, _as_labels(held_out)
        if {lab.qid for lab in train} & {lab.qid for lab in held}:
            raise ValueError("a held-out question is also a training question; the check needs unseen questions")
    else:
        train, held = split_labels(labs, holdout, seed)
    if student == "bi-encoder":
        from ragkit.training.bi_encoder import train_bi_encoder

        res = train_bi_encoder(train, None, seed=seed, **train_kwargs)
        score_fn = res.reranker.score_fn()
    else:
        trainer = train_residual_student if student == "residual" else train_student
        res = trainer(train, None, seed=seed, **train_kwargs)
        res.reranker.metadata.setdefault("student", student)
        score_fn = _reranker_scores(res.reranker)
    checkpoints = train_kwargs.get("checkpoint_dir")

    def done_with_checkpoints() -> None:  # the run's outcome is final: saved, or refused
        if checkpoints is not None:
            shutil.rmtree(checkpoints, ignore_errors=True)

    comparison: dict[str, Any] | None = None
    if held:
        comparison = compare_with_first_stage(score_fn, held, relevance=relevance, tolerance=tolerance)
        comparison["held_out_qids"] = [lab.qid for lab in held]
        if not comparison["passed"]:
            nums = "; ".join(f"{m}: student {comparison['student'][m]:.4f} vs first stage "
                             f"{comparison['first_stage'][m]:.4f}" for m in comparison["first_stage"])
            msg = (f"the trained {student} student ranks {comparison['num_queries']} held-out training questions "
                   f"below its first stage ({nums}; relevance: {comparison['relevance']}), so it was not saved; "
                   "label more questions, change the recipe (--student, --lr, --epochs), or pass --force to "
                   "save it anyway")
            if not force:
                done_with_checkpoints()
                raise StudentBelowFirstStage(msg, comparison)
            logger.warning("%s (saved because of --force)", msg)
            comparison["forced"] = True
    res.reranker.metadata["comparison"] = comparison
    res.reranker.metadata["holdout"] = holdout
    if out_dir is not None:
        res.reranker.save(out_dir, overwrite=overwrite)
        res.out_dir = str(out_dir)
    done_with_checkpoints()
    return res
