"""Mixture-of-Intervention (MoI): debiased passage reranking at inference time.

Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684. Placing passage ``p`` at prompt slot ``j`` is an intervention;
running the generator on ``M`` orderings ``π_1..π_M`` of the same ``k`` passages (one batched
call) and observing one outcome per ordering separates each passage's utility ``u_p`` from each
slot's weight ``a_j`` under the model

    E[o(π)] = b + Σ_j a_j · u_{π(j)}.

Pipeline (:meth:`MoI.run_many`): design → orderings → outcomes (batched across orderings and
queries) → ridge utilities ``u = (A_cᵀA_c + λI)⁻¹(A_cᵀo_c + λ u_prior)``
(:func:`ragkit.debias.estimators.ridge_utilities`) → ranking by ``u`` (ties: retriever order) →
placement (``bias_aware``: the best passage into the heaviest slot ``argmax a_j``, the next into
the next heaviest, ...; ``ranked``: ranking order) → one final answer from the chosen order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragkit.debias.designs import DESIGNS, make_design
from ragkit.debias.estimators import ridge_utilities
from ragkit.debias.outcomes import OUTCOMES, OutcomeFn, compute_outcomes
from ragkit.debias.placement import place
from ragkit.debias.profile import PositionProfile
from ragkit.types import Passage, Query, RankedList, as_passages

__all__ = ["MoI", "MoIResult", "PLACEMENTS"]

logger = logging.getLogger(__name__)

PLACEMENTS = ("bias_aware", "ranked")


@dataclass
class MoIResult:
    """MoI's output for one query.

    Attributes
    ----------
    ranking
        Passages ranked by utility (scores = utilities ``u``).
    order
        Final prompt order (indices into the input passages; ``order[j]`` = passage at slot ``j``).
    utilities
        ``(k,)`` utilities in input order.
    orderings
        The ``M`` orderings that were run.
    outcomes
        ``(M,)`` outcome per ordering.
    answer
        Final answer generated once from ``order`` (``None`` if not requested).
    ordering_answers
        Each ordering's greedy answer (label-free outcomes).
    target
        The answer whose log-prob was the outcome (consensus / gold), if any.
    weights
        The profile ``a`` used.
    generator_calls
        Sequences sent through the generator (orderings generated + scored + final answer).
    inputs
        The input passages (retriever order).
    """

    ranking: RankedList
    order: list[int]
    utilities: np.ndarray
    orderings: list[list[int]]
    outcomes: np.ndarray
    answer: str | None = None
    ordering_answers: list[str] = field(default_factory=list)
    target: str | None = None
    weights: np.ndarray | None = None
    generator_calls: int = 0
    inputs: list[Passage] = field(default_factory=list)

    def passages(self) -> list[Passage]:
        """Passages in the final prompt order."""
        return [self.inputs[i] for i in self.order]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "ranking": [{"id": h.passage.id, "utility": h.score, "rank": h.rank} for h in self.ranking],
            "order": list(self.order),
            "orderings": [list(o) for o in self.orderings],
            "outcomes": np.asarray(self.outcomes).tolist(),
            "answer": self.answer,
            "ordering_answers": list(self.ordering_answers),
            "target": self.target,
            "weights": None if self.weights is None else np.asarray(self.weights).tolist(),
            "generator_calls": self.generator_calls,
        }


class MoI:
    """Mixture-of-Intervention reranker + answerer (see the module docstring).

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator` (may be ``None`` only with a callable ``outcome``
        and ``generate_answer=False``).
    design
        ``"cyclic"`` (k rotations, a Latin square), ``"prior"`` (M < k orderings around the
        retriever order) or ``"random"``.
    budget
        Number of orderings ``M`` (default: ``k`` for cyclic/random, 3 for prior).
    outcome
        ``"consensus"`` (label-free, default), ``"gold"`` (needs answers), ``"confidence"``, or a
        callable ``f(generator, questions, passages, orderings, answers) -> list[OutcomeResult]``.
    lam
        Relative ridge strength toward the retriever prior (0: plain least squares).
    profile
        Position-bias profile. Default: the recency-heavy label-free profile
        :meth:`PositionProfile.recency` (0.3 on the last slot, the rest spread evenly; measured
        shape of the embedded SmolLM2 with the short template, methods spec section 5). A profile
        for another ``k`` is resized by interpolation.
    placement
        ``"bias_aware"`` or ``"ranked"``.
    head
        For ``design="prior"``: rotate only the top-``head`` passages.
    seed
        Seed of the random design.
    max_new_tokens
        Length of the per-ordering and final answers.
    max_tied
        ``consensus`` only: at most this many tied majority answers are scored under every
        ordering to break the tie (cost ``M`` sequences each; 1 = keep the first seen).
    """

    def __init__(
        self,
        generator: Any,
        design: str = "cyclic",
        budget: int | None = None,
        outcome: str | OutcomeFn = "consensus",
        lam: float = 0.1,
        profile: PositionProfile | None = None,
        placement: str = "bias_aware",
        head: int | None = None,
        seed: int = 0,
        max_new_tokens: int = 16,
        max_tied: int = 3,
    ) -> None:
        if design not in DESIGNS:
            raise ValueError(f"unknown design {design!r}; choose one of {DESIGNS}")
        if not callable(outcome) and outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; choose one of {OUTCOMES} or pass a callable")
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of {PLACEMENTS}")
        if budget is not None and budget < 1:
            raise ValueError(f"budget (number of orderings) must be >= 1, got {budget}")
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if generator is None and not callable(outcome):
            raise ValueError("MoI needs a generator for its built-in outcomes; pass a ragkit.generation.Generator")
        self.generator = generator
        self.design = design
        self.budget = budget
        self.outcome = outcome
        self.lam = float(lam)
        self.profile = profile
        self.placement = placement
        self.head = head
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.max_tied = max_tied

    def _outcome_kwargs(self) -> dict[str, Any]:
        if callable(self.outcome) or self.outcome == "gold":
            return {}
        if self.outcome == "consensus":
            return {"max_new_tokens": self.max_new_tokens, "max_tied": self.max_tied}
        return {"max_new_tokens": self.max_new_tokens}

    def profile_for(self, k: int) -> PositionProfile:
        """The profile used for ``k`` passages."""
        if self.profile is None:
            return PositionProfile.recency(k)
        return self.profile.resized(k)

    def orderings_for(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        """The design's orderings for ``k`` passages."""
        return make_design(self.design, k, self.budget, rng=rng, head=self.head)

    def run(self, question: str, passages: Sequence[Passage | str], scores: Sequence[float] | None = None,
            answers: Sequence[str] | None = None, generate_answer: bool = True) -> MoIResult:
        """:meth:`run_many` for one query."""
        return self.run_many([question], [passages], None if scores is None else [scores],
                             None if answers is None else [answers], generate_answer)[0]

    def run_many(
        self,
        questions: Sequence[str | Query],
        passages_list: Sequence[Sequence[Passage | str]],
        scores_list: Sequence[Sequence[float] | None] | None = None,
        answers_list: Sequence[Sequence[str]] | None = None,
        generate_answer: bool = True,
    ) -> list[MoIResult]:
        """Rerank (and answer) several queries; all model work is batched across queries.

        Parameters
        ----------
        questions
            Question texts (or :class:`Query`).
        passages_list
            Per query, the candidate passages in retriever order (k >= 1).
        scores_list
            Per query, optional retriever scores (the ridge prior).
        answers_list
            Per query, reference answers (required by ``outcome="gold"``).
        generate_answer
            Generate the final answer from the chosen order (one batched call).
        """
        qs = [q.text if isinstance(q, Query) else str(q) for q in questions]
        n = len(qs)
        if len(passages_list) != n:
            raise ValueError(f"{n} questions but {len(passages_list)} passage lists")
        if scores_list is not None and len(scores_list) != n:
            raise ValueError(f"{n} questions but {len(scores_list)} score lists")
        if answers_list is not None and len(answers_list) != n:
            raise ValueError(f"{n} questions but {len(answers_list)} answer lists")
        if generate_answer and self.generator is None:
            raise ValueError("generate_answer=True needs a generator")
        ps = [as_passages(p) for p in passages_list]
        for i, p in enumerate(ps):
            if not p:
                raise ValueError(f"query {i} ({qs[i]!r}) has no passages; pass at least one passage to rerank")
            if scores_list is not None and scores_list[i] is not None and len(scores_list[i]) != len(p):
                raise ValueError(f"query {i}: {len(p)} passages but {len(scores_list[i])} scores")
        rng = np.random.default_rng(self.seed)
        orderings = [self.orderings_for(len(p), rng) if len(p) > 1 else [[0]] for p in ps]
        # k = 1 needs no intervention: only queries with >= 2 passages go through the model
        active = [i for i, p in enumerate(ps) if len(p) > 1]
        outs: dict[int, Any] = {}
        if active:
            res = compute_outcomes(
                self.outcome, self.generator, [qs[i] for i in active], [ps[i] for i in active],
                [orderings[i] for i in active],
                None if answers_list is None else [list(answers_list[i] or []) for i in active],
                **self._outcome_kwargs(),
            )
            outs = dict(zip(active, res))
        results: list[MoIResult] = []
        for i, p in enumerate(ps):
            k = len(p)
            prof = self.profile_for(k)
            sc = None if scores_list is None else scores_list[i]
            if i in outs:
                o = outs[i]
                u = ridge_utilities(orderings[i], o.values, prof.weights, lam=self.lam, scores=sc)
                vals, ans, tgt, calls = np.asarray(o.values), o.answers, o.target, o.generator_calls
            else:
                u, vals, ans, tgt, calls = np.zeros(1), np.zeros(1), [], None, 0
            rank_idx = sorted(range(k), key=lambda j: (-float(u[j]), j))
            ranking = RankedList.from_scores(p, u.tolist(), query=Query(text=qs[i]))
            order = place(rank_idx, self.placement, prof.weights)
            results.append(MoIResult(ranking=ranking, order=order, utilities=np.asarray(u),
                                     orderings=orderings[i], outcomes=vals, ordering_answers=list(ans),
                                     target=tgt, weights=prof.weights, generator_calls=int(calls),
                                     inputs=list(p)))
        if generate_answer:
            finals = self.generator.answer(qs, [[p[j] for j in r.order] for p, r in zip(ps, results)],
                                           max_new_tokens=self.max_new_tokens)
            for r, a in zip(results, finals):
                r.answer = a
                r.generator_calls += 1
        return results
