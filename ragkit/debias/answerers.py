"""Answerers: the last step of reranker -> placement -> answerer.

An answerer gets, per query, the passages in their prompt order (after placement) and returns
one answer, batched over queries (one ``generate`` call for all queries and orderings):

- ``single`` (:class:`SingleAnswerer`): one greedy answer from the placed prompt.
- ``voting`` (:class:`VotingAnswerer`): one greedy answer per ordering of a design over the placed
  passages (default: the ``k`` cyclic rotations, the placed order first), then the majority
  answer over normalised forms (:func:`ragkit.debias.baselines.vote`; Lee et al., arXiv
  2412.10684, report it as the strongest simple alternative to MoI).
- ``psc`` (:class:`PSCAnswerer`): permutation self-consistency (Tang et al., "Found in the
  Middle: Permutation Self-Consistency Improves Listwise Ranking in Large Language Models", NAACL
  2024): each ordering's answer ranks the passages by answer support
  (:func:`ragkit.debias.baselines.per_ordering_rankings`), the rankings are aggregated with Borda
  ``B(p) = Σ_m (k − 1 − r_m(p))`` or RRF ``Σ_m 1 / (c + r_m(p) + 1)``, and one final greedy
  answer is read from the passages in aggregated order. Its aggregated ranking is returned too
  (:attr:`AnswerResult.scores`), so PSC also reranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragkit.debias.baselines import borda, per_ordering_rankings, rrf, vote
from ragkit.debias.designs import PERMUTATION_DESIGNS, make_design
from ragkit.debias.outcomes import generate_per_ordering
from ragkit.generation.base import GeneratorLike
from ragkit.types import Passage

__all__ = ["ANSWERERS", "AnswerResult", "Answerer", "SingleAnswerer", "VotingAnswerer", "PSCAnswerer",
           "get_answerer"]

ANSWERERS: tuple[str, ...] = ("single", "voting", "psc_borda", "psc_rrf")


@dataclass
class AnswerResult:
    """One query's answer.

    Attributes
    ----------
    answer
        The final answer.
    order
        Indices (into the passages the answerer was given) of the prompt the final answer was read
        from; ``range(k)`` when the given order was used.
    generator_calls
        Sequences sent through the generator for this query.
    scores
        Per given passage, a score that reranks them (PSC's aggregate), else ``None``.
    extra
        Per-ordering answers and other details.
    """

    answer: str
    order: list[int]
    generator_calls: int
    scores: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Answerer(ABC):
    """Base class: :meth:`answer_many` validates, :meth:`_answer_many` answers.

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator` (anything with ``answer``, ``generate``,
        ``build_prompt`` and ``clean_answer``).
    max_new_tokens
        Answer length cap.
    """

    name = "answerer"

    def __init__(self, generator: GeneratorLike, max_new_tokens: int = 16) -> None:
        if generator is None:
            raise ValueError(f"the {self.name!r} answerer needs a generator; pass a ragkit.generation.Generator")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.generator = generator
        self.max_new_tokens = int(max_new_tokens)

    def answer_many(self, questions: Sequence[str], passages: Sequence[Sequence[Passage]]) -> list[AnswerResult]:
        """Answer each question from its passages, given in prompt order (all queries batched)."""
        qs = [str(q) for q in questions]
        if len(qs) != len(passages):
            raise ValueError(f"{len(qs)} questions but {len(passages)} passage lists")
        ps = [list(p) for p in passages]
        for q, p in zip(qs, ps):
            if not p:
                raise ValueError(f"no passages to answer {q!r} from; pass at least one")
        return self._answer_many(qs, ps) if qs else []

    @abstractmethod
    def _answer_many(self, questions: list[str], passages: list[list[Passage]]) -> list[AnswerResult]:
        """Answer validated inputs."""

    def _greedy(self, questions: list[str], passages: list[list[Passage]]) -> list[str]:
        return self.generator.answer(questions, passages, max_new_tokens=self.max_new_tokens)


class SingleAnswerer(Answerer):
    """One greedy answer from the placed prompt (one sequence per query)."""

    name = "single"

    def _answer_many(self, questions: list[str], passages: list[list[Passage]]) -> list[AnswerResult]:
        answers = self._greedy(questions, passages)
        return [AnswerResult(a, list(range(len(p))), 1) for a, p in zip(answers, passages)]


class VotingAnswerer(Answerer):
    """Majority answer over the orderings of a design (default: the ``k`` cyclic rotations).

    Parameters
    ----------
    generator, max_new_tokens
        As in :class:`Answerer`.
    design
        A permutation design of :func:`ragkit.debias.designs.make_design` (``cyclic``, ``prior``,
        ``random``); orderings are over the placed passages, so the placed order comes first.
    budget
        Number of orderings ``M`` (default: the design's).
    seed
        Seed of a random design.
    """

    name = "voting"

    def __init__(self, generator: GeneratorLike, max_new_tokens: int = 16, design: str = "cyclic",
                 budget: int | None = None, seed: int = 0) -> None:
        super().__init__(generator, max_new_tokens)
        if design not in PERMUTATION_DESIGNS:
            raise ValueError(f"{self.name} needs a permutation design, got {design!r}; "
                             f"choose one of {', '.join(PERMUTATION_DESIGNS)}")
        if budget is not None and budget < 1:
            raise ValueError(f"budget (number of orderings) must be >= 1, got {budget}")
        self.design, self.budget, self.seed = design, budget, int(seed)

    def orderings(self, passages: list[list[Passage]]) -> list[list[list[int]]]:
        """Each query's orderings (indices into its placed passages)."""
        rng = np.random.default_rng(self.seed)
        return [make_design(self.design, len(p), self.budget, rng=rng) for p in passages]

    def _per_ordering(self, questions: list[str], passages: list[list[Passage]]
                      ) -> tuple[list[list[list[int]]], list[list[str]]]:
        ods = self.orderings(passages)
        return ods, generate_per_ordering(self.generator, questions, passages, ods, self.max_new_tokens)

    def _answer_many(self, questions: list[str], passages: list[list[Passage]]) -> list[AnswerResult]:
        ods, per = self._per_ordering(questions, passages)
        return [AnswerResult(vote(a), list(range(len(p))), len(o), extra={"ordering_answers": a})
                for p, o, a in zip(passages, ods, per)]


class PSCAnswerer(VotingAnswerer):
    """Permutation self-consistency: aggregate per-ordering answer-support rankings, answer once.

    Parameters
    ----------
    generator, max_new_tokens, design, budget, seed
        As in :class:`VotingAnswerer`.
    agg
        ``"borda"`` or ``"rrf"``.
    rrf_k
        The RRF constant ``c``.
    """

    def __init__(self, generator: GeneratorLike, max_new_tokens: int = 16, agg: str = "borda", rrf_k: float = 60.0,
                 design: str = "cyclic", budget: int | None = None, seed: int = 0) -> None:
        if agg not in ("borda", "rrf"):
            raise ValueError(f"unknown aggregation {agg!r}; choose 'borda' or 'rrf'")
        self.name = f"psc_{agg}"
        super().__init__(generator, max_new_tokens, design=design, budget=budget, seed=seed)
        self.agg, self.rrf_k = agg, float(rrf_k)

    def _answer_many(self, questions: list[str], passages: list[list[Passage]]) -> list[AnswerResult]:
        ods, per = self._per_ordering(questions, passages)
        results: list[AnswerResult] = []
        for p, o, a in zip(passages, ods, per):
            k = len(p)
            rks = per_ordering_rankings(a, p, o)
            agg = borda(rks, k) if self.agg == "borda" else rrf(rks, k, self.rrf_k)
            order = sorted(range(k), key=lambda i: (-float(agg[i]), i))
            results.append(AnswerResult("", order, len(o), scores=agg.tolist(), extra={"ordering_answers": a}))
        finals = self._greedy(questions, [[p[i] for i in r.order] for p, r in zip(passages, results)])
        for r, f in zip(results, finals):
            r.answer = f
            r.generator_calls += 1
        return results


def get_answerer(name: str | Answerer, generator: GeneratorLike | None = None, **kwargs: Any) -> Answerer:
    """Build an answerer by name: ``single``, ``voting``, ``psc_borda``, ``psc_rrf`` (or ``psc``).

    ``kwargs`` go to the answerer (``max_new_tokens``; ``design``, ``budget``, ``seed`` for voting
    and PSC; ``rrf_k`` for PSC). An :class:`Answerer` instance is returned as is.
    """
    if isinstance(name, Answerer):
        return name
    if name == "single":
        return SingleAnswerer(generator, **kwargs)
    if name == "voting":
        return VotingAnswerer(generator, **kwargs)
    if name in ("psc", "psc_borda", "psc_rrf"):
        return PSCAnswerer(generator, agg="rrf" if name == "psc_rrf" else "borda", **kwargs)
    raise ValueError(f"unknown answerer {name!r}; choose one of {', '.join(ANSWERERS)}")
