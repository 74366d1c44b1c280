"""``UPRReranker``: unsupervised passage reranking by question likelihood, one prompt per passage.

UPR (Sachan et al., "Improving Passage Retrieval with Zero-Shot Question Generation", EMNLP 2022,
arXiv 2204.07496) scores each candidate ``p_i`` by the mean log-likelihood of the question's
tokens given the passage and an instruction to write the question it answers:

    s_i = (1 / |q|) Σ_t log p(q_t | q_<t, instruction, p_i)

and ranks by ``s_i`` (ties: retriever order). It is the standard zero-shot LLM reranker: ``N``
candidates cost ``N`` teacher-forced sequences and no generation.

Prompt (choice): the generator's question-likelihood layout
(:func:`ragkit.generation.question_template` of its own template: instruction, ``Passages:``, the
one numbered passage, ``Question:``), the same layout and passage fitting as MoI's ``question``
outcome, so the two differ only in what they intervene on (one passage alone here; the whole list
minus one passage in MoI's leave-one-out). The instruction prefix is computed once per query and
its key/value cache reused for every passage (:meth:`ragkit.generation.Generator.score_orderings`).
"""

from __future__ import annotations

from ragkit.debias.outcomes import question_outcomes
from ragkit.generation.base import GeneratorLike, metered
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["UPRReranker"]


class UPRReranker(Reranker):
    """Rank passages by ``mean log p(question | instruction, passage)`` (UPR; module docstring).

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator` (anything with ``score_orderings`` and ``template``).

    Notes
    -----
    Scores of the returned hits are the ``s_i``; each ranking's ``info`` holds ``generator_calls = N``
    (one scored sequence per candidate) and the forward passes and tokens of the call.

    Examples
    --------
    >>> from ragkit.generation import Generator                              # doctest: +SKIP
    >>> rr = UPRReranker(Generator())                                        # doctest: +SKIP
    >>> rr.rank("Who wrote Hamlet?", ["Hamlet is by Shakespeare.", "Paris."]).ids()  # doctest: +SKIP
    """

    name = "upr"

    def __init__(self, generator: GeneratorLike) -> None:
        if generator is None:
            raise ValueError("the 'upr' reranker needs a generator; pass a ragkit.generation.Generator")
        self.generator = generator

    def scores_many(self, queries: list[str], passages: list[list[Passage]]) -> list[list[float]]:
        """``s_i`` for every candidate of every query (one batched, prefix-sharing call)."""
        singletons = [[[i] for i in range(len(p))] for p in passages]
        res = question_outcomes(self.generator, queries, passages, singletons)
        return [[float(v) for v in r.values] for r in res]

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        del scores  # UPR ranks by the likelihood alone; ties keep the retriever order
        with metered() as cost:
            s = self.scores_many([q.text for q in queries], passages)
        return [RankedList.from_scores(p, si, q, info=RankInfo(
            generator_calls=len(p), forward_passes=cost.forward_passes, tokens_prefilled=cost.tokens_prefilled,
            tokens_generated=cost.tokens_generated)) for q, p, si in zip(queries, passages, s)]
