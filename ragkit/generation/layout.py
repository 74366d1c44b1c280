"""Prompt layout of passage orderings, and the generic one-pass-per-ordering run: no torch.

:func:`ordering_prompts` lays out the prompt of every ordering of a query's passages (the
passages fitted once per query, so every ordering shows the same passage texts);
:func:`ordering_inputs` pairs them with the answers to score; :func:`per_query` cuts flat results
back into queries. They read only a generator's prompt settings (:class:`PromptSettings`), so the
local :class:`~ragkit.generation.Generator` and the HTTP :class:`~ragkit.generation.RemoteGenerator`
share them.

:func:`run_orderings_by_parts` is the generic :meth:`~ragkit.generation.base.GeneratorLike.run_orderings`
built from ``generate`` and ``score`` alone (a remote server has no key/value cache to share);
the local generator overrides it with one prefill per ordering
(:func:`ragkit.generation.scoring.run_orderings`), which gives the same answers and scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ragkit.generation.base import CandidateFn, OrderingRun, ScoreResult
from ragkit.generation.fitting import fit_passages
from ragkit.types import Passage, as_passages

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.generation.base import GeneratorLike
    from ragkit.generation.prompts import PromptTemplate

__all__ = ["PromptSettings", "ordering_prompts", "ordering_inputs", "per_query", "candidate_rounds",
           "run_orderings_by_parts"]


class PromptSettings(Protocol):
    """What laying out a generator's prompts needs: its tokenizer, template and length limits."""

    tokenizer: Any
    template: PromptTemplate
    max_length: int
    answer_reserve: int
    passage_max_tokens: int | None


def ordering_prompts(gen: PromptSettings, questions: Sequence[str],
                     passages: Sequence[Sequence[Passage | str]],
                     orderings: Sequence[Sequence[Sequence[int]]],
                     template: PromptTemplate | None = None) -> list[list[str]]:
    """Per query, the full prompt of each ordering (passages fitted once per query, order-free).

    An ordering lists distinct passage indices; it may hold any subset (``[]``: no passages).
    ``template`` replaces the generator's own (e.g. :func:`ragkit.generation.question_template`).
    """
    tmpl = gen.template if template is None else template
    n = len(questions)
    if not (len(passages) == len(orderings) == n):
        raise ValueError(f"got {n} questions, {len(passages)} passage lists and {len(orderings)} ordering lists; "
                         "pass one of each per query")
    out: list[list[str]] = []
    for q in range(n):
        ps = as_passages(passages[q])
        orders = [list(map(int, o)) for o in orderings[q]]
        if not orders:
            raise ValueError(f"query {q} has no orderings; pass at least one ordering")
        for m, o in enumerate(orders):
            if any(i < 0 or i >= len(ps) for i in o) or len(set(o)) != len(o):
                raise ValueError(f"ordering {m} of query {q} ({o}) must list distinct passage indices "
                                 f"in [0, {len(ps)})")
        texts = fit_passages(gen.tokenizer, tmpl, questions[q], ps, max_length=gen.max_length,
                             answer_reserve=gen.answer_reserve, passage_max_tokens=gen.passage_max_tokens)
        out.append([tmpl.build(questions[q], [ps[i] for i in o], gen.tokenizer, [texts[i] for i in o])
                    for o in orders])
    return out


def ordering_inputs(
    gen: PromptSettings,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage | str]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[str | Sequence[str]],
    template: PromptTemplate | None = None,
) -> tuple[list[list[str]], list[list[str]]]:
    """Per query, the prompt of each ordering (:func:`ordering_prompts`) and the answer scored under it.

    ``answers[q]`` is one string (scored under every ordering of query ``q``) or one per ordering.
    """
    n = len(questions)
    if not (len(passages) == len(orderings) == len(answers) == n):
        raise ValueError(
            f"score_orderings() got {n} questions, {len(passages)} passage lists, {len(orderings)} "
            f"ordering lists and {len(answers)} answers; pass one of each per query")
    prompts = ordering_prompts(gen, questions, passages, orderings, template)
    ans: list[list[str]] = []
    for q in range(n):
        a = answers[q]
        if isinstance(a, str):
            ans.append([a] * len(prompts[q]))
        else:
            a = list(a)
            if len(a) != len(prompts[q]):
                raise ValueError(f"query {q} has {len(prompts[q])} orderings but {len(a)} answers; "
                                 "pass one answer string or one answer per ordering")
            ans.append(a)
    return prompts, ans


def per_query(token_logprobs: Sequence[np.ndarray], sizes: Sequence[int]) -> list[ScoreResult]:
    """Flat per-answer token log-probs cut into one :class:`ScoreResult` per query (``sizes[q]`` rows each)."""
    out, off = [], 0
    for size in sizes:
        out.append(ScoreResult.from_token_logprobs(token_logprobs[off:off + size]))
        off += size
    return out


def candidate_rounds(cands: Sequence[str | Sequence[str]], m: int, q: int) -> list[list[str]]:
    """A :data:`~ragkit.generation.base.CandidateFn`'s rounds as ``m`` answers each (one string: for all)."""
    out: list[list[str]] = []
    for j, c in enumerate(cands):
        if isinstance(c, str):
            out.append([c] * m)
        else:
            c = [str(x) for x in c]
            if len(c) != m:
                raise ValueError(f"candidate round {j} of query {q} has {len(c)} answers for {m} orderings")
            out.append(c)
    return out


def run_orderings_by_parts(
    gen: GeneratorLike,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage | str]],
    orderings: Sequence[Sequence[Sequence[int]]],
    candidates: CandidateFn | None = None,
    max_new_tokens: int = 16,
    stop: Sequence[str] | None = None,
    min_new_tokens: int = 0,
) -> list[OrderingRun]:
    """:meth:`~ragkit.generation.base.GeneratorLike.run_orderings` from ``generate`` and ``score``.

    Each ordering's prompt is generated from once (greedy, the template's stop strings unless
    ``stop``), its answer cleaned with ``clean_answer``; then ``candidates(q, answers)`` names the
    answers to score under every ordering of query ``q`` (``""``: skip), each scored with one
    ``score`` call over all of them. Two passes over every prompt, where the local generator's
    own implementation needs one; the answers and scores are the same.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = ordering_prompts(gen, questions, passages, orderings)
    stops = [s for s in (stop if stop is not None else gen.template.stop) if s]
    flat = [p for ps in prompts for p in ps]
    outs = (gen.generate(flat, max_new_tokens=max_new_tokens, stop=stops or None, min_new_tokens=min_new_tokens)
            if flat else [])
    runs: list[OrderingRun] = []
    off = 0
    for ps in prompts:
        runs.append(OrderingRun(answers=[gen.clean_answer(str(o)) for o in outs[off:off + len(ps)]]))
        off += len(ps)
    if candidates is None:
        return runs
    todo: list[tuple[int, int, int, str]] = []
    for q, run in enumerate(runs):
        run.candidates = candidate_rounds(candidates(q, list(run.answers)), len(prompts[q]), q)
        for j, rnd in enumerate(run.candidates):
            todo += [(q, m, j, c) for m, c in enumerate(rnd) if c.strip()]
    lps: dict[tuple[int, int, int], np.ndarray] = {}
    if todo:
        res = gen.score([prompts[q][m] for q, m, _, _ in todo], [c for _, _, _, c in todo])
        lps = {(q, m, j): r for (q, m, j, _), r in zip(todo, res.token_logprobs)}
    for q, run in enumerate(runs):
        for j, rnd in enumerate(run.candidates):
            run.scores.append(ScoreResult.from_token_logprobs(
                [lps.get((q, m, j), np.empty(0)) for m in range(len(rnd))]))
    return runs
