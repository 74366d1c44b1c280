"""``MoIReranker``: Mixture-of-Intervention as a drop-in :class:`ragkit.reranking.Reranker`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ragkit.debias.interventions import Design
from ragkit.debias.moi import MoI, MoIResult
from ragkit.debias.outcomes import Outcome, OutcomeFn
from ragkit.debias.profile import PositionProfile
from ragkit.generation.base import GeneratorLike, metered
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["MoIReranker", "moi_details"]


class MoIReranker(Reranker):
    """Rerank passages by their MoI utility (Lee et al., NAACL Findings 2025, arXiv 2412.10684).

    ``rank(query, passages, scores)`` returns the passages ranked by the utilities ``u`` that MoI
    estimates from its interventions (scores of the returned hits = ``u``); ``scores`` (retriever
    scores), when given, are the prior of the permutation designs' ridge estimator, of the blend
    and of the fallback. By default each passage's utility is the drop in the question's
    likelihood when that passage is left out (``design="loo"``, ``outcome="question"``: ``k + 1``
    sequences, no generation): of the designs tried on HotpotQA train questions (never on the
    questions results are reported on) it ranked the gold passages best, with two generators, at
    ``k + 1`` sequences a query; :mod:`ragkit.debias.moi` says how the default was chosen. Each
    returned ranking's ``info`` (:class:`~ragkit.types.RankInfo`) holds its generator cost
    (sequences, forward passes, tokens), whether MoI fell back to the input order and why, and in
    ``details`` the rest of its :class:`MoIResult` (see :func:`moi_details`). With the ``gold``
    outcome (an oracle) the reference answers come from the :class:`Query` objects
    (:attr:`needs_answers` is then ``True``).

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator`.
    design, outcome
        As in :class:`ragkit.debias.MoI`: design and outcome objects, or their names (defaults:
        ``loo``, k + 1 prompts, and the ``question`` outcome; ``design="cyclic",
        outcome="consensus"`` is the preset ``moi_cyclic``).
    generate_answer
        Also generate the final answer from the bias-aware order (``info.details["answer"]``).
    **settings
        Any setting of :meth:`ragkit.debias.MoI.from_settings`: ``budget``, ``lam``, ``head``,
        ``max_tied``, ... (read by the design or outcome they belong to), ``profile``,
        ``placement``, ``blend``, ``fallback``, ``seed``, ``max_new_tokens``.

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
        design: Design | str = "loo",
        outcome: Outcome | str | OutcomeFn = "question",
        generate_answer: bool = False,
        **settings: Any,
    ) -> None:
        self.moi = MoI.from_settings(generator, design, outcome, **settings)
        self.generate_answer = generate_answer
        self.needs_answers = bool(getattr(self.moi.outcome, "needs_answers", False))

    @property
    def generator(self) -> Any:
        """The generator MoI runs its orderings through."""
        return self.moi.generator

    def profile_for(self, k: int) -> PositionProfile:
        """The position profile MoI uses for ``k`` passages (also the one bias-aware placement needs)."""
        return self.moi.profile_for(k)

    def profiles_used(self) -> list[dict[str, Any]]:
        """Where the profiles MoI has used came from (path and SHA-256 of a file or cached profile)."""
        return self.moi.profiles_used()

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        answers = [list(q.answers) for q in queries] if all(q.answers for q in queries) else None
        with metered() as cost:
            res = self.moi.run_batch([q.text for q in queries], passages, scores, answers,
                                     generate_answer=self.generate_answer)
        return [RankedList(r.ranking.hits, q, RankInfo(
            generator_calls=int(r.generator_calls), forward_passes=cost.forward_passes,
            tokens_prefilled=cost.tokens_prefilled, tokens_generated=cost.tokens_generated,
            fallback=bool(r.fallback), fallback_reason=r.fallback_reason,
            details=moi_details(r, self.moi))) for q, r in zip(queries, res)]


def moi_details(result: MoIResult, moi: MoI | None = None) -> dict[str, Any]:
    """The JSON-ready diagnostics of one MoI result that a ranking's ``info.details`` carries.

    Keys: ``utilities`` and ``raw_utilities`` (input order), ``outcomes``, ``orderings`` (the
    interventions), ``ordering_answers``, ``target``, ``order`` (prompt order, indices into the
    input passages), ``answer``, ``weights``, ``fit_stats``, ``rounds`` and, given ``moi``, its
    ``design`` and ``outcome``.
    """
    out: dict[str, Any] = {
        "utilities": [float(x) for x in np.asarray(result.utilities)],
        "raw_utilities": None if result.raw_utilities is None else [float(x) for x in np.asarray(result.raw_utilities)],
        "outcomes": [float(x) for x in np.asarray(result.outcomes).ravel()],
        "orderings": [[int(j) for j in o] for o in result.orderings],
        "ordering_answers": list(result.ordering_answers),
        "target": result.target,
        "order": [int(j) for j in result.order],
        "answer": result.answer,
        "weights": None if result.weights is None else [float(x) for x in np.asarray(result.weights)],
        "fit_stats": {k: float(v) for k, v in result.fit_stats.items()},
        "rounds": int(result.rounds),
    }
    if moi is not None:
        out["design"] = moi.design.name
        out["outcome"] = getattr(moi.outcome, "name", None) or getattr(moi.outcome, "__name__", "custom")
    return out
