"""End-to-end RAG: retrieve -> rerank -> place -> answer.

>>> from ragkit import RAGPipeline                                   # doctest: +SKIP
>>> rag = RAGPipeline.default()          # bundled HotpotQA sample, BM25, embedded SmolLM2, MoI
>>> rag.ask("Which magazine was started first, Arthur's Magazine or First for Women?").answer  # doctest: +SKIP

The pipeline composes the parts of :mod:`ragkit.debias` (any :class:`~ragkit.reranking.Reranker`,
a placement, an :class:`~ragkit.debias.answerers.Answerer`) through the same
:class:`~ragkit.debias.presets.Method` that ``ragkit eval`` runs. Every model call is batched over
the questions given to :meth:`RAGPipeline.ask_many`: one ``search`` for all questions, one
``rank_many`` (for MoI: all interventions of all questions; by default the full prompt and each
passage left out, scored by the question's likelihood) and one answering call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragkit.debias.answerers import Answerer, get_answerer
from ragkit.debias.presets import Method, get_reranker
from ragkit.reranking import Reranker
from ragkit.types import Passage, RankedList

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.debias.moi import MoI
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
        The final ranking (the reranker's; the retriever's list for the identity reranker).
    prompt_order
        Passages in the order they were placed in the final prompt.
    generator_calls
        Sequences sent through the generator for this question (reranking + answering).
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
    """Retriever -> reranker -> placement -> answerer.

    Parameters
    ----------
    retriever
        Any :class:`ragkit.retrievers.Retriever` (already indexed or loaded).
    reranker
        A :class:`~ragkit.reranking.Reranker`, a spec of :func:`ragkit.debias.get_reranker`
        (``"moi"``, ``"student:DIR"``, ``"cross-encoder:NAME"``, ...; built on ``generator``), or
        ``None`` for the retriever order.
    placement
        ``"none"`` (ranking order), ``"reverse"``, ``"both_ends"`` or ``"bias_aware"``
        (:mod:`ragkit.debias.placement`; ``bias_aware`` uses ``profile`` or the MoI reranker's).
    answerer
        An :class:`~ragkit.debias.answerers.Answerer`, or a name (``"single"``, ``"voting"``,
        ``"psc_borda"``, ``"psc_rrf"``) built on ``generator``.
    k
        Passages retrieved per question.
    generator
        The :class:`ragkit.generation.Generator` that named rerankers and answerers are built on.
    profile
        Position profile for ``bias_aware`` placement.
    max_new_tokens
        Answer length cap of a named answerer.

    Examples
    --------
    >>> from ragkit.debias import MoIReranker, SingleAnswerer                     # doctest: +SKIP
    >>> rag = RAGPipeline(bm25, MoIReranker(gen), "bias_aware", SingleAnswerer(gen), k=5)  # doctest: +SKIP
    >>> rag = RAGPipeline(bm25, "student:students/minilm", "none", "single", generator=gen)  # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever,
        reranker: Reranker | str | None = None,
        placement: str = "none",
        answerer: Answerer | str = "single",
        k: int = 5,
        *,
        generator: Any = None,
        profile: Any = None,
        max_new_tokens: int = 32,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if generator is None and isinstance(answerer, Answerer):
            generator = answerer.generator
        if not isinstance(answerer, Answerer) and generator is None:
            raise ValueError(f"answerer {answerer!r} is a name: pass generator=Generator(...) to build it, "
                             "or pass an Answerer object")
        rr = get_reranker(reranker if reranker is not None else "none", generator)
        ans = get_answerer(answerer, generator, max_new_tokens=max_new_tokens)
        rr_gen = getattr(rr, "generator", None)
        if rr_gen is not None and rr_gen is not ans.generator:
            raise ValueError("the reranker runs on a different Generator than the answerer; build both on "
                             "the same Generator (one model in memory), e.g. MoIReranker(gen) and SingleAnswerer(gen)")
        self.retriever = retriever
        self.k = k
        self.method = Method(rr, placement, ans, profile=profile, name=rr.name)

    @property
    def reranker(self) -> Reranker:
        """The reranker."""
        return self.method.reranker

    @property
    def answerer(self) -> Answerer:
        """The answerer."""
        assert self.method.answerer is not None
        return self.method.answerer

    @property
    def generator(self) -> Any:
        """The answerer's generator."""
        return self.answerer.generator

    @property
    def moi(self) -> MoI | None:
        """The :class:`~ragkit.debias.MoI` behind an MoI reranker, else ``None``."""
        return getattr(self.reranker, "moi", None)

    @classmethod
    def default(cls, index: str | None = None, model: str | None = None, use_moi: bool = True, k: int = 5,
                device: str = "auto", dtype: str = "auto", **moi_kwargs: Any) -> RAGPipeline:
        """A pipeline on the embedded defaults.

        Parameters
        ----------
        index
            A saved index dir (``ragkit index``); ``None`` indexes the bundled HotpotQA sample with BM25.
        model
            Generator name or path; ``None`` is the embedded SmolLM2-135M-Instruct.
        use_moi
            Rerank with MoI and place bias-aware (``moi_kwargs`` go to
            :class:`ragkit.debias.MoIReranker`; ``placement="ranked"`` keeps the ranking order;
            ``passage_max_tokens`` goes to the generator); otherwise answer from the retriever order.
        device, dtype
            Where the generator runs and its weights' dtype (``"auto"``: bf16 on CUDA, fp32 on a CPU).
        """
        from ragkit.generation import load_generator
        from ragkit.retrievers import BM25Retriever, load_retriever

        if index:
            retriever = load_retriever(index)
        else:
            from ragkit.datasets import sample_corpus

            retriever = BM25Retriever().index(sample_corpus())
        gen = load_generator(model, device=device, dtype=dtype,
                             passage_max_tokens=moi_kwargs.pop("passage_max_tokens", None))
        placement = moi_kwargs.pop("placement", "bias_aware") if use_moi else "none"
        if use_moi:
            from ragkit.debias.reranker import MoIReranker

            return cls(retriever, MoIReranker(gen, **moi_kwargs), placement, "single", k=k, generator=gen)
        return cls(retriever, None, placement, "single", k=k, generator=gen)

    def ask(self, question: str) -> RAGAnswer:
        """Answer one question (see :meth:`ask_many`)."""
        return self.ask_many([question])[0]

    async def aask(self, question: str) -> RAGAnswer:
        """:meth:`ask` in a worker thread (``asyncio.to_thread``), for async applications."""
        import asyncio

        return await asyncio.to_thread(self.ask, question)

    def ask_many(self, questions: Sequence[str]) -> list[RAGAnswer]:
        """Answer several questions; retrieval, reranking and answering are each one batched call."""
        questions = list(questions)
        for q in questions:
            if not isinstance(q, str) or not q.strip():
                raise ValueError("a question is empty; pass non-empty question strings")
        if not questions:
            return []
        hits_list = self.retriever.search(questions, k=self.k)
        found = [i for i, h in enumerate(hits_list) if len(h)]
        outs = self.method.run_many([questions[i] for i in found], [hits_list[i].passages() for i in found],
                                    [hits_list[i].scores() for i in found]) if found else []
        by_i = dict(zip(found, outs))
        result: list[RAGAnswer] = []
        for i, q in enumerate(questions):
            hits = hits_list[i]
            o = by_i.get(i)
            if o is None:
                logger.warning("nothing retrieved for %r; answering with an empty string", q)
                result.append(RAGAnswer(q, "", hits, hits, [], 0))
                continue
            ps = hits.passages()
            result.append(RAGAnswer(q, o.answer or "", hits, o.ranking, [ps[j] for j in o.order], o.generator_calls))
        return result
