"""Mixture-of-Intervention (MoI): debiased passage reranking at inference time.

Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684. Placing passage ``p`` at prompt slot ``j`` is an intervention;
running the generator on ``M`` orderings ``π_1..π_M`` of the same ``k`` passages (one batched
call) and observing one outcome per ordering separates each passage's utility ``u_p`` from each
slot's weight ``a_j`` under the model

    E[o(π)] = b + Σ_j a_j · u_{π(j)}.

Pipeline (:meth:`MoI.run_batch`): design → interventions → outcomes (batched across
interventions and queries) → utilities → separation test and blend with the retriever order →
ranking by ``u`` (ties: retriever order) → placement (``bias_aware``: the best passage into the
heaviest slot ``argmax a_j`` of the model's profile, the next into the next heaviest, ...;
``ranked``: ranking order) → one final answer from the chosen order.

Designs and their estimators (:mod:`ragkit.debias.designs`, :mod:`ragkit.debias.estimators`):

- permutations (``cyclic``, ``prior``, ``random``): ridge utilities
  ``u = (A_cᵀA_c + λI)⁻¹(A_cᵀo_c + λ u_prior)`` (:func:`~ragkit.debias.estimators.ridge_utilities`);
- presence: ``loo`` (``u_p = o(full) − o(full \\ p)``), ``ablate`` (ContextCite's
  Lasso/ridge surrogate on the logit of the outcome probability) and ``mixed`` (subsets in random
  orders, ``u`` and ``a`` from one alternating-least-squares regression).

Never worse than the retriever: per query, :func:`~ragkit.debias.estimators.separates` tests
whether the interventions separated the passages (an F-test of the fit's explained variance, or,
for saturated designs, whether the outcome moved and the best passage is an outlier by its
modified z-score); when they did not, the retriever order
is kept (``fallback``; ``"auto"``, the default, applies it to the label-free outcomes only: the
``gold`` outcome is the reference answer's own log-prob, an oracle and the distillation labels,
and falling back would replace its ranking with the input order). Otherwise the utilities are
blended with the retriever order,
``(1 − β) z(u) + β z(prior)`` (``blend = β``). The default ``blend="auto"`` takes
``β = RETRIEVER_BLEND = 0.75`` for a query that comes with retriever scores (a real retriever's
list) and ``β = 0`` for one without (an order that may carry no information), the value chosen
on the per-question BM25 order of 10 HotpotQA train questions with the reference generator
(``loo`` + ``question``: MRR@10 0.838 unblended, 0.950 at β = 0.7–0.85, BM25 alone 0.900;
``experiments/moi_lab/results/moi_designs_train-qwen-bm25-cpu.json``, whose prior is the retriever ranks),
while on the random given order any β above 0.5 costs quality.

Default (chosen on HotpotQA **train**, never on reported questions): ``design="loo"``
with the label-free ``question`` outcome (query likelihood of the question after the passages of
each intervention, UPR), ``k + 1`` sequences and no generation before the final answer. On 10
train questions (k = 10, gold-paragraph MRR@10; given order 0.485) it reached 0.914 with the
reference generator Qwen2.5-Coder-0.5B (+0.429 [+0.203, +0.639], 11 sequences;
``experiments/moi_lab/results/moi_designs_train-qwen-cpu.json``) and 0.842 with the embedded SmolLM2-135M
(+0.357 [+0.130, +0.583]; ``experiments/moi_lab/results/moi_designs_train-cpu.json``), where
``loo``/``full_answer`` reached 0.554 / 0.475 and the permutation designs with a label-free
outcome fell back to the given order (0.485). The former default, ``cyclic`` / ``consensus``,
is the ``moi_cyclic`` preset.

Adaptive budget (``budget="auto"`` on a design, :mod:`ragkit.debias.interventions`): interventions
are added in the design's rounds and the loop stops once the top-``stable_top`` of the ranking
(of the estimated utilities, before any fallback) is unchanged for a round.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np

from ragkit.debias.estimators import (
    UtilityFit,
    blend_with_retriever,
    retriever_prior,
    separates,
    separation_failure,
)
from ragkit.debias.interventions import DESIGN_TYPES, Design, design_from_name
from ragkit.debias.outcomes import Outcome, OutcomeFn, OutcomeResult, outcome_from_name, reusable_answer
from ragkit.debias.placement import place
from ragkit.debias.profile import PositionProfile
from ragkit.generation.base import GeneratorLike
from ragkit.types import Passage, Query, RankedList, as_passages

__all__ = ["MoI", "MoIResult", "FallbackTest", "PLACEMENTS", "RETRIEVER_BLEND"]

logger = logging.getLogger(__name__)

PLACEMENTS = ("bias_aware", "ranked")
#: ``blend="auto"``: the retriever order's weight for a query passed with retriever scores
#: (chosen on HotpotQA train, BM25 order; see the module docstring).
RETRIEVER_BLEND = 0.75


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
        The ``M`` interventions that were run (orderings; subsets for the presence designs).
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
    fallback
        ``True`` when the separation test failed and the retriever order was kept.
    fallback_reason
        Why it fell back, one sentence (``""`` without a fallback).
    fit_stats
        The separation test's statistics (``r2``, ``f``, ``pvalue``, ``df_resid``, ``spread``).
    rounds
        Rounds of interventions run (``budget="auto"``; 1 otherwise).
    estimated_weights
        Slot weights estimated with ``u`` (``mixed`` design), else ``None``.
    raw_utilities
        The estimator's utilities before the blend and the fallback (diagnostics).
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
    fallback: bool = False
    fallback_reason: str = ""
    fit_stats: dict[str, float] = field(default_factory=dict)
    rounds: int = 1
    estimated_weights: np.ndarray | None = None
    raw_utilities: np.ndarray | None = None

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
            "fallback": self.fallback,
            "fallback_reason": self.fallback_reason,
            "fit_stats": dict(self.fit_stats),
            "rounds": self.rounds,
            "estimated_weights": None if self.estimated_weights is None
            else np.asarray(self.estimated_weights).tolist(),
        }


@dataclass(frozen=True)
class FallbackTest:
    """MoI's per-query fallback: keep the retriever order when the interventions did not separate
    the passages (:func:`ragkit.debias.estimators.separates`).

    Parameters
    ----------
    enabled
        ``True``, ``False`` or ``"auto"`` (default): on for the label-free outcomes, off for an
        outcome that reads the reference answers (``gold``), whose utilities are the label itself
        (the oracle, distillation labels); with the fallback on, 25 of 100 HotpotQA dev questions
        kept their random given order under the reference generator (``loo`` + ``gold``, 128-token
        passages) and the oracle's MRR@10 fell from 0.879 to 0.827.
    alpha
        Level of the F-test.
    min_spread, z_min
        Saturated designs: smallest outcome range (nats) that counts as the outcome moving, and
        the modified z-score the best passage must reach.
    """

    enabled: bool | str = "auto"
    alpha: float = 0.05
    min_spread: float = 1e-2
    z_min: float = 3.5

    def __post_init__(self) -> None:
        if isinstance(self.enabled, str) and self.enabled != "auto":
            raise ValueError(f"fallback must be True, False or 'auto', got {self.enabled!r}")


class MoI:
    """Mixture-of-Intervention reranker + answerer (see the module docstring).

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator` (may be ``None`` only with a callable ``outcome``
        and ``generate_answer=False``).
    design
        A design object of :mod:`ragkit.debias.interventions` (it owns its budget, its adaptive
        rounds and its estimator, and the settings they read), or its name with the default
        settings: the presence designs ``"loo"`` (default: the full prompt and the k prompts that
        each leave one passage out, k + 1 prompts, :class:`~ragkit.debias.interventions.LeaveOneOut`),
        ``"ablate"`` (2k random subsets) and ``"mixed"`` (3k random subsets in random orders), or
        the permutation designs ``"cyclic"`` (k rotations, a Latin square), ``"prior"`` (M < k
        orderings around the retriever order) and ``"random"``. The default was chosen on train
        questions (module docstring). ``budget="auto"`` on a design adds interventions in rounds
        until the top of the ranking is stable: outcomes of earlier rounds are reused, except
        ``consensus``, whose target answer depends on every intervention and is recomputed.
    outcome
        An outcome object of :mod:`ragkit.debias.outcomes` or its name: ``"question"`` (label-free,
        default: the question's mean log-prob after each intervention's passages; no generation),
        ``"consensus"`` (label-free: the majority of the orderings' answers, scored under each),
        ``"gold"`` (needs answers), ``"confidence"``, ``"full_answer"``; or a function
        ``f(generator, questions, passages, orderings, answers) -> list[OutcomeResult]``. A name
        gets ``max_new_tokens``.
    profile
        Position-bias profile (or the path of its JSON) used by the permutation designs and the
        placement. ``None``: the model's own, :meth:`PositionProfile.for_generator` (cached
        calibration; the recency profile for the embedded SmolLM2; else calibrated when
        ``calibrate_profile`` or flat with a warning). A profile for another ``k`` is resized.
    placement
        ``"bias_aware"`` or ``"ranked"``.
    blend
        Weight ``β`` of the retriever order in ``(1 − β) z(u) + β z(prior)`` (0: utilities only;
        1: the retriever order). ``"auto"`` (default): :data:`RETRIEVER_BLEND` (0.75) for a
        query passed with retriever scores, 0 for one without (its order may be uninformative).
    fallback
        ``"auto"``, ``True``, ``False`` or a :class:`FallbackTest` with its thresholds.
    seed
        Seed of the random designs (``random``, ``ablate``, ``mixed``) and of a calibration.
    max_new_tokens
        Length of the final answer (and of the answers of an outcome given by name).
    calibrate_profile
        With ``profile=None`` and no cached profile: calibrate on the bundled sample (a bounded,
        one-time cost, cached) instead of falling back to the flat profile.

    :meth:`from_settings` builds an MoI from flat settings (``design="prior", budget=3, head=2``),
    as the command line and the presets give them.
    """

    def __init__(
        self,
        generator: GeneratorLike | None,
        design: Design | str = "loo",
        outcome: Outcome | str | OutcomeFn = "question",
        profile: PositionProfile | str | os.PathLike[str] | None = None,
        placement: str = "bias_aware",
        blend: float | str = "auto",
        fallback: bool | str | FallbackTest = "auto",
        seed: int = 0,
        max_new_tokens: int = 16,
        calibrate_profile: bool = False,
    ) -> None:
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of {PLACEMENTS}")
        if isinstance(blend, str):
            if blend != "auto":
                raise ValueError(f"blend must be a number in [0, 1] or 'auto', got {blend!r}")
        elif not 0.0 <= blend <= 1.0:
            raise ValueError(f"blend (the retriever order's weight) must be in [0, 1], got {blend}")
        self.design: Design = design_from_name(design)
        self.outcome: Outcome | OutcomeFn = outcome_from_name(outcome, max_new_tokens=max_new_tokens)
        if generator is None and isinstance(self.outcome, Outcome):
            raise ValueError("MoI needs a generator for its built-in outcomes; pass a ragkit.generation.Generator")
        self.generator = generator
        if isinstance(profile, (str, os.PathLike)):
            profile = PositionProfile.load(profile)
        self.profile = profile
        self.placement = placement
        self.blend: float | str = blend if isinstance(blend, str) else float(blend)
        self.fallback = fallback if isinstance(fallback, FallbackTest) else FallbackTest(
            fallback if isinstance(fallback, str) else bool(fallback))
        self.seed = seed
        self.max_new_tokens = max_new_tokens
        self.calibrate_profile = bool(calibrate_profile)
        self._profiles: dict[int, PositionProfile] = {}

    @classmethod
    def from_settings(
        cls,
        generator: GeneratorLike | None,
        design: Design | str = "loo",
        outcome: Outcome | str | OutcomeFn = "question",
        *,
        budget: int | str | None = None,
        lam: float | None = None,
        head: int | None = None,
        surrogate: str | None = None,
        alpha: float | None = None,
        transform: str | None = None,
        stable_top: int | None = None,
        max_tied: int | None = None,
        fallback: bool | str | FallbackTest = "auto",
        fallback_alpha: float | None = None,
        min_spread: float | None = None,
        fallback_z: float | None = None,
        max_new_tokens: int = 16,
        **kwargs: Any,
    ) -> MoI:
        """An MoI from flat settings: the design's and the outcome's settings go to the objects that
        read them (a setting the chosen design or outcome does not read is ignored: a flat settings
        dict may name knobs of every design), the fallback thresholds to :class:`FallbackTest`, the
        rest (``profile``, ``placement``, ``blend``, ``seed``, ``calibrate_profile``) to :class:`MoI`.
        """
        knobs = {"budget": budget, "lam": lam, "head": head, "surrogate": surrogate, "alpha": alpha,
                 "transform": transform, "stable_top": stable_top}
        if isinstance(design, Design):
            d: Design = design_from_name(design, budget=budget)  # a budget beside an object is an error
        else:
            if design not in DESIGN_TYPES:
                raise ValueError(f"unknown design {design!r}; choose one of {tuple(DESIGN_TYPES)}")
            own = {f.name for f in dataclass_fields(DESIGN_TYPES[design])}
            d = design_from_name(design, **{k: v for k, v in knobs.items() if k in own})
        o = outcome_from_name(outcome, max_new_tokens=max_new_tokens, max_tied=max_tied)
        if not isinstance(fallback, FallbackTest):
            thresholds = {k: v for k, v in (("alpha", fallback_alpha), ("min_spread", min_spread),
                                            ("z_min", fallback_z)) if v is not None}
            fallback = FallbackTest(fallback if isinstance(fallback, str) else bool(fallback), **thresholds)
        return cls(generator, d, o, fallback=fallback, max_new_tokens=max_new_tokens, **kwargs)

    def profile_for(self, k: int) -> PositionProfile:
        """The profile used for ``k`` passages (given, or the model's own; memoised per ``k``)."""
        if k not in self._profiles:
            if self.profile is not None:
                if not self._profiles and self.generator is not None:
                    self.profile.check_generator(self.generator)  # warns once if measured for another model
                self._profiles[k] = self.profile.resized(k)
            elif self.generator is None:
                self._profiles[k] = PositionProfile.flat(k)
            else:
                self._profiles[k] = PositionProfile.for_generator(self.generator, k,
                                                                  calibrate=self.calibrate_profile, seed=self.seed)
        return self._profiles[k]

    def profiles_used(self) -> list[dict[str, Any]]:
        """Where each profile this MoI has used came from (:attr:`PositionProfile.provenance`), by ``k``."""
        return [self._profiles[k].provenance for k in sorted(self._profiles)]

    def blend_for(self, scores: Sequence[float] | None) -> float:
        """The blend weight ``β`` for one query: ``blend``, or with ``"auto"``
        :data:`RETRIEVER_BLEND` when the query has retriever scores and 0 when it has none."""
        if self.blend == "auto":
            return RETRIEVER_BLEND if scores is not None else 0.0
        return float(self.blend)

    @property
    def falls_back(self) -> bool:
        """Whether the per-query fallback is on (``"auto"``: unless the outcome reads the reference answers)."""
        if self.fallback.enabled == "auto":
            return not getattr(self.outcome, "needs_answers", False)
        return bool(self.fallback.enabled)

    def _rank(self, orderings: list[list[int]], values: np.ndarray, prof: PositionProfile,
              scores: Sequence[float] | None) -> tuple[np.ndarray, bool, dict[str, float], UtilityFit, np.ndarray]:
        """(utilities after the separation test and the blend, fell back?, test stats, fit, blended
        utilities before the fallback)."""
        fit = self.design.fit(orderings, values, prof, scores)
        fb = self.fallback
        ok, stats = separates(fit, alpha=fb.alpha, min_spread=fb.min_spread, z_min=fb.z_min)
        u = blend_with_retriever(fit.utilities, self.blend_for(scores), scores)
        if self.falls_back and not ok:
            return retriever_prior(prof.k, scores), True, stats, fit, u
        return u, False, stats, fit, u

    def _outcomes(self, qs: list[str], ps: list[list[Passage]], idx: list[int], orderings: dict[int, list[list[int]]],
                  answers_list: Sequence[Sequence[str]] | None) -> dict[int, OutcomeResult]:
        if not idx:
            return {}
        res = self.outcome(self.generator, [qs[i] for i in idx], [ps[i] for i in idx], [orderings[i] for i in idx],
                           None if answers_list is None else [list(answers_list[i] or []) for i in idx])
        return dict(zip(idx, res))

    def run(self, question: str, passages: Sequence[Passage | str], scores: Sequence[float] | None = None,
            answers: Sequence[str] | None = None, generate_answer: bool = True) -> MoIResult:
        """:meth:`run_batch` for one query."""
        return self.run_batch([question], [passages], None if scores is None else [scores],
                             None if answers is None else [answers], generate_answer)[0]

    def run_batch(
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
            Per query, optional retriever scores (the ridge prior and the blend's prior).
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
        # k = 1 needs no intervention: only queries with >= 2 passages go through the model
        active = [i for i, p in enumerate(ps) if len(p) > 1]
        profs = [self.profile_for(len(p)) for p in ps]
        scs = [None if scores_list is None else scores_list[i] for i in range(n)]
        orderings: dict[int, list[list[int]]] = {i: [[0]] for i in range(n) if i not in active}
        outs: dict[int, OutcomeResult] = {}
        ranked: dict[int, tuple[np.ndarray, bool, dict[str, float], UtilityFit, np.ndarray]] = {}
        rounds = dict.fromkeys(range(n), 1)
        if not self.design.adaptive:
            for i in active:
                orderings[i] = self.design.interventions(len(ps[i]), rng)
            outs = self._outcomes(qs, ps, active, orderings, answers_list)
            for i in active:
                ranked[i] = self._rank(orderings[i], np.asarray(outs[i].values, dtype=np.float64), profs[i], scs[i])
        else:
            self._run_adaptive(qs, ps, active, profs, scs, answers_list, rng, orderings, outs, ranked, rounds)
        results: list[MoIResult] = []
        for i, p in enumerate(ps):
            k = len(p)
            prof = profs[i]
            if i in ranked:
                o = outs[i]
                u, fell_back, stats, fit, _ = ranked[i]
                raw = np.asarray(fit.utilities)
                vals, ans, tgt, calls = np.asarray(o.values), o.answers, o.target, o.generator_calls
                est_w = fit.weights
            else:
                u, vals, ans, tgt, calls = np.zeros(1), np.zeros(1), [], None, 0
                fell_back, stats, est_w, raw = False, {}, None, None
            rank_idx = sorted(range(k), key=lambda j: (-float(u[j]), j))
            ranking = RankedList.from_scores(p, np.asarray(u).tolist(), query=Query(text=qs[i]))
            order = place(rank_idx, self.placement, prof.weights)
            reason = (separation_failure(stats, self.fallback.alpha, self.fallback.min_spread, self.fallback.z_min)
                      if fell_back else "")
            results.append(MoIResult(ranking=ranking, order=order, utilities=np.asarray(u),
                                     orderings=orderings[i], outcomes=vals, ordering_answers=list(ans),
                                     target=tgt, weights=prof.weights, generator_calls=int(calls),
                                     inputs=list(p), fallback=fell_back, fallback_reason=reason,
                                     fit_stats=dict(stats),
                                     rounds=rounds[i], estimated_weights=est_w, raw_utilities=raw))
        if generate_answer:
            # an ordering already run in the chosen order has its answer; the consensus answer is a
            # draft that greedy decoding of the final prompt is checked against (same answers, less work)
            reused = [reusable_answer(r.orderings, r.ordering_answers, r.order) for r in results]
            todo = [i for i, a in enumerate(reused) if a is None]
            finals = self.generator.answer([qs[i] for i in todo], [[ps[i][j] for j in results[i].order] for i in todo],
                                           max_new_tokens=self.max_new_tokens,
                                           drafts=[results[i].target for i in todo]) if todo else []
            for i, a in zip(todo, finals):
                results[i].answer = a
                results[i].generator_calls += 1
            for r, a in zip(results, reused):
                if a is not None:
                    r.answer = a
        return results

    def _run_adaptive(
        self,
        qs: list[str],
        ps: list[list[Passage]],
        active: list[int],
        profs: list[PositionProfile],
        scs: list[Sequence[float] | None],
        answers_list: Sequence[Sequence[str]] | None,
        rng: np.random.Generator,
        orderings: dict[int, list[list[int]]],
        outs: dict[int, OutcomeResult],
        ranked: dict[int, tuple[np.ndarray, bool, dict[str, float], UtilityFit, np.ndarray]],
        rounds: dict[int, int],
    ) -> None:
        """``budget="auto"``: rounds of interventions until the design's top-``stable_top`` is stable."""
        plan = {i: self.design.rounds(len(ps[i]), rng) for i in active}
        used = {i: 0 for i in active}
        tops: dict[int, list[int]] = {}
        pending = list(active)
        recompute = not getattr(self.outcome, "per_round", True)
        r = 0
        while pending:
            r += 1
            new: dict[int, list[list[int]]] = {}
            for i in pending:
                cands, first, step = plan[i]
                take = first if r == 1 else step
                new[i] = cands[used[i]:used[i] + take]
                used[i] += len(new[i])
                orderings[i] = orderings.get(i, []) + new[i]
            got = self._outcomes(qs, ps, pending, orderings if recompute else new, answers_list)
            still: list[int] = []
            for i in pending:
                if recompute or i not in outs:
                    prev_calls = outs[i].generator_calls if i in outs else 0
                    outs[i] = got[i]
                    outs[i].generator_calls += prev_calls
                else:
                    o = outs[i]
                    outs[i] = OutcomeResult(values=np.concatenate([np.asarray(o.values), np.asarray(got[i].values)]),
                                            answers=list(o.answers) + list(got[i].answers),
                                            target=got[i].target if got[i].target is not None else o.target,
                                            generator_calls=o.generator_calls + got[i].generator_calls)
                ranked[i] = self._rank(orderings[i], np.asarray(outs[i].values, dtype=np.float64), profs[i], scs[i])
                rounds[i] = r
                u = ranked[i][4]  # stability of the estimate itself, before any fallback
                top = sorted(range(len(u)), key=lambda j: (-float(u[j]), j))[: self.design.stable_top]
                stable = i in tops and tops[i] == top
                tops[i] = top
                if not stable and used[i] < len(plan[i][0]):
                    still.append(i)
            pending = still
