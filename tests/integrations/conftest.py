"""Fixtures for the framework adapters: a tiny real cross-encoder and a reranker that records its inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragkit.reranking import Reranker
from ragkit.types import Passage

CORPUS = [
    Passage("a", "Hamlet is a tragedy written by William Shakespeare around 1600, set in Denmark.", "Hamlet"),
    Passage("b", "Shakespeare wrote Hamlet.", "Short"),
    Passage("c", "Paris is the capital of France.", "Paris"),
    Passage("d", "William Shakespeare was an English playwright, poet and actor born in Stratford.", "WS"),
    Passage("e", "Hamlet, Prince of Denmark, is the title character of the play by Shakespeare.", "Prince"),
]


class Recording(Reranker):
    """A real reranker (the tiny student) that records the retriever scores it was given."""

    def __init__(self, inner: Reranker) -> None:
        self.inner = inner
        self.seen_scores: list[Any] = []

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        self.seen_scores.extend(scores)
        return self.inner.rank_many(queries, passages)


@pytest.fixture(scope="session")
def corpus() -> list[Passage]:
    """Five short passages about Hamlet, Shakespeare and Paris."""
    return list(CORPUS)


@pytest.fixture(scope="session")
def tiny_student(tiny_encoder_dir: Path) -> Reranker:
    """A tiny random one-output cross-encoder (2-layer BERT, hidden 32) as a ragkit reranker."""
    from ragkit.debias.student import DistilledReranker

    return DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0)


@pytest.fixture()
def recording(tiny_student: Reranker) -> Recording:
    return Recording(tiny_student)
