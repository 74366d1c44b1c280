"""Named reranking/answering methods with one interface, for evaluation runners and benchmarks.

Every method takes questions with their passages in retriever order and returns, per query, a
:class:`MethodOutput`: a ranking of the passages, the final prompt order, the final answer and
the number of sequences sent through the generator.

========================  ==========================================================================
name                      what it does
========================  ==========================================================================
``none``                  retriever order; answer once from it
``reverse``               reversed order (best last); ranking = retriever's
``both_ends``             lost-in-the-middle reorder (best first, 2nd last, ...); ranking = retriever's
``random``                a random permutation (seeded) as ranking and prompt order (chance level)
``voting``                greedy answer per cyclic rotation, majority answer; ranking = retriever's
``psc_borda``/``psc_rrf`` permutation self-consistency over the cyclic rotations (see baselines)
``moi``                   MoI, cyclic design, ``consensus`` outcome, bias-aware placement
``moi_prior``             MoI, prior design (M = 3), ``consensus`` outcome
``moi_random``            MoI, random design (M = k), ``consensus`` outcome
``moi_confidence``        MoI, cyclic design, ``confidence`` outcome
``moi_gold``              MoI, cyclic design, ``gold`` outcome (needs reference answers; an oracle)
========================  ==========================================================================

Placement baselines keep the retriever's ranking because they only move passages inside the
prompt; their effect shows in the answer metrics, not in MRR/recall.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragkit.debias.baselines import both_ends_order, borda, per_ordering_rankings, reverse_order, rrf, vote
from ragkit.debias.designs import make_design
from ragkit.debias.moi import MoI
from ragkit.debias.outcomes import generate_per_ordering
from ragkit.types import Hit, Passage, Query, RankedList, as_passages

__all__ = ["METHOD_NAMES", "MethodOutput", "Method", "get_method"]

logger = logging.getLogger(__name__)

METHOD_NAMES = (
    "none", "reverse", "both_ends", "random", "voting", "psc_borda", "psc_rrf",
    "moi", "moi_prior", "moi_random", "moi_confidence", "moi_gold",
)


@dataclass
class MethodOutput:
    """One query's result.

    Attributes
    ----------
    ranking
        Passages ranked best first.
    order
        Final prompt order (indices into the input passages).
    answer
        Final answer (``None`` when not generated).
    generator_calls
        Sequences sent through the generator for this query.
    extra
        Method-specific details (utilities, per-ordering answers, ...).
    """

    ranking: RankedList
    order: list[int]
    answer: str | None = None
    generator_calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _retriever_ranking(q: str, ps: list[Passage], sc: Sequence[float] | None) -> RankedList:
    """The given order as a ranking (scores: the retriever's, or ``k − i``)."""
    k = len(ps)
    scores = [float(k - i) for i in range(k)] if sc is None else [float(x) for x in sc]
    return RankedList(tuple(Hit(p, s, i) for i, (p, s) in enumerate(zip(ps, scores))), Query(text=q))


class Method:
    """Base class: validate inputs, run, optionally answer once from each query's final order."""

    name = "method"

    def __init__(self, generator: Any, seed: int = 0, max_new_tokens: int = 16) -> None:
        self.generator = generator
        self.seed = seed
        self.max_new_tokens = max_new_tokens

    def run_many(
        self,
        questions: Sequence[str | Query],
        passages: Sequence[Sequence[Passage | str]],
        scores: Sequence[Sequence[float] | None] | None = None,
        answers: Sequence[Sequence[str]] | None = None,
        generate_answer: bool = True,
    ) -> list[MethodOutput]:
        """Run the method on several queries (all model work batched)."""
        qs = [q.text if isinstance(q, Query) else str(q) for q in questions]
        if len(passages) != len(qs):
            raise ValueError(f"{len(qs)} questions but {len(passages)} passage lists")
        if scores is not None and len(scores) != len(qs):
            raise ValueError(f"{len(qs)} questions but {len(scores)} score lists")
        if answers is not None and len(answers) != len(qs):
            raise ValueError(f"{len(qs)} questions but {len(answers)} answer lists")
        ps = [as_passages(p) for p in passages]
        for i, p in enumerate(ps):
            if not p:
                raise ValueError(f"query {i} ({qs[i]!r}) has no passages; pass at least one")
        sc = [None] * len(qs) if scores is None else list(scores)
        if generate_answer and self.generator is None:
            raise ValueError(f"method {self.name!r} needs a generator to answer")
        return self._run(qs, ps, sc, answers, generate_answer)

    def _run(self, qs: list[str], ps: list[list[Passage]], sc: list[Any],
             answers: Sequence[Sequence[str]] | None, generate_answer: bool) -> list[MethodOutput]:
        raise NotImplementedError

    def _answer(self, qs: list[str], ps: list[list[Passage]], outs: list[MethodOutput]) -> None:
        finals = self.generator.answer(qs, [[p[j] for j in o.order] for p, o in zip(ps, outs)],
                                       max_new_tokens=self.max_new_tokens)
        for o, a in zip(outs, finals):
            o.answer = a
            o.generator_calls += 1


class _Order(Method):
    """A fixed prompt order; answer once."""

    def __init__(self, generator: Any, kind: str, **kw: Any) -> None:
        super().__init__(generator, **kw)
        self.name = kind

    def _run(self, qs, ps, sc, answers, generate_answer):  # type: ignore[no-untyped-def]
        rng = np.random.default_rng(self.seed)
        outs = []
        for q, p, s in zip(qs, ps, sc):
            k = len(p)
            ranking = _retriever_ranking(q, p, s)
            if self.name == "none":
                order = list(range(k))
            elif self.name == "reverse":
                order = reverse_order(k)
            elif self.name == "both_ends":
                order = both_ends_order(list(range(k)))
            else:  # random
                order = rng.permutation(k).tolist()
                ranking = RankedList.from_scores([p[i] for i in order], [float(k - r) for r in range(k)],
                                                 Query(text=q))
            outs.append(MethodOutput(ranking=ranking, order=order))
        if generate_answer:
            self._answer(qs, ps, outs)
        return outs


class _Voting(Method):
    """Answer voting over the orderings of a design (default: the k cyclic rotations)."""

    name = "voting"

    def __init__(self, generator: Any, design: str = "cyclic", budget: int | None = None, **kw: Any) -> None:
        super().__init__(generator, **kw)
        self.design, self.budget = design, budget

    def _orderings(self, ps: list[list[Passage]]) -> list[list[list[int]]]:
        rng = np.random.default_rng(self.seed)
        return [make_design(self.design, len(p), self.budget, rng=rng) for p in ps]

    def _run(self, qs, ps, sc, answers, generate_answer):  # type: ignore[no-untyped-def]
        ods = self._orderings(ps)
        per = generate_per_ordering(self.generator, qs, ps, ods, self.max_new_tokens)
        outs = []
        for q, p, s, o, a in zip(qs, ps, sc, ods, per):
            outs.append(MethodOutput(ranking=_retriever_ranking(q, p, s), order=list(range(len(p))),
                                     answer=vote(a), generator_calls=len(o),
                                     extra={"ordering_answers": a}))
        return outs


class _PSC(_Voting):
    """Permutation self-consistency: aggregate per-ordering answer-support rankings (Borda / RRF)."""

    def __init__(self, generator: Any, agg: str = "borda", rrf_k: float = 60.0, **kw: Any) -> None:
        super().__init__(generator, **kw)
        if agg not in ("borda", "rrf"):
            raise ValueError(f"unknown aggregation {agg!r}; choose 'borda' or 'rrf'")
        self.agg, self.rrf_k = agg, rrf_k
        self.name = f"psc_{agg}"

    def _run(self, qs, ps, sc, answers, generate_answer):  # type: ignore[no-untyped-def]
        ods = self._orderings(ps)
        per = generate_per_ordering(self.generator, qs, ps, ods, self.max_new_tokens)
        outs = []
        for q, p, o, a in zip(qs, ps, ods, per):
            k = len(p)
            rks = per_ordering_rankings(a, p, o)
            agg = borda(rks, k) if self.agg == "borda" else rrf(rks, k, self.rrf_k)
            ranking = RankedList.from_scores(p, agg.tolist(), Query(text=q))
            order = sorted(range(k), key=lambda i: (-float(agg[i]), i))
            outs.append(MethodOutput(ranking=ranking, order=order, generator_calls=len(o),
                                     extra={"ordering_answers": a, "scores": agg.tolist()}))
        if generate_answer:
            self._answer(qs, ps, outs)
        return outs


class _MoI(Method):
    """Mixture-of-Intervention (:class:`ragkit.debias.MoI`)."""

    def __init__(self, generator: Any, name: str = "moi", **moi_kw: Any) -> None:
        seed = moi_kw.get("seed", 0)
        mnt = moi_kw.get("max_new_tokens", 16)
        super().__init__(generator, seed=seed, max_new_tokens=mnt)
        self.name = name
        self.moi = MoI(generator, **moi_kw)

    def _run(self, qs, ps, sc, answers, generate_answer):  # type: ignore[no-untyped-def]
        res = self.moi.run_many(qs, ps, sc, answers, generate_answer=generate_answer)
        return [MethodOutput(ranking=r.ranking, order=r.order, answer=r.answer, generator_calls=r.generator_calls,
                             extra={"utilities": r.utilities.tolist(), "outcomes": np.asarray(r.outcomes).tolist(),
                                    "ordering_answers": r.ordering_answers, "target": r.target})
                for r in res]


_MOI_PRESETS: dict[str, dict[str, Any]] = {
    "moi": {"design": "cyclic", "outcome": "consensus"},
    "moi_prior": {"design": "prior", "budget": 3, "outcome": "consensus"},
    "moi_random": {"design": "random", "outcome": "consensus"},
    "moi_confidence": {"design": "cyclic", "outcome": "confidence"},
    "moi_gold": {"design": "cyclic", "outcome": "gold"},
}


def get_method(name: str, generator: Any, **kwargs: Any) -> Method:
    """Build a method by name (see the module table); ``kwargs`` override its settings.

    MoI methods accept :class:`~ragkit.debias.MoI`'s arguments (``profile``, ``lam``, ``budget``,
    ``placement``, ...); ``voting``/``psc_*`` accept ``design`` and ``budget``; all accept
    ``seed`` and ``max_new_tokens``.
    """
    if name in ("none", "reverse", "both_ends", "random"):
        return _Order(generator, name, **kwargs)
    if name == "voting":
        return _Voting(generator, **kwargs)
    if name in ("psc_borda", "psc_rrf"):
        return _PSC(generator, agg=name[4:], **kwargs)
    if name in _MOI_PRESETS:
        return _MoI(generator, name=name, **{**_MOI_PRESETS[name], **kwargs})
    raise ValueError(f"unknown method {name!r}; choose one of {METHOD_NAMES}")
