"""Outcomes of passage orderings for Mixture-of-Intervention, batched across orderings and queries.

Every outcome is a teacher-forced log-prob; the shared instruction + question prefix is computed
once per query (Lee et al., NAACL Findings 2025, arXiv 2412.10684). An "ordering"
(intervention) lists distinct passage indices in prompt order and may hold any subset of the
passages (presence designs leave some out).

Cost floor: the answer-based label-free outcomes run the generator's ``run_orderings``
(:class:`~ragkit.generation.base.GeneratorLike`); the local generator prefills each ordering once,
generates its greedy answer from that cache, and scores the consensus answer (or each ordering's
own answer) as a continuation of the same cache: ``M`` orderings cost the shared prefix once plus
each ordering's own tokens. A generator without a cache to share (a remote server) runs the
generic :func:`ragkit.generation.layout.run_orderings_by_parts` (``generate``, then ``score``),
which gives the same numbers up to float error; the tests hold the two to each other.

- ``gold``: mean log-prob of the reference answer under each ordering (the best over the
  reference aliases); an oracle for calibration and distillation labels.
- ``consensus`` (label-free default): a greedy short answer per ordering (one batched
  ``generate``); the consensus answer is the majority of normalised answers; ties are broken by
  the mean, over all orderings, of each tied candidate's mean log-prob (every tied candidate is
  scored, at most ``max_tied`` of them, earliest-seen first); the outcome is the consensus
  answer's mean log-prob under each ordering.
- ``confidence``: the mean log-prob of each ordering's own greedy answer under that ordering.
- ``full_answer`` (label-free, for presence designs): the greedy answer of the full prompt (all
  passages, given order) generated once, then its mean log-prob under each intervention, so a
  design of ``M`` interventions costs ``M + 1`` sequences sharing the prompt prefix. This is the
  label-free outcome of leave-one-out context attribution (AttriBoT, Liu et al. 2024,
  arXiv 2411.15102) and ContextCite (Cohen-Wang et al. 2024, arXiv 2409.00729), which attribute
  the model's own response to the context.
- ``question`` (label-free, needs no answer): the question's mean log-prob after the passages of
  each intervention, in a prompt that asks for the question the passages answer
  (:class:`ragkit.generation.QuestionPromptTemplate`; query likelihood, UPR: Sachan et al.,
  EMNLP 2022, arXiv 2204.07496). It does not depend on the generator answering correctly, and a
  design of ``M`` interventions costs ``M`` sequences (no generation).

``generator_calls`` counts the sequences sent through the model (one per generated answer, one
per scored (ordering, answer) pair).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from ragkit.generation.base import GeneratorLike
from ragkit.text import normalize_answer
from ragkit.types import Passage

__all__ = [
    "OUTCOMES",
    "Outcome",
    "Question",
    "Consensus",
    "Confidence",
    "FullAnswer",
    "Gold",
    "OUTCOME_TYPES",
    "outcome_from_name",
    "OutcomeResult",
    "generate_per_ordering",
    "majority_answer",
    "best_candidate",
    "gold_outcomes",
    "consensus_outcomes",
    "confidence_outcomes",
    "full_answer_outcomes",
    "question_outcomes",
    "compute_outcomes",
    "reusable_answer",
]

logger = logging.getLogger(__name__)

OUTCOMES = ("consensus", "gold", "confidence", "full_answer", "question")

OutcomeFn = Callable[..., list["OutcomeResult"]]


@dataclass
class OutcomeResult:
    """Outcomes of one query's ``M`` orderings.

    Attributes
    ----------
    values
        ``(M,)`` outcome per ordering (mean log-prob, larger is better).
    answers
        Each ordering's greedy answer (label-free outcomes) or ``[]``.
    target
        The answer whose log-prob was scored for ``consensus``/``gold`` (``None`` otherwise).
    generator_calls
        Sequences sent through the model for this query.
    """

    values: np.ndarray
    answers: list[str] = field(default_factory=list)
    target: str | None = None
    generator_calls: int = 0


def _norm(s: str) -> str:
    return normalize_answer(s)


def reusable_answer(orderings: Sequence[Sequence[int]], answers: Sequence[str], order: Sequence[int]) -> str | None:
    """The answer already generated for ``order`` when it is one of the orderings run, else ``None``.

    Per-ordering answers are greedy with the same template stops as
    :meth:`ragkit.generation.Generator.answer`, which only differs by forbidding EOS as the first
    token: an empty answer (possibly that EOS) is never reused.
    """
    target = [int(i) for i in order]
    for o, a in zip(orderings, answers):
        if [int(i) for i in o] == target and a and a.strip():
            return a
    return None


def generate_per_ordering(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    max_new_tokens: int = 16,
) -> list[list[str]]:
    """Greedy short answers for every (query, ordering), batched across orderings and queries
    (``run_orderings``: each query's shared prompt prefix is computed once); answer voting and
    permutation self-consistency call this."""
    runs = generator.run_orderings(questions, passages, orderings, None, max_new_tokens=max_new_tokens)
    return [list(r.answers) for r in runs]


def majority_answer(answers: Sequence[str]) -> tuple[list[str], Counter[str]]:
    """Majority vote over normalised answers.

    Returns the tied top candidates (one raw representative per normalised answer, the first
    seen, in order of first appearance) and the vote counts. Empty answers do not vote unless
    every answer is empty.
    """
    norm = [_norm(a) for a in answers]
    votes = Counter(n for n, a in zip(norm, answers) if a.strip() and n)
    if not votes:
        return [], votes
    top = max(votes.values())
    reps: dict[str, str] = {}
    for n, a in zip(norm, answers):
        if votes.get(n, 0) == top and n not in reps:
            reps[n] = a
    return list(reps.values()), votes


def gold_outcomes(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]],
) -> list[OutcomeResult]:
    """``gold``: best mean log-prob over the reference aliases, per ordering (one batched call)."""
    qs, ps, ods, ans, owner = [], [], [], [], []
    for i, (q, p, o, refs) in enumerate(zip(questions, passages, orderings, answers)):
        refs = [r for r in (refs or []) if r and r.strip()]
        if not refs:
            raise ValueError(f"the 'gold' outcome needs a reference answer; query {i} ({q!r}) has none")
        for r in dict.fromkeys(refs):
            qs.append(q)
            ps.append(p)
            ods.append(o)
            ans.append(r)
            owner.append(i)
    res = generator.score_orderings(qs, ps, ods, ans)
    best: list[np.ndarray | None] = [None] * len(questions)
    target: list[str | None] = [None] * len(questions)
    calls = [0] * len(questions)
    for i, r, a in zip(owner, res, ans):
        m = np.asarray(r.mean, dtype=np.float64)
        calls[i] += m.shape[0]
        if best[i] is None or m.mean() > best[i].mean():  # type: ignore[union-attr]
            target[i] = a
        best[i] = m if best[i] is None else np.maximum(best[i], m)  # type: ignore[arg-type]
    return [OutcomeResult(values=b, target=t, generator_calls=c)  # type: ignore[arg-type]
            for b, t, c in zip(best, target, calls)]


def best_candidate(scored: Sequence[tuple[str, np.ndarray]]) -> tuple[str, np.ndarray]:
    """The consensus pick among tied candidates: the highest mean over the orderings of its mean
    log-prob (the first seen on ties)."""
    return max(scored, key=lambda t: float(t[1].mean()))  # max() keeps the first on ties


def consensus_outcomes(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]] | None = None,
    max_new_tokens: int = 16,
    max_tied: int = 3,
) -> list[OutcomeResult]:
    """``consensus``: score the majority answer under every ordering (see the module docstring).

    One ``run_orderings`` call: each ordering's answer, then the tied majority answers (at most
    ``max_tied``) scored under every ordering; ``M`` generated plus ``M`` scored sequences per
    tied candidate.
    """
    del answers  # label-free

    def tied_of(q: int, outs: list[str]) -> list[str]:
        return majority_answer(outs)[0][:max(1, max_tied)]

    runs = generator.run_orderings(questions, passages, orderings, tied_of, max_new_tokens=max_new_tokens)
    out: list[OutcomeResult] = []
    for i, run in enumerate(runs):
        M = len(orderings[i])
        scored = [(rnd[0], np.asarray(r.mean, dtype=np.float64)) for rnd, r in zip(run.candidates, run.scores)]
        calls = M + M * len(scored)
        if not scored:
            logger.warning("query %d: every ordering produced an empty answer; outcomes carry no signal", i)
            out.append(OutcomeResult(values=np.zeros(M), answers=list(run.answers), target=None,
                                     generator_calls=calls))
            continue
        best_a, best_v = best_candidate(scored)
        out.append(OutcomeResult(values=best_v, answers=list(run.answers), target=best_a, generator_calls=calls))
    return out


def confidence_outcomes(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]] | None = None,
    max_new_tokens: int = 16,
) -> list[OutcomeResult]:
    """``confidence``: each ordering's own greedy answer, scored under that ordering.

    An empty answer gets the lowest outcome seen for that query (it carries no confidence). One
    ``run_orderings`` call (the local generator takes a greedy answer's log-probs from its own
    decode steps).
    """
    del answers  # label-free

    def own(q: int, outs: list[str]) -> list[list[str]]:
        return [[a if a.strip() else "" for a in outs]]

    runs = generator.run_orderings(questions, passages, orderings, own, max_new_tokens=max_new_tokens)
    res: list[OutcomeResult] = []
    for i, run in enumerate(runs):
        keep = [m for m, a in enumerate(run.answers) if a.strip()]
        v = np.full(len(orderings[i]), np.nan)
        if keep:
            v[keep] = np.asarray(run.scores[0].mean, dtype=np.float64)[keep]
        v = np.zeros_like(v) if np.all(np.isnan(v)) else np.where(np.isnan(v), np.nanmin(v), v)
        res.append(OutcomeResult(values=v, answers=list(run.answers), target=None,
                                 generator_calls=len(orderings[i]) + len(keep)))
    return res


def full_answer_outcomes(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]] | None = None,
    max_new_tokens: int = 16,
) -> list[OutcomeResult]:
    """``full_answer``: the full prompt's greedy answer, scored under every intervention.

    The full prompt holds all passages in the given order; its answer is generated once per query
    (:meth:`Generator.answer`, one batched call) and then scored under each intervention with
    :meth:`Generator.score_orderings` (shared prefix once): ``M + 1`` sequences. A query whose full
    answer is empty gets zero outcomes (no signal) and a warning.
    """
    finals = generator.answer(list(questions), [list(p) for p in passages], max_new_tokens=max_new_tokens)
    live = [i for i, a in enumerate(finals) if a.strip()]
    res = generator.score_orderings([questions[i] for i in live], [passages[i] for i in live],
                                    [orderings[i] for i in live], [finals[i] for i in live]) if live else []
    vals = {i: np.asarray(r.mean, dtype=np.float64) for i, r in zip(live, res)}
    out: list[OutcomeResult] = []
    for i, o in enumerate(orderings):
        M = len(o)
        if i not in vals:
            logger.warning("query %d: the full prompt's answer is empty; outcomes carry no signal", i)
        out.append(OutcomeResult(values=vals.get(i, np.zeros(M)), answers=[], target=finals[i] or None,
                                 generator_calls=1 + (M if i in vals else 0)))
    return out


def question_outcomes(
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]] | None = None,
    **kwargs: Any,
) -> list[OutcomeResult]:
    """``question``: ``(1/|q|) log p(q | passages of intervention m)`` for every intervention ``m``.

    The generator is used with :func:`ragkit.generation.question_template` of its own template
    (same model, tokenizer and passage fitting; the question is the scored continuation), through
    :meth:`Generator.score_orderings` (shared prefix, one batched call): ``M`` sequences per query.
    ``answers`` and the generation settings in ``kwargs`` are accepted for a uniform signature.
    """
    from ragkit.generation.prompts import question_template

    del answers, kwargs
    res = generator.score_orderings(list(questions), [list(p) for p in passages], orderings, list(questions),
                                    template=question_template(generator.template))
    return [OutcomeResult(values=np.asarray(r.mean, dtype=np.float64), answers=[], target=None,
                          generator_calls=len(o)) for r, o in zip(res, orderings)]


@dataclass(frozen=True)
class Outcome:
    """One MoI outcome as an object: calling it runs the outcome on a batch of queries.

    ``outcome(generator, questions, passages, orderings, answers) -> list[OutcomeResult]``, the
    signature a plain function outcome has too. Class attributes: ``name``; ``needs_answers``
    (reads the reference answers: an oracle); ``per_round`` (``False`` when its values depend on
    every intervention run so far, so an adaptive budget recomputes them each round).
    """

    name: ClassVar[str] = ""
    needs_answers: ClassVar[bool] = False
    per_round: ClassVar[bool] = True

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        raise NotImplementedError


@dataclass(frozen=True)
class Question(Outcome):
    """``question``: the question's mean log-prob after each intervention's passages (:func:`question_outcomes`)."""

    name: ClassVar[str] = "question"

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        return question_outcomes(generator, questions, passages, orderings)


@dataclass(frozen=True)
class Consensus(Outcome):
    """``consensus``: the majority answer's mean log-prob under each ordering (:func:`consensus_outcomes`;
    answers of ``max_new_tokens``, at most ``max_tied`` tied answers scored). Its target depends on
    every intervention, so an adaptive budget recomputes it each round."""

    name: ClassVar[str] = "consensus"
    per_round: ClassVar[bool] = False
    max_new_tokens: int = 16
    max_tied: int = 3

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        return consensus_outcomes(generator, questions, passages, orderings, max_new_tokens=self.max_new_tokens,
                                  max_tied=self.max_tied)


@dataclass(frozen=True)
class Confidence(Outcome):
    """``confidence``: each ordering's own greedy answer's mean log-prob (:func:`confidence_outcomes`)."""

    name: ClassVar[str] = "confidence"
    max_new_tokens: int = 16

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        return confidence_outcomes(generator, questions, passages, orderings, max_new_tokens=self.max_new_tokens)


@dataclass(frozen=True)
class FullAnswer(Outcome):
    """``full_answer``: the full prompt's greedy answer scored under each intervention
    (:func:`full_answer_outcomes`)."""

    name: ClassVar[str] = "full_answer"
    max_new_tokens: int = 16

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        return full_answer_outcomes(generator, questions, passages, orderings, max_new_tokens=self.max_new_tokens)


@dataclass(frozen=True)
class Gold(Outcome):
    """``gold``: the reference answer's best mean log-prob over its aliases (:func:`gold_outcomes`; an oracle)."""

    name: ClassVar[str] = "gold"
    needs_answers: ClassVar[bool] = True

    def __call__(self, generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                 orderings: Sequence[Sequence[Sequence[int]]],
                 answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
        if answers is None:
            raise ValueError("the 'gold' outcome needs reference answers (answers_list); "
                             "use outcome='question' (the default) for label-free reranking")
        return gold_outcomes(generator, questions, passages, orderings, answers)


OUTCOME_TYPES: dict[str, type[Outcome]] = {o.name: o for o in (Question, Consensus, Confidence, FullAnswer, Gold)}
"""Outcome classes by name (the names of :data:`OUTCOMES`)."""


def outcome_from_name(name: str | Outcome | OutcomeFn, **settings: Any) -> Outcome | OutcomeFn:
    """The outcome object of a name with those of ``settings`` (``max_new_tokens``, ``max_tied``) it
    takes; an :class:`Outcome` or a function is returned as is."""
    if not isinstance(name, str):
        if not callable(name):
            raise ValueError(f"unknown outcome {name!r}; choose one of {OUTCOMES} or pass a callable")
        return name
    if name not in OUTCOME_TYPES:
        raise ValueError(f"unknown outcome {name!r}; choose one of {OUTCOMES} or pass a callable")
    cls = OUTCOME_TYPES[name]
    own = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in settings.items() if k in own and v is not None})


def compute_outcomes(
    kind: str | OutcomeFn,
    generator: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[Sequence[str]] | None = None,
    **settings: Any,
) -> list[OutcomeResult]:
    """Run an outcome given by name (with ``settings``: ``max_new_tokens``, ``max_tied``), as an
    :class:`Outcome` object, or as a function with the same signature (synthetic oracles in tests,
    other outcome definitions)."""
    return outcome_from_name(kind, **settings)(generator, questions, passages, orderings, answers)
