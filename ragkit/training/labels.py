"""Distillation labels: Mixture-of-Intervention utilities on training questions, as JSONL.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) runs the generator on ``M`` orderings of a question's ``k``
passages and fits per-passage utilities ``u`` from the observation model

.. math::

    E[o(\\pi)] = b + \\sum_j a_j \\, u_{\\pi(j)},

where ``a`` is the generator's position-bias profile. With the ``gold`` outcome
(``o(π)`` = mean log-prob of the reference answer under intervention ``π``, teacher-forced) the
utilities are an oracle ranking signal. The default design is leave-one-out (``loo``: the full
prompt and the ``k`` prompts that each leave one passage out; ``u_p = o(full) − o(full \\ p)``),
which ranked the gold paragraphs of 10 HotpotQA train questions at MRR@10 0.765 against 0.420
for the ``cyclic`` design (the ``k`` rotations, the former default, still available), 0.421 for
``prior`` and 0.485 for the given order (SmolLM2-135M, k = 10;
``experiments/moi_lab/results/moi_designs_train-cpu.json``, ``moi_budget_train-cpu.json``).
:func:`generate_labels` stores them, one JSON object a line, so that a cheap one-pass reranker
can be trained on them (:mod:`ragkit.training.distill`).

A line of a label file (format ``ragkit-distill-labels/1``)::

    {"format": "ragkit-distill-labels/1", "qid": "5a8b57f2...", "question": "...",
     "passage_ids": ["A", "B", ...], "titles": ["A", "B", ...], "texts": ["...", ...],
     "u": [0.31, -0.12, ...],            # one utility per passage, aligned with passage_ids
     "ranking": ["A", "C", ...],         # passage ids by decreasing u (ties: given order)
     "answers": ["..."], "gold_ids": ["A", "C"], "source": "hotpotqa", "generator": "...",
     "design": "loo", "outcome": "gold", "generator_calls": 11}

Label generation is resumable: question ids already in the file are skipped and new labels are
appended (fsync'd) after each batch of questions, so a killed run loses at most one batch. Each
label's ``metadata["cost"]`` records what it cost (its batch's generator forwards, prefilled
tokens and seconds, shared equally by the batch's questions), and ``metadata["fallback"]`` whether
MoI's separation test would have kept the input order at inference.

The ``masked`` design labels with the estimator the ``moi_masked`` reranker runs at inference
(:mod:`ragkit.debias.masked_loo`: one prefill of the passage block, each passage masked out in
turn, the ``question`` outcome): a student or an attention probe then learns the utilities a user
can compute without reference answers, at about UPR's cost instead of exact leave-one-out's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.generation.base import metered
from ragkit.io import append_jsonl, atomic_write_text, progress, read_appended_jsonl
from ragkit.types import Passage, QARecord

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.generation import Generator

logger = logging.getLogger(__name__)

__all__ = [
    "LABEL_DESIGNS",
    "LABEL_FORMAT",
    "LabelRecord",
    "LabelStats",
    "generate_labels",
    "read_labels",
    "write_labels",
    "labels_from_results",
    "label_moi",
    "label_references",
]

LABEL_FORMAT = "ragkit-distill-labels/1"
LABEL_DESIGNS = ("loo", "ablate", "mixed", "cyclic", "prior", "random", "masked")
"""MoI designs :func:`generate_labels` takes; ``masked`` is the ``moi_masked`` reranker's estimator."""
_REQUIRED = ("qid", "question", "passage_ids", "texts", "u")


@dataclass(frozen=True)
class LabelRecord:
    """MoI utilities of one training question's passages.

    Parameters
    ----------
    qid
        Question id (unique inside a label file).
    question
        Question text.
    passage_ids, titles, texts
        The candidate passages in the given (retriever) order.
    u
        One utility per passage (aligned with ``passage_ids``); larger is more useful.
    ranking
        Passage ids by decreasing ``u``, ties broken by the given order. Derived from ``u``
        when omitted.
    answers
        Reference answers the ``gold`` outcome scored.
    gold_ids
        Gold (supporting) passage ids when the dataset has them (for evaluation only).
    source, generator, design, outcome
        Provenance: dataset name, generator name, MoI design and outcome.
    generator_calls
        Generator forward sequences MoI spent on this question.
    """

    qid: str
    question: str
    passage_ids: tuple[str, ...]
    texts: tuple[str, ...]
    u: tuple[float, ...]
    titles: tuple[str, ...] = ()
    ranking: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    gold_ids: tuple[str, ...] = ()
    source: str = ""
    generator: str = ""
    design: str = "cyclic"
    outcome: str = "gold"
    generator_calls: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("passage_ids", "texts", "u", "titles", "ranking", "answers", "gold_ids"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(v))
        if any(isinstance(x, bool) for x in self.u):
            raise ValueError(f"label record {self.qid!r}: 'u' holds a boolean; utilities are numbers")
        object.__setattr__(self, "u", tuple(float(x) for x in self.u))
        if not self.titles:
            object.__setattr__(self, "titles", ("",) * len(self.passage_ids))
        if not self.ranking:
            object.__setattr__(self, "ranking", ranking_from_utilities(self.passage_ids, self.u))
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        n = len(self.passage_ids)
        if not str(self.qid):
            raise ValueError("label record has an empty 'qid'; give every question an id")
        if not self.question.strip():
            raise ValueError(f"label record {self.qid!r} has an empty 'question'")
        if n < 2:
            raise ValueError(
                f"label record {self.qid!r} has {n} passage(s); a ranking label needs at least 2"
            )
        for name in ("texts", "u", "titles"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"label record {self.qid!r}: {len(getattr(self, name))} {name} but {n} "
                    f"passage_ids; every per-passage list must have one entry per passage"
                )
        if len(set(self.passage_ids)) != n:
            raise ValueError(f"label record {self.qid!r} has duplicate passage ids; make ids unique")
        if not all(math.isfinite(x) for x in self.u):
            raise ValueError(
                f"label record {self.qid!r} has a non-finite utility in 'u' ({list(self.u)}); "
                "regenerate that question's labels"
            )
        if sorted(self.ranking) != sorted(self.passage_ids):
            raise ValueError(
                f"label record {self.qid!r}: 'ranking' is not a permutation of 'passage_ids'; "
                "drop 'ranking' to have it derived from 'u'"
            )

    # ------------------------------------------------------------------ conversions
    def passages(self) -> list[Passage]:
        """The candidate passages (given order) as :class:`~ragkit.types.Passage` objects."""
        return [Passage(id=i, text=t, title=ti) for i, t, ti in zip(self.passage_ids, self.texts, self.titles)]

    def to_dict(self) -> dict[str, Any]:
        """One JSONL line of the label format."""
        out: dict[str, Any] = {
            "format": LABEL_FORMAT,
            "qid": self.qid,
            "question": self.question,
            "passage_ids": list(self.passage_ids),
            "titles": list(self.titles),
            "texts": list(self.texts),
            "u": [float(x) for x in self.u],
            "ranking": list(self.ranking),
            "answers": list(self.answers),
            "gold_ids": list(self.gold_ids),
            "source": self.source,
            "generator": self.generator,
            "design": self.design,
            "outcome": self.outcome,
            "generator_calls": int(self.generator_calls),
        }
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "label record") -> LabelRecord:
        """Parse one label line; ``where`` (e.g. ``"file.jsonl:3"``) prefixes error messages."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(d).__name__}")
        fmt = d.get("format", LABEL_FORMAT)
        if fmt != LABEL_FORMAT:
            raise ValueError(f"{where}: unknown label format {fmt!r}; this ragkit reads {LABEL_FORMAT!r}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(
                f"{where}: missing key(s) {missing}; a label line needs {list(_REQUIRED)} "
                "(write it with ragkit.training.labels.write_labels or `ragkit distill labels`)"
            )
        for k in ("passage_ids", "texts", "u", "titles", "ranking", "answers", "gold_ids"):
            if k in d and (d[k] is not None or k in _REQUIRED) and not isinstance(d[k], list):
                raise ValueError(f"{where}: '{k}' must be a JSON list, got {type(d[k]).__name__}")

        def text(key: str, v: Any, ids: bool = False, default: str | None = None) -> str:
            # a JSON null or a boolean is no text: str() would turn it into "None" / "True"
            if v is None and default is not None:
                return default
            if isinstance(v, str) or (ids and isinstance(v, int) and not isinstance(v, bool)):
                return str(v)
            raise ValueError(f"{where}: {key} is {json.dumps(v)[:80]}, not a string; write every "
                             f"{'id' if ids else 'text'} as a JSON string")

        def texts(key: str, ids: bool = False, default: str | None = None) -> tuple[str, ...]:
            return tuple(text(f"'{key}'[{i}]", v, ids, default) for i, v in enumerate(d.get(key) or ()))

        u = []
        for i, x in enumerate(d["u"]):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise ValueError(f"{where}: 'u' must be a list of numbers; 'u'[{i}] is {json.dumps(x)[:80]}")
            u.append(float(x))
        if not isinstance(d.get("metadata") or {}, dict):
            raise ValueError(f"{where}: 'metadata' must be a JSON object, got {type(d['metadata']).__name__}")
        calls = d.get("generator_calls") or 0
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ValueError(f"{where}: 'generator_calls' is {json.dumps(calls)}, not a count")
        fields = dict(
            qid=text("'qid'", d["qid"], ids=True),
            question=text("'question'", d["question"]),
            passage_ids=texts("passage_ids", ids=True),
            texts=texts("texts"),
            u=tuple(u),
            titles=texts("titles", default=""),
            ranking=texts("ranking", ids=True),
            answers=texts("answers"),
            gold_ids=texts("gold_ids", ids=True),
            source=text("'source'", d.get("source"), default=""),
            generator=text("'generator'", d.get("generator"), default=""),
            design=text("'design'", d.get("design"), default="cyclic"),
            outcome=text("'outcome'", d.get("outcome"), default="gold"),
            generator_calls=calls,
            metadata=dict(d.get("metadata") or {}),
        )
        try:
            return cls(**fields)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e


def ranking_from_utilities(passage_ids: Sequence[str], u: Sequence[float]) -> tuple[str, ...]:
    """Passage ids sorted by decreasing utility; ties keep the given order."""
    order = sorted(range(len(passage_ids)), key=lambda i: (-float(u[i]), i))
    return tuple(passage_ids[i] for i in order)


# ----------------------------------------------------------------------------- file I/O
def _parse_rows(path: Path, rows: Iterable[tuple[int, Any]]) -> list[LabelRecord]:
    """Label records from ``(line_number, row)`` pairs; errors name ``path:line``."""
    out: list[LabelRecord] = []
    seen: dict[str, int] = {}
    for i, d in rows:
        where = f"{path}:{i}"
        rec = LabelRecord.from_dict(d, where)
        if rec.qid in seen:
            raise ValueError(f"{where}: duplicate qid {rec.qid!r} (first at line {seen[rec.qid]}); remove one")
        seen[rec.qid] = i
        out.append(rec)
    return out


def read_labels(path: str | os.PathLike[str]) -> list[LabelRecord]:
    """Read and validate a label file.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        Naming the file and line of the first bad record (invalid JSON, missing keys, lists of
        different lengths, non-finite utilities, duplicate question ids), or when the file
        holds no labels.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such label file: {path}; make one with `ragkit distill labels`")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; pass a label file (JSONL, made by `ragkit distill labels`)")
    if path.suffix == ".gz":  # a committed, compressed label file (read-only: nothing appends to it)
        import gzip

        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = []
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append((i, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        out = _parse_rows(path, rows)
    else:
        out = _parse_rows(path, read_appended_jsonl(path, with_lines=True))
    if not out:
        raise ValueError(f"{path} holds no labels; make some with `ragkit distill labels`")
    return out


def write_labels(path: str | os.PathLike[str], labels: Iterable[LabelRecord]) -> None:
    """Write ``labels`` as a label file atomically (replacing any existing file)."""
    atomic_write_text(path, "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in labels))


def _existing_qids(path: Path) -> set[str]:
    """Question ids already in a (possibly interrupted) label file; a torn last line is dropped."""
    return {r.qid for r in _parse_rows(path, read_appended_jsonl(path, with_lines=True))}


# ----------------------------------------------------------------------------- generation
@dataclass(frozen=True)
class LabelStats:
    """What :func:`generate_labels` did."""

    path: str
    written: int
    skipped_existing: int
    skipped_unusable: int
    total: int
    seconds: float
    generator_calls: int

    @property
    def seconds_per_question(self) -> float:
        return self.seconds / self.written if self.written else float("nan")

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["seconds_per_question"] = self.seconds_per_question
        return d


def _result_utilities(result: Any) -> np.ndarray:
    """The estimator's utilities of a ``MoIResult`` as a float array.

    ``raw_utilities`` (before the retriever blend and the fallback) where the result has them, else
    ``utilities`` / ``u``. A label is the interventions' signal: the fallback, which replaces the
    utilities by the input order when they do not separate the passages, is an inference-time
    decision that would teach a student the retriever's order, so the label records it
    (``metadata["fallback"]``) instead of taking it.
    """
    for name in ("raw_utilities", "utilities", "u"):
        v = getattr(result, name, None)
        if v is not None:
            return np.asarray(v, dtype=np.float64).reshape(-1)
    raise TypeError(
        f"{type(result).__name__} has no 'utilities' or 'u' attribute; cannot read MoI utilities"
    )


def _result_calls(result: Any, default: int) -> int:
    for name in ("generator_calls", "num_calls", "forward_passes"):
        v = getattr(result, name, None)
        if v is not None:
            return int(v)
    return default


def labels_from_results(
    records: Sequence[QARecord],
    results: Sequence[Any],
    *,
    generator_name: str = "",
    design: str = "cyclic",
    outcome: str = "gold",
    source: str = "",
    metadata: Sequence[Mapping[str, Any]] | None = None,
) -> list[LabelRecord]:
    """Turn MoI results (one per record, passages in the record's order) into label records.

    ``metadata``: one mapping per record merged into its label's ``metadata`` (e.g. its cost); each
    label also records ``fallback`` when the result has it.
    """
    if len(records) != len(results):
        raise ValueError(f"{len(records)} records but {len(results)} MoI results")
    out: list[LabelRecord] = []
    for n, (rec, res) in enumerate(zip(records, results)):
        u = _result_utilities(res)
        meta: dict[str, Any] = dict(metadata[n]) if metadata is not None else {}
        if getattr(res, "fallback", None) is not None:
            meta["fallback"] = bool(res.fallback)
        if u.shape[0] != len(rec.passages):
            raise ValueError(
                f"MoI returned {u.shape[0]} utilities for question {rec.id!r} with {len(rec.passages)} passages"
            )
        ps = rec.passages
        out.append(
            LabelRecord(
                qid=rec.id,
                question=rec.question,
                passage_ids=tuple(p.id for p in ps),
                titles=tuple(p.title for p in ps),
                texts=tuple(p.text for p in ps),
                u=tuple(float(x) for x in u),
                answers=tuple(rec.answers),
                gold_ids=tuple(rec.gold_ids),
                source=source or str(rec.metadata.get("dataset") or ""),
                generator=generator_name,
                design=design,
                outcome=outcome,
                generator_calls=_result_calls(res, len(ps)),
                metadata=meta,
            )
        )
    return out


def usable_for_labels(rec: QARecord) -> str | None:
    """Why ``rec`` cannot be labelled with the ``gold`` outcome (``None`` when it can)."""
    if not rec.answers or not any(a.strip() for a in rec.answers):
        return "no reference answer"
    if len(rec.passages) < 2:
        return f"{len(rec.passages)} passage(s)"
    if len({p.id for p in rec.passages}) != len(rec.passages):
        return "duplicate passage ids"
    return None


def generate_labels(
    generator: Generator,
    records: Sequence[QARecord],
    out_path: str | os.PathLike[str],
    *,
    batch_queries: int = 4,
    resume: bool = True,
    design: str = "loo",
    moi_kwargs: Mapping[str, Any] | None = None,
    source: str = "",
    show_progress: bool | None = None,
    outcome: str = "gold",
) -> LabelStats:
    """Label training questions with MoI ``gold``-outcome utilities, appending to ``out_path``.

    For each question MoI scores the reference answer's mean log-prob under the design's
    interventions (``loo``: the full prompt and each passage left out, ``M = k + 1`` generator
    sequences; ``cyclic``: the ``k`` rotations; one batched call per ``batch_queries`` questions)
    and solves for the per-passage utilities ``u``.

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator`.
    records
        Training questions with their candidate passages (given order) and reference answers.
        Records without an answer or with fewer than two passages are skipped (logged).
    out_path
        Label file (JSONL). Created if missing.
    batch_queries
        Questions per ``MoI.run_batch`` call; labels are appended after each call. The ``masked``
        design runs one question per call (its estimator is per question; the cost is then exact).
    resume
        Skip question ids already in ``out_path`` (a partial last line from a killed run is
        dropped). With ``resume=False`` an existing file is replaced.
    design
        MoI design (default ``"loo"``, chosen on train questions, see the module docstring;
        ``"ablate"``, ``"cyclic"``, ``"prior"``/``"random"`` (cheaper, noisier) also work).
        ``"masked"``: leave-one-out estimated from one prefill with each passage masked out, the
        ``moi_masked`` reranker's settings (:func:`ragkit.debias.presets.moi_settings`); it takes
        ``outcome="question"`` only. Its labels are what ``moi_masked`` computes at inference.
    moi_kwargs
        Extra keyword arguments for :class:`ragkit.debias.MoI` (``profile``, ``lam``, ``seed``).
    source
        Dataset name stored in each label (defaults to the record's ``metadata["dataset"]``).
    outcome
        ``"gold"`` (mean log-prob of the reference answer: an oracle signal) or ``"question"``
        (query likelihood, label-free: what ``moi`` runs at inference, so a student learns what a
        user can compute).
    show_progress
        Progress bar over batches (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).

    Returns
    -------
    LabelStats
    """
    if batch_queries < 1:
        raise ValueError(f"batch_queries must be >= 1, got {batch_queries}")
    moi = label_moi(generator, design, outcome, moi_kwargs)  # bad settings fail before the file is touched
    if design == "masked":  # its outcome runs one question at a time anyway; batches of one: each label its own cost
        batch_queries = 1
    path = Path(out_path)
    if not resume and path.exists():
        atomic_write_text(path, "")
    done = _existing_qids(path) if resume else set()

    todo: list[QARecord] = []
    skipped_existing = skipped_unusable = 0
    seen: set[str] = set()
    for rec in records:
        if rec.id in done:
            skipped_existing += 1
            continue
        if rec.id in seen:
            continue
        why = usable_for_labels(rec)
        if why is not None:
            logger.info("skipping question %r: %s", rec.id, why)
            skipped_unusable += 1
            continue
        seen.add(rec.id)
        todo.append(rec)
    logger.info("labelling %d questions (%d already in %s, %d unusable)",
                len(todo), skipped_existing, path, skipped_unusable)

    gen_name = str(getattr(generator, "name", "") or "")
    written = calls = 0
    t0 = time.perf_counter()
    batches = [todo[i : i + batch_queries] for i in range(0, len(todo), batch_queries)]
    for batch in progress(batches, show=show_progress, desc="MoI labels", unit="batch"):
        tb = time.perf_counter()
        with metered() as meter:
            results = moi.run_batch(
                [r.question for r in batch],
                [list(r.passages) for r in batch],
                None,
                [list(r.answers) for r in batch],
                generate_answer=False,
            )
        n = len(batch)
        cost = {"cost": {**meter.per_item(n, time.perf_counter() - tb), "batch_questions": n}}
        labels = labels_from_results(batch, results, generator_name=gen_name, design=design,
                                     outcome=outcome, source=source, metadata=[cost] * n)
        append_jsonl(path, (lab.to_dict() for lab in labels))
        written += len(labels)
        calls += sum(lab.generator_calls for lab in labels)
    if not path.exists():
        atomic_write_text(path, "")
    seconds = time.perf_counter() - t0
    return LabelStats(
        path=str(path),
        written=written,
        skipped_existing=skipped_existing,
        skipped_unusable=skipped_unusable,
        total=len(records),
        seconds=seconds,
        generator_calls=calls,
    )


def label_moi(generator: Any, design: str = "loo", outcome: str = "gold",
              moi_kwargs: Mapping[str, Any] | None = None) -> Any:
    """The :class:`ragkit.debias.MoI` that :func:`generate_labels` labels with (checked settings).

    ``design="masked"`` is the ``moi_masked`` reranker's MoI (:func:`ragkit.debias.presets.moi_settings`), so
    its labels are the utilities that reranker computes at inference; it needs ``outcome="question"``.
    """
    from ragkit.debias import MoI
    from ragkit.debias.presets import moi_settings

    if design not in LABEL_DESIGNS:
        raise ValueError(f"unknown label design {design!r}; choose one of {', '.join(LABEL_DESIGNS)}")
    if outcome not in ("gold", "question"):
        raise ValueError(f"label outcome must be 'gold' (reference answer) or 'question' (label-free), got {outcome!r}")
    kw = dict(moi_kwargs or {})
    if design == "masked":
        if outcome != "question":
            raise ValueError("the masked design estimates the question outcome (label-free MoI, what moi_masked runs "
                             f"at inference); pass outcome='question' (--outcome question), not {outcome!r}")
        return MoI.from_settings(generator, **{**moi_settings("moi_masked"), **kw})
    return MoI.from_settings(generator, design=design, outcome=outcome, **kw)


def label_references(labs: Sequence[Any], seed: int = 0, n_perm: int = 200) -> dict[str, dict[str, list[float]]]:
    """Per-question (MRR@10, recall@2) of the label rankings and of a random order, against gold.

    ``labs``: label records (``ranking``, ``passage_ids``, ``gold_ids``), each with gold passages.
    ``"teacher"`` scores each label's own ranking; ``"random"`` is the mean over ``n_perm`` random
    permutations of its passages (a Monte Carlo expectation, seeded): what the labels carry, and what
    a student that learned nothing scores.
    """
    from ragkit.eval.metrics import rank_metrics

    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, list[float]]] = {n: {"mrr@10": [], "recall@2": []} for n in ("teacher", "random")}
    for lab in labs:
        rows = {"teacher": np.array([rank_metrics(list(lab.ranking), lab.gold_ids)]),
                "random": np.array([rank_metrics(list(rng.permutation(list(lab.passage_ids))), lab.gold_ids)
                                    for _ in range(n_perm)])}
        for name, r in rows.items():
            out[name]["mrr@10"].append(float(r[:, 0].mean()))
            out[name]["recall@2"].append(float(r[:, 1].mean()))
    return out


def passage_labels(records: Sequence[QARecord], source: str = "") -> list[LabelRecord]:
    """Free labels from the data's gold passages: ``u_i = 1`` for a gold passage, else 0.

    The second training signal beside MoI's utilities (NQ-open ``hasanswer``, HotpotQA supporting
    titles: a record's ``gold_ids``); no generator runs. A record with no gold passage among its
    candidates, or only gold ones, teaches no ranking and is skipped.
    """
    out = []
    for rec in records:
        gold = set(rec.gold_ids)
        u = [1.0 if p.id in gold else 0.0 for p in rec.passages]
        if len(rec.passages) < 2 or len({p.id for p in rec.passages}) != len(rec.passages) or len(set(u)) < 2:
            continue
        ps = rec.passages
        out.append(LabelRecord(qid=rec.id, question=rec.question, passage_ids=tuple(p.id for p in ps),
                               titles=tuple(p.title for p in ps), texts=tuple(p.text for p in ps), u=tuple(u),
                               answers=tuple(rec.answers), gold_ids=tuple(rec.gold_ids),
                               source=source or str(rec.metadata.get("dataset") or ""), design="gold_passages",
                               outcome="gold_passages", generator_calls=0))
    return out
