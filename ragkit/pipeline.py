"""End-to-end RAG: retrieve, (optionally) debias with Mixture-of-Intervention, answer.

>>> from ragkit import RAGPipeline                                   # doctest: +SKIP
>>> rag = RAGPipeline.default()          # bundled HotpotQA sample, BM25, embedded SmolLM2
>>> rag.ask("Which magazine was started first, Arthur's Magazine or First for Women?").answer

Every model call is batched over the questions given to :meth:`RAGPipeline.ask_many`:
one batched ``search`` for all questions, one batched MoI run (all orderings of all
questions) or one batched ``Generator.answer`` call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragkit.types import Passage, RankedList

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.debias.moi import MoI
    from ragkit.generation import Generator
    from ragkit.retrievers import Retriever

__all__ = ["RAGAnswer", "RAGPipeline"]

logger = logging.getLogger(__name__)


@dataclass
class RAGAnswer:
    """The pipeline's output for one question.

    Attributes
    ----------
    question
        The question asked.
    answer
        The generated answer.
    retrieved
        The retriever's top-``k`` in retriever order.
    ranking
        The final ranking (MoI utilities when MoI ran, else the retriever's list).
    prompt_order
        Passages in the order they were placed in the final prompt.
    generator_calls
        Sequences sent through the generator for this question.
    """

    question: str
    answer: str
    retrieved: RankedList
    ranking: RankedList
    prompt_order: list[Passage] = field(default_factory=list)
    generator_calls: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (ids, scores, ranks)."""
        retrieved_rank = {h.passage.id: h.rank for h in self.retrieved}
        return {
            "question": self.question,
            "answer": self.answer,
            "passages": [{"rank": h.rank + 1, "id": h.passage.id, "title": h.passage.title, "score": h.score,
                          "retriever_rank": retrieved_rank.get(h.passage.id, -1) + 1} for h in self.ranking],
            "prompt_order": [p.id for p in self.prompt_order],
            "generator_calls": self.generator_calls,
        }


class RAGPipeline:
    """Retriever → optional MoI reranking and bias-aware placement → generator.

    Parameters
    ----------
    retriever
        Any :class:`ragkit.retrievers.Retriever` (already indexed or loaded).
    generator
        The :class:`ragkit.generation.Generator` that answers.
    moi
        A :class:`ragkit.debias.MoI` built on ``generator``; ``None`` answers from the retriever
        order directly (one generator call per question).
    k
        Passages retrieved per question.
    max_new_tokens
        Answer length cap.
    """

    def __init__(self, retriever: Retriever, generator: Generator, moi: MoI | None = None, k: int = 5,
                 max_new_tokens: int = 32) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if moi is not None and moi.generator is not generator:
            raise ValueError("the MoI object wraps a different Generator than the pipeline's; "
                             "build it as MoI(generator, ...) with the same generator")
        self.retriever = retriever
        self.generator = generator
        self.moi = moi
        self.k = k
        self.max_new_tokens = max_new_tokens

    @classmethod
    def default(cls, index: str | None = None, model: str | None = None, use_moi: bool = True, k: int = 5,
                device: str = "auto", **moi_kwargs: Any) -> RAGPipeline:
        """A pipeline on the embedded defaults.

        Parameters
        ----------
        index
            A saved index dir (``ragkit index``); ``None`` indexes the bundled HotpotQA sample with BM25.
        model
            Generator name or path; ``None`` is the embedded SmolLM2-135M-Instruct.
        use_moi
            Rerank with MoI (``moi_kwargs`` go to :class:`ragkit.debias.MoI`).
        """
        from ragkit.generation import Generator
        from ragkit.retrievers import BM25Retriever, load_retriever

        if index:
            retriever = load_retriever(index)
        else:
            from ragkit.datasets import sample_corpus

            retriever = BM25Retriever().index(sample_corpus())
        gen = Generator(model, device=device, passage_max_tokens=moi_kwargs.pop("passage_max_tokens", None))
        moi = None
        if use_moi:
            from ragkit.debias.moi import MoI

            moi = MoI(gen, **moi_kwargs)
        return cls(retriever, gen, moi, k=k)

    def ask(self, question: str) -> RAGAnswer:
        """Answer one question (see :meth:`ask_many`)."""
        return self.ask_many([question])[0]

    def ask_many(self, questions: Sequence[str]) -> list[RAGAnswer]:
        """Answer several questions; retrieval, MoI and generation are each one batched call."""
        questions = list(questions)
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise ValueError("a question is empty; pass non-empty question strings")
        if not questions:
            return []
        hits_list = self.retriever.search(questions, k=self.k)
        out: list[RAGAnswer | None] = [None] * len(questions)
        moi_idx = [i for i, h in enumerate(hits_list) if self.moi is not None and len(h) >= 2]
        plain_idx = [i for i, h in enumerate(hits_list) if i not in set(moi_idx)]
        if moi_idx:
            assert self.moi is not None
            results = self.moi.run_many([questions[i] for i in moi_idx],
                                        [hits_list[i].passages() for i in moi_idx],
                                        [hits_list[i].scores() for i in moi_idx])
            for i, res in zip(moi_idx, results):
                out[i] = RAGAnswer(questions[i], res.answer or "", hits_list[i], res.ranking,
                                   res.passages(), res.generator_calls)
        if plain_idx:
            with_passages = [i for i in plain_idx if len(hits_list[i])]
            answers = self.generator.answer([questions[i] for i in with_passages],
                                            [hits_list[i].passages() for i in with_passages],
                                            max_new_tokens=self.max_new_tokens) if with_passages else []
            by_i = dict(zip(with_passages, answers))
            for i in plain_idx:
                if i not in by_i:
                    logger.warning("nothing retrieved for %r; answering with an empty string", questions[i])
                out[i] = RAGAnswer(questions[i], by_i.get(i, ""), hits_list[i], hits_list[i],
                                   hits_list[i].passages(), int(i in by_i))
        return [o for o in out if o is not None]

