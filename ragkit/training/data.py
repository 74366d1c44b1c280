"""Training examples for CORD: a question, its passages in retriever order with scores, an answer.

HotpotQA (distractor setting): the question's 10 paragraphs ordered by a ragkit
:class:`~ragkit.retrievers.BM25Retriever` indexed on those 10 paragraphs (BM25 scores kept as the
retriever scores). MS MARCO QnA: the query's Bing passages ranked the same way (queries without
an answer are skipped). Records come from the project's loaders in :mod:`ragkit.datasets`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Dataset

from ragkit.datasets import detect_format, load_dataset
from ragkit.io import progress
from ragkit.types import Passage, QARecord

__all__ = ["CORDDataset", "Example", "examples_from_records", "load_examples"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One CORD training example.

    Attributes
    ----------
    id
        Record id.
    question
        The question.
    passages
        Passages in retriever order (slot 0 = best).
    answer
        Target answer ``y``.
    scores
        Retriever scores aligned with ``passages`` (``None``: rank order only).
    gold_ids
        Ids of the gold passages (for analysis; training does not use them).
    """

    id: str
    question: str
    passages: tuple[Passage, ...]
    answer: str
    scores: tuple[float, ...] | None = None
    gold_ids: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.question.strip():
            raise ValueError(f"example {self.id!r} has an empty question")
        if not self.answer.strip():
            raise ValueError(f"example {self.id!r} has an empty answer")
        if not self.passages:
            raise ValueError(f"example {self.id!r} has no passages")
        if self.scores is not None and len(self.scores) != len(self.passages):
            raise ValueError(f"example {self.id!r}: {len(self.scores)} scores for {len(self.passages)} passages")


def _rank_with_bm25(record: QARecord, retriever_kwargs: dict[str, Any]) -> tuple[list[Passage], list[float]]:
    """The record's passages ranked by a BM25 index built on exactly those passages."""
    from ragkit.retrievers import BM25Retriever

    # ids must be unique for the index; HotpotQA titles are, MS MARCO ids are "{qid}-{j}"
    ids = [p.id for p in record.passages]
    if len(set(ids)) != len(ids):
        ps = [Passage(id=f"{i}:{p.id}", text=p.text, title=p.title, metadata=p.metadata)
              for i, p in enumerate(record.passages)]
    else:
        ps = list(record.passages)
    r = BM25Retriever(**retriever_kwargs).index(ps)
    ranked = r.search([record.question], k=len(ps))[0]
    by_id = {p.id: orig for p, orig in zip(ps, record.passages)}
    order = [by_id[h.passage.id] for h in ranked.hits]
    scores = [float(h.score) for h in ranked.hits]
    seen = {p.id for p in (h.passage for h in ranked.hits)}
    # passages BM25 did not return (no shared term) go last with score 0, in their given order
    for p, orig in zip(ps, record.passages):
        if p.id not in seen:
            order.append(orig)
            scores.append(0.0)
    return order, scores


def examples_from_records(
    records: Sequence[QARecord],
    retriever: str | None = "bm25",
    k: int | None = None,
    retriever_kwargs: dict[str, Any] | None = None,
) -> list[Example]:
    """Turn QA records into CORD examples.

    Parameters
    ----------
    records
        Records from :func:`ragkit.datasets.load_dataset`.
    retriever
        ``"bm25"``: rank each record's passages with a BM25 index over those passages and keep the
        scores; ``None``: keep the given order without scores.
    k
        Keep the top ``k`` passages after ranking (``None``: all).
    retriever_kwargs
        Extra arguments for :class:`~ragkit.retrievers.BM25Retriever`.
    """
    if retriever not in ("bm25", None):
        raise ValueError(f"retriever must be 'bm25' or None, got {retriever!r}")
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 or None, got {k}")
    out: list[Example] = []
    skipped = 0
    for rec in progress(records, desc="rank passages", leave=False):
        if not rec.answers or not rec.passages:
            skipped += 1
            continue
        if retriever == "bm25":
            ps, sc = _rank_with_bm25(rec, dict(retriever_kwargs or {}))
            scores: tuple[float, ...] | None = tuple(sc[:k] if k else sc)
        else:
            ps, scores = list(rec.passages), None
        ps = ps[:k] if k else ps
        out.append(Example(id=rec.id, question=rec.question, passages=tuple(ps), answer=rec.answers[0],
                           scores=scores, gold_ids=tuple(rec.gold_ids),
                           metadata={"dataset": rec.metadata.get("dataset")}))
    if skipped:
        logger.info("skipped %d records without answers or passages", skipped)
    return out


def load_examples(
    path: str | os.PathLike[str],
    dataset: str | None = None,
    limit: int | None = None,
    retriever: str | None = "bm25",
    k: int | None = None,
) -> list[Example]:
    """Load a HotpotQA / MS MARCO (/ NQ-open) file and build CORD examples.

    Parameters
    ----------
    path
        Local data file (``.jsonl`` HotpotQA, ``.json`` MS MARCO QnA, ``.jsonl.gz`` NQ-open).
    dataset
        Dataset name for :func:`ragkit.datasets.load_dataset` (``None``: told from the file's
        content by :func:`ragkit.datasets.detect_format`).
    limit
        Keep the first ``limit`` records.
    retriever, k
        See :func:`examples_from_records`.
    """
    name = dataset or detect_format(path)
    records = load_dataset(name, path, limit=limit)
    ex = examples_from_records(records, retriever=retriever, k=k)
    if not ex:
        raise ValueError(f"{path}: no record has an answer and passages; nothing to train on")
    logger.info("loaded %d %s training examples from %s", len(ex), name, path)
    return ex


class CORDDataset(Dataset):
    """A torch ``Dataset`` over :class:`Example` objects (the collator builds the prompts)."""

    def __init__(self, examples: Sequence[Example]) -> None:
        if not examples:
            raise ValueError("CORDDataset needs at least one example")
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]
