"""The generator's contract toward the rest of ragkit: :class:`ScoreResult` and :class:`GeneratorLike`.

Debiasing (MoI outcomes, baselines), evaluation and training need only what
:class:`GeneratorLike` lists; they type their ``generator`` arguments with it, so any object with
these members (the local :class:`ragkit.generation.Generator`, a remote one) plugs in.

:func:`metered` measures the model work done inside a block (forward passes, prefilled and
decoded tokens) for the caller alone: the meters live in a :class:`contextvars.ContextVar`, so
two threads (e.g. two ``arank_many`` calls on one reranker) each count only their own forwards.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from ragkit.types import Passage

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.generation.prompts import PromptTemplate

__all__ = [
    "ScoreResult", "OrderingRun", "GeneratorLike", "Cost", "SHARE_KEYS", "metered", "charge", "generator_fingerprint",
]


SHARE_KEYS: tuple[str, ...] = ("forwards", "tokens_prefilled", "tokens_generated", "seconds")
"""The keys of :meth:`Cost.per_item`'s ledger."""


@dataclass
class Cost:
    """Model work counted by :func:`metered`: forward passes, prompt tokens prefilled (non-padding
    tokens of multi-token forwards) and tokens decoded (single-token forwards)."""

    forward_passes: int = 0
    tokens_prefilled: int = 0
    tokens_generated: int = 0

    def per_item(self, n: int, seconds: float) -> dict[str, float]:
        """This work and ``seconds`` of wall time, shared equally over the ``n`` items of one batched call.

        The items of a batched call (questions, contexts) share its forwards, so their own costs
        are not separable; each gets the mean, and the shares of a call sum to its totals.
        """
        n = max(1, int(n))
        work = (self.forward_passes, self.tokens_prefilled, self.tokens_generated)
        return dict(zip(SHARE_KEYS, (*(round(w / n, 2) for w in work), round(seconds / n, 4)), strict=True))


_METERS: contextvars.ContextVar[tuple[Cost, ...]] = contextvars.ContextVar("ragkit_cost_meters", default=())


@contextmanager
def metered() -> Iterator[Cost]:
    """Count the model work of the block in a fresh :class:`Cost` (nested meters all count)."""
    cost = Cost()
    token = _METERS.set((*_METERS.get(), cost))
    try:
        yield cost
    finally:
        _METERS.reset(token)


def charge(forward_passes: int = 0, tokens_prefilled: int = 0, tokens_generated: int = 0) -> None:
    """Add model work to every meter open in the current context (a no-op outside :func:`metered`)."""
    for cost in _METERS.get():
        cost.forward_passes += forward_passes
        cost.tokens_prefilled += tokens_prefilled
        cost.tokens_generated += tokens_generated


@dataclass(frozen=True)
class ScoreResult:
    """Teacher-forced log-probabilities of ``n`` answers.

    Attributes
    ----------
    sum
        ``(n,)`` total log-probability ``log p(y | x)`` of each answer.
    mean
        ``(n,)`` mean per-token log-probability (``sum / num_tokens``).
    token_logprobs
        ``n`` arrays with the log-probability of every answer token.
    num_tokens
        ``(n,)`` number of answer tokens.
    """

    sum: np.ndarray
    mean: np.ndarray
    token_logprobs: list[np.ndarray]
    num_tokens: np.ndarray

    @classmethod
    def from_token_logprobs(cls, token_logprobs: Sequence[np.ndarray]) -> ScoreResult:
        """Build a result from per-answer token log-probability arrays."""
        tl = [np.asarray(t, dtype=np.float64) for t in token_logprobs]
        num = np.array([len(t) for t in tl], dtype=np.int64)
        s = np.array([float(t.sum()) for t in tl], dtype=np.float64)
        mean = np.where(num > 0, s / np.maximum(num, 1), 0.0)
        return cls(sum=s, mean=mean, token_logprobs=tl, num_tokens=num)

    def __len__(self) -> int:
        return len(self.token_logprobs)


@dataclass
class OrderingRun:
    """One query's orderings run once: each ordering's answer and the scores of candidate answers.

    Attributes
    ----------
    answers
        ``M`` greedy answers (after :meth:`Generator.clean_answer`), one per ordering.
    scores
        One :class:`ScoreResult` (``M`` entries) per candidate round asked for; an ordering that a
        round skipped (empty candidate) has an empty ``token_logprobs`` entry and mean 0.
    candidates
        The rounds that were scored: per round, ``M`` answer strings (``""``: not scored).
    """

    answers: list[str]
    scores: list[ScoreResult] = field(default_factory=list)
    candidates: list[list[str]] = field(default_factory=list)


CandidateFn = Callable[[int, list[str]], Sequence["str | Sequence[str]"]]
"""``f(query_index, answers) -> rounds``: the answers to score under every ordering of a query,
given its ``M`` generated answers; each round is one string (for every ordering) or ``M`` strings."""


@runtime_checkable
class GeneratorLike(Protocol):
    """What debias, eval and training use of a generator (see :class:`ragkit.generation.Generator`)."""

    name: str
    template: PromptTemplate
    tokenizer: Any
    model: Any
    batch_size: int
    max_length: int

    def build_prompt(self, question: str, passages: Sequence[Passage | str]) -> str:
        """The full prompt, ending where the answer begins."""
        ...

    def split_prompt(self, question: str, passages: Sequence[Passage | str]) -> tuple[str, str]:
        """``(prefix, suffix)`` with an order-independent prefix."""
        ...

    def score(self, prompts: Sequence[str], answers: Sequence[str]) -> ScoreResult:
        """Teacher-forced ``log p(answer | prompt)``."""
        ...

    def score_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        answers: Sequence[str | Sequence[str]],
        template: PromptTemplate | None = None,
    ) -> list[ScoreResult]:
        """Answers scored under several passage orderings per question (shared prefix reused;
        ``template``: lay the prompts out with it instead of the generator's own)."""
        ...

    def run_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        candidates: CandidateFn | None = None,
        max_new_tokens: int = 16,
        stop: Sequence[str] | None = None,
        min_new_tokens: int = 0,
    ) -> list[OrderingRun]:
        """Each ordering's greedy answer, then ``candidates(q, answers)`` scored under every ordering
        (:func:`ragkit.generation.layout.run_orderings_by_parts` is the generic implementation; the
        local generator needs one prefill per ordering; ``min_new_tokens``: EOS forbidden for the first
        steps, as in :meth:`generate`)."""
        ...

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 32,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        n: int = 1,
        seed: int = 0,
        top_p: float = 1.0,
        min_new_tokens: int = 0,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt (greedy or nucleus sampling)."""
        ...

    def answer(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        max_new_tokens: int = 32,
        drafts: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Greedy short answers (``drafts``: a likely answer per question that the generator may
        verify instead of decoding; the answers are the same)."""
        ...

    def clean_answer(self, text: str) -> str:
        """The answer inside a completion."""
        ...


def generator_fingerprint(generator: Any) -> dict[str, Any]:
    """What of a generator decides its outputs, for the fingerprint of a resumable run's partial file:
    its name, passage cut and prompt template (read with ``getattr``: any :class:`GeneratorLike`)."""
    return {"model": str(getattr(generator, "name", "generator")),
            "passage_max_tokens": getattr(generator, "passage_max_tokens", None),
            "template": getattr(getattr(generator, "template", None), "name", None)}
