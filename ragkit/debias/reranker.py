"""``MoIReranker``: Mixture-of-Intervention as a drop-in :class:`ragkit.reranking.Reranker`."""

from __future__ import annotations

from typing import Any

from ragkit.debias.moi import MoI, MoIResult
from ragkit.debias.outcomes import OutcomeFn
from ragkit.debias.profile import PositionProfile
from ragkit.generation.base import GeneratorLike
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList

__all__ = ["MoIReranker"]


class MoIReranker(Reranker):
    """Rerank passages by their MoI utility (Lee et al., NAACL Findings 2025, arXiv 2412.10684).

    ``rank(query, passages, scores)`` returns the passages ranked by the utilities ``u`` that MoI
    estimates from its interventions (scores of the returned hits = ``u``); ``scores`` (retriever
    scores), when given, are the prior of the permutation designs' ridge estimator, of the blend
    and of the fallback. By default each passage's utility is the drop in the question's
    likelihood when that passage is left out (``design="loo"``, ``outcome="question"``: ``k + 1``
    sequences, no generation): of the designs tried on HotpotQA train questions (never on the
    questions results are reported on) it ranked the gold passages best, with two generators, at
    ``k + 1`` sequences a query; :mod:`ragkit.debias.moi` says how the default was chosen. The last run's full
    :class:`MoIResult` objects (orderings, outcomes, prompt order) are kept in
    :attr:`last_results`, their generator cost in :attr:`last_generator_calls`. With the ``gold``
    outcome (an oracle) the reference answers come from the :class:`Query` objects
    (:attr:`needs_answers` is then ``True``).

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator`.
    design, budget, outcome, profile, lam, placement, seed
        As in :class:`ragkit.debias.MoI` (defaults: ``loo`` (k + 1 prompts), ``question``
        outcome, the model's own profile for the placement). The former default is
        ``design="cyclic", outcome="consensus"`` (preset ``moi_cyclic``).
    max_new_tokens
        Length of the per-ordering (and final) answers.
    generate_answer
        Also generate the final answer from the bias-aware order (in ``last_results``).
    **moi_kwargs
        Any other :class:`ragkit.debias.MoI` argument (``head``, ``max_tied``, ...).

    Examples
    --------
    >>> from ragkit.generation import Generator                     # doctest: +SKIP
    >>> rr = MoIReranker(Generator(), design="prior", budget=3)     # doctest: +SKIP
    >>> rr.rank("Who wrote Hamlet?", ["Hamlet is by Shakespeare.", "Paris is in France."]).ids()  # doctest: +SKIP
    """

    name = "moi"

    def __init__(
        self,
        generator: GeneratorLike | None,
        design: str = "loo",
        budget: int | str | None = None,
        outcome: str | OutcomeFn = "question",
        profile: PositionProfile | None = None,
        lam: float = 0.1,
        placement: str = "bias_aware",
        seed: int = 0,
        generate_answer: bool = False,
        max_new_tokens: int = 16,
        **moi_kwargs: Any,
    ) -> None:
        self.moi = MoI(generator, design=design, budget=budget, outcome=outcome, lam=lam, profile=profile,
                       placement=placement, seed=seed, max_new_tokens=max_new_tokens, **moi_kwargs)
        self.generate_answer = generate_answer
        self.needs_answers = outcome == "gold"
        self.last_results: list[MoIResult] = []
        self.last_generator_calls: list[int] = []

    @property
    def generator(self) -> Any:
        """The generator MoI runs its orderings through."""
        return self.moi.generator

    def profile_for(self, k: int) -> PositionProfile:
        """The position profile MoI uses for ``k`` passages (also the one bias-aware placement needs)."""
        return self.moi.profile_for(k)

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        answers = [list(q.answers) for q in queries] if all(q.answers for q in queries) else None
        res = self.moi.run_many([q.text for q in queries], passages, scores, answers,
                                generate_answer=self.generate_answer)
        self.last_results = res
        self.last_generator_calls = [int(r.generator_calls) for r in res]
        return [RankedList(r.ranking.hits, q) for q, r in zip(queries, res)]
