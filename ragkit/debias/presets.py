"""Named rerankers and evaluation methods: one factory, one registry of presets.

A *method* is reranker -> placement -> answerer (:class:`Method`). :func:`get_reranker` builds a
reranker from a spec string (the shape of the ``rerankers`` library's ``Reranker()`` factory);
:func:`get_method` builds a method from a preset name. Names are checked by
:func:`resolve_method` / :func:`parse_reranker` before any model loads, so a typo is reported at
once with the valid names.

Rerankers (:func:`get_reranker`):

========================  ==========================================================================
spec                      reranker
========================  ==========================================================================
``none``                  :class:`~ragkit.debias.baselines.IdentityReranker` (retriever order)
``random``                :class:`~ragkit.debias.baselines.RandomReranker` (chance level, seeded)
``moi``                   :class:`~ragkit.debias.reranker.MoIReranker` with its default: leave-one-out
                          presence design, ``question`` outcome (query likelihood; k + 1 sequences),
                          chosen on HotpotQA train (:mod:`ragkit.debias.moi`)
``moi_cyclic``            MoI, cyclic design (M = k), ``consensus`` (the former default)
``moi_prior``             MoI, prior design (M = 3), ``consensus``
``moi_confidence``        MoI, cyclic design, ``confidence`` outcome
``moi_gold``              MoI, cyclic design, ``gold`` outcome (reads reference answers: an oracle)
``moi_loo``               MoI, leave-one-out presence design, ``full_answer`` outcome (k + 1 sequences)
``moi_loo_gold``          MoI, leave-one-out, ``gold`` outcome (labels; an oracle)
``moi_loo_q``             the same as ``moi``, under the name its published results carry
``moi_masked``            MoI, leave-one-out estimated from one prefill with each passage masked out
                          (:mod:`ragkit.debias.masked_loo`; about UPR's tokens, an approximation)
``upr``                   :class:`~ragkit.debias.upr.UPRReranker`: mean log p(question | one passage),
                          one sequence per passage (Sachan et al., EMNLP 2022)
``icr``                   :class:`~ragkit.debias.icr.ICRReranker`: calibrated query-to-passage attention,
                          two passes for all passages (Chen et al., ICLR 2025)
``moi_attn``              :class:`~ragkit.debias.attention_probe.AttentionProbeReranker`: a ridge probe over
                          per-head question-to-passage attention fitted to leave-one-out, one generator pass
                          (AT2, arXiv 2504.13752; ICR); option ``probe`` (default: the committed probe)
``student:PATH``          :class:`~ragkit.debias.student.DistilledReranker` saved by ``ragkit distill``
``cross-encoder:NAME``    :class:`~ragkit.debias.cross_encoder.CrossEncoderReranker` (folder or hub id)
``bi-encoder:NAME``       :class:`~ragkit.debias.bi_encoder.BiEncoderReranker` over a stock sentence-transformers
                          embedder (folder or hub id; ``all-MiniLM-L6-v2`` is the embedded default): cosine
                          of question and passage, what a bi-encoder student starts from
``llm:MODEL``             :class:`~ragkit.debias.llm_reranker.LLMReranker`: a causal LM's yes/no
                          relevance logit through its chat template (folder or hub id)
========================  ==========================================================================

Methods (:func:`get_method`; reranker, placement, answerer):

========================  ==========================================================================
name                      what it does
========================  ==========================================================================
``none``                  retriever order; answer once from it
``reverse``               reversed order (best last); ranking = retriever's
``both_ends``             lost-in-the-middle reorder (best first, 2nd last, ...); ranking = retriever's
``random``                a random permutation (seeded) as ranking and prompt order (chance level)
``voting``                greedy answer per cyclic rotation, majority answer; ranking = retriever's
``psc_borda``/``psc_rrf`` permutation self-consistency over the cyclic rotations; ranking = PSC's
``moi``...``moi_masked``  the MoI reranker of the same name, bias-aware placement, one answer
``upr`` / ``icr``         the reranker's ranking, ranking order, one answer
``moi_attn``              the attention probe's ranking, ranking order, one answer
``student:PATH``          the distilled student's ranking, ranking order, one answer
``cross-encoder:NAME``    a cross-encoder's ranking, ranking order, one answer
``bi-encoder:NAME``       an embedder's cosine ranking, ranking order, one answer
``llm:MODEL``             an LLM's yes/no relevance ranking, ranking order, one answer
========================  ==========================================================================

Placement baselines keep the retriever's ranking because they only move passages inside the
prompt; their effect shows in the answer metrics, not in MRR/recall.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.debias.answerers import Answerer, get_answerer
from ragkit.debias.baselines import IdentityReranker, RandomReranker
from ragkit.debias.masked_loo import masked_question_outcomes
from ragkit.debias.placement import check_placement, place
from ragkit.generation.base import GeneratorLike
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, as_passages

__all__ = [
    "METHOD_NAMES",
    "RERANKER_NAMES",
    "Preset",
    "PRESETS",
    "Method",
    "MethodOutput",
    "available_methods",
    "available_rerankers",
    "get_method",
    "get_reranker",
    "moi_settings",
    "parse_reranker",
    "resolve_method",
]

logger = logging.getLogger(__name__)

#: MoI presets: the default and the settings behind a documented result (other designs and budgets
#: are MoI settings: ``get_reranker("moi", gen, design="ablate", budget="auto")``).
_MOI_RERANKERS: dict[str, dict[str, Any]] = {
    "moi": {"design": "loo", "outcome": "question"},
    "moi_cyclic": {"design": "cyclic", "outcome": "consensus"},
    "moi_prior": {"design": "prior", "budget": 3, "outcome": "consensus"},
    "moi_confidence": {"design": "cyclic", "outcome": "confidence"},
    "moi_gold": {"design": "cyclic", "outcome": "gold"},
    "moi_loo": {"design": "loo", "outcome": "full_answer"},
    "moi_loo_gold": {"design": "loo", "outcome": "gold"},
    "moi_loo_q": {"design": "loo", "outcome": "question"},
    "moi_masked": {"design": "loo", "outcome": masked_question_outcomes},
}
_LM_RERANKERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # name: (module, class, settings it takes)
    "upr": ("ragkit.debias.upr", "UPRReranker", ()),
    "icr": ("ragkit.debias.icr", "ICRReranker", ("calibration_query", "n_std")),
    "moi_attn": ("ragkit.debias.attention_probe", "AttentionProbeReranker", ("probe",)),
}
RERANKER_NAMES: tuple[str, ...] = ("none", "random", *_MOI_RERANKERS, *_LM_RERANKERS)
"""Fixed reranker specs; the specs of ``_PATTERNS`` (``student:PATH``, ``cross-encoder:NAME``, ...) take an argument."""
_PATTERNS = ("student:PATH", "cross-encoder:NAME", "bi-encoder:NAME", "llm:MODEL")
_ARG_KINDS = ("student", "cross-encoder", "bi-encoder", "llm")
_ENCODER_KW = ("device", "batch_size", "max_length", "long_docs", "backend")


@dataclass(frozen=True)
class Preset:
    """A named method: reranker spec, placement and answerer name (see the module table)."""

    name: str
    reranker: str
    placement: str = "none"
    answerer: str = "single"
    description: str = ""

    @property
    def loads_encoder(self) -> bool:
        """Whether the reranker loads a model of its own (takes ``device`` / ``batch_size``)."""
        return parse_reranker(self.reranker)[0] in _ARG_KINDS


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("none", "none", "none", "single", "retriever order; answer once"),
    Preset("reverse", "none", "reverse", "single", "best passage last; answer once"),
    Preset("both_ends", "none", "both_ends", "single", "lost-in-the-middle reorder; answer once"),
    Preset("random", "random", "none", "single", "random order (chance level); answer once"),
    Preset("voting", "none", "none", "voting", "majority answer over the cyclic rotations"),
    Preset("psc_borda", "none", "none", "psc_borda", "permutation self-consistency, Borda"),
    Preset("psc_rrf", "none", "none", "psc_rrf", "permutation self-consistency, RRF"),
    Preset("upr", "upr", "none", "single", "UPR: question likelihood given each passage alone; answer once"),
    Preset("icr", "icr", "none", "single", "ICR: calibrated query-to-passage attention; answer once"),
    Preset("moi_attn", "moi_attn", "none", "single",
           "attention probe fitted to MoI leave-one-out, one generator pass; answer once"),
    *(Preset(n, n, "bias_aware", "single", f"MoI ({kw['design']} design, "
                                           f"{getattr(kw['outcome'], '__name__', kw['outcome'])} outcome)")
      for n, kw in _MOI_RERANKERS.items()),
)}
METHOD_NAMES: tuple[str, ...] = tuple(PRESETS)
"""The fixed method names (``student:PATH`` and ``cross-encoder:NAME`` take an argument)."""


def available_rerankers() -> list[str]:
    """Reranker specs :func:`get_reranker` accepts."""
    return [*RERANKER_NAMES, *_PATTERNS]


def available_methods() -> list[str]:
    """Method names :func:`get_method` accepts."""
    return [*METHOD_NAMES, *_PATTERNS]


def moi_settings(name: str) -> dict[str, Any]:
    """The :class:`~ragkit.debias.MoIReranker` settings of an MoI preset (a copy; ``{}`` for other names).

    ``moi_settings("moi")`` -> ``{"design": "loo", "outcome": "question"}``.
    """
    return dict(_MOI_RERANKERS.get(name, {}))


def parse_reranker(spec: str) -> tuple[str, str | None]:
    """Check a reranker spec without loading anything: ``(kind, argument)``.

    ``"moi_prior"`` -> ``("moi_prior", None)``; ``"student:DIR"`` -> ``("student", "DIR")`` (the
    folder must exist); ``"cross-encoder:NAME"`` -> ``("cross-encoder", "NAME")``.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a reranker spec is a string, got {type(spec).__name__}")
    kind, sep, arg = spec.partition(":")
    if not sep:
        if spec in RERANKER_NAMES:
            return spec, None
        raise ValueError(f"unknown reranker {spec!r}; choose one of {', '.join(available_rerankers())}")
    if kind not in _ARG_KINDS:
        raise ValueError(f"unknown reranker {spec!r}; choose one of {', '.join(available_rerankers())}")
    if not arg.strip():
        raise ValueError(f"{spec!r} names no model; write {kind}:PATH" if kind == "student"
                         else f"{spec!r} names no model; write {kind}:NAME (folder or hub id)")
    if kind == "student" and not Path(arg).is_dir():
        raise ValueError(f"{spec!r}: no such student folder {arg!r}; train one with `ragkit distill --out DIR`")
    return kind, arg


def resolve_method(name: str) -> Preset:
    """The preset behind a method name, checked without loading any model.

    Raises
    ------
    ValueError
        For an unknown name (the message lists the valid ones) or a bad ``student:``/``cross-encoder:``
        argument.
    """
    if name in PRESETS:
        return PRESETS[name]
    if isinstance(name, str) and ":" in name and name.partition(":")[0] in _ARG_KINDS:
        parse_reranker(name)
        return Preset(name, name, "none", "single", f"{name.partition(':')[0]} ranking; answer once")
    raise ValueError(f"unknown method {name!r}; choose one of {', '.join(available_methods())}")


def get_reranker(spec: str | Reranker, generator: GeneratorLike | None = None, **kwargs: Any) -> Reranker:
    """Build a reranker from a spec (see the module table); a :class:`Reranker` is returned as is.

    Parameters
    ----------
    spec
        ``"none"``, ``"random"``, ``"moi"`` (leave-one-out, ``question`` outcome), ``"moi_cyclic"``,
        ``"moi_prior"``, any other ``moi_*`` name of the module table, ``"student:PATH"``,
        ``"cross-encoder:NAME"``, ``"bi-encoder:NAME"`` or ``"llm:MODEL"``.
    generator
        The generator MoI rerankers run on (ignored by the others).
    **kwargs
        ``seed`` (random, MoI); any :class:`~ragkit.debias.MoIReranker` argument for MoI
        (``profile``, ``lam``, ``budget``, ``design``, ``max_new_tokens``, ...); ``device``,
        ``batch_size``, ``long_docs`` (:class:`~ragkit.debias.long_docs.LongDocs`) and ``backend``
        (``torch``, ``onnx``, ``onnx-int8``, ``openvino``) for ``student:`` and ``cross-encoder:``, ``max_length`` for
        ``cross-encoder:``; ``device``, ``dtype``, ``batch_size``, ``max_length``, ``long_docs`` and
        ``instruction`` for ``llm:``. A keyword the reranker does not take is an error naming it.
    """
    if isinstance(spec, Reranker):
        return spec
    kind, arg = parse_reranker(spec)
    kw = dict(kwargs)

    def reject(allowed: Sequence[str]) -> None:
        bad = sorted(set(kw) - set(allowed))
        if bad:
            raise TypeError(f"reranker {spec!r} takes no {', '.join(bad)}; it takes "
                            f"{', '.join(allowed) if allowed else 'no settings'}")

    if kind == "none":
        reject(())
        return IdentityReranker()
    if kind == "random":
        reject(("seed",))
        return RandomReranker(**kw)
    if kind in _MOI_RERANKERS:
        if generator is None:
            raise ValueError(f"reranker {spec!r} needs a generator; pass a ragkit.generation.Generator")
        from ragkit.debias.reranker import MoIReranker

        return MoIReranker(generator, **{**_MOI_RERANKERS[kind], **kw})
    if kind in _LM_RERANKERS:
        if generator is None:
            raise ValueError(f"reranker {spec!r} needs a generator; pass a ragkit.generation.Generator")
        import importlib

        module, cls, allowed = _LM_RERANKERS[kind]
        reject(allowed)
        return getattr(importlib.import_module(module), cls)(generator, **kw)
    assert arg is not None
    if kind == "student":
        from ragkit.debias.bi_encoder import BiEncoderReranker, is_bi_encoder_folder
        from ragkit.debias.student import DistilledReranker

        if is_bi_encoder_folder(arg):  # `ragkit distill --student bi-encoder`: cosine of the fine-tuned embedder
            reject(("device", "batch_size"))
            return BiEncoderReranker.load(arg, **kw)
        reject(("device", "batch_size", "long_docs", "backend"))  # max_length is the student's own, saved with it
        return DistilledReranker.load(arg, **kw)
    if kind == "bi-encoder":
        from ragkit.debias.bi_encoder import BiEncoderReranker

        reject(("device", "batch_size"))
        return BiEncoderReranker.from_pretrained(arg, **kw)
    if kind == "llm":
        from ragkit.debias.llm_reranker import LLMReranker

        reject(("device", "dtype", "batch_size", "max_length", "long_docs", "instruction"))
        return LLMReranker.from_pretrained(arg, **kw)
    from ragkit.debias.cross_encoder import CrossEncoderReranker

    reject(_ENCODER_KW)
    return CrossEncoderReranker.from_pretrained(arg, **kw)


@dataclass
class MethodOutput:
    """One query's result.

    Attributes
    ----------
    ranking
        Passages ranked best first; ``ranking.info`` is the reranker's cost and diagnostics
        (:class:`~ragkit.types.RankInfo`: ``fallback`` says whether it kept the input order).
    order
        Final prompt order (indices into the input passages; ``order[j]`` = passage at slot ``j``);
        only the passages that reach the prompt (``top_k`` or fewer with ``prune``).
    answer
        Final answer (``None`` when not generated).
    generator_calls
        Sequences sent through the generator for this query (reranking + answering).
    extra
        Method-specific details (MoI utilities and outcomes, per-ordering answers, ...).
    """

    ranking: RankedList
    order: list[int]
    answer: str | None = None
    generator_calls: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fallback(self) -> bool:
        """Whether the reranker fell back to the input order (``ranking.info.fallback``)."""
        return bool(self.ranking.info.fallback)


def _indices(ranking: RankedList, passages: list[Passage]) -> list[int]:
    """Input indices of a ranking's passages (by object, else by id)."""
    by_obj = {id(p): i for i, p in enumerate(passages)}
    by_id = {p.id: i for i, p in enumerate(passages)}
    out = []
    for h in ranking:
        i = by_obj.get(id(h.passage), by_id.get(h.passage.id))
        if i is None:
            raise RuntimeError(f"the reranker returned passage {h.passage.id!r}, which it was not given")
        out.append(i)
    if sorted(out) != list(range(len(passages))):
        raise RuntimeError("the reranker did not return each input passage exactly once")
    return out


class Method:
    """Reranker -> placement -> answerer, batched over queries.

    Parameters
    ----------
    reranker
        Any :class:`~ragkit.reranking.Reranker`.
    placement
        ``"none"``, ``"reverse"``, ``"both_ends"`` or ``"bias_aware"`` (:mod:`ragkit.debias.placement`).
    answerer
        An :class:`~ragkit.debias.answerers.Answerer` (``None``: rank and place only).
    profile
        Position profile for ``bias_aware``; default: the reranker's own (``MoIReranker.profile_for``).
    name
        Name in reports.
    top_k
        At most this many passages go into the prompt: the top ``top_k`` of the ranking, then placed
        (``None``: all of them). The retrieve-``N``, rerank, prompt-``K`` pipeline.

    Notes
    -----
    ``placement="prune"`` (after an MoI reranker with the ``loo`` design) keeps the top ``top_k``
    among the passages whose signed leave-one-out utility is not below zero, in ranking order
    (:func:`ragkit.debias.prune.prune`); the output's ``extra`` then holds ``abstain`` (no passage
    helps) and the ids of the ``harmful`` passages.
    """

    def __init__(self, reranker: Reranker, placement: str = "none", answerer: Answerer | None = None,
                 profile: Any = None, name: str | None = None, top_k: int | None = None) -> None:
        if not isinstance(reranker, Reranker):
            raise TypeError(f"reranker must be a ragkit Reranker, got {type(reranker).__name__}; "
                            "build one with ragkit.debias.get_reranker(spec)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1 (or None for all passages), got {top_k}")
        self.prune = placement == "prune"
        if self.prune and getattr(getattr(getattr(reranker, "moi", None), "design", None), "name", None) != "loo":
            raise ValueError("the prune placement keeps passages by their leave-one-out utility; use it after an "
                             "MoI reranker with the loo design (e.g. get_method('moi', gen, placement='prune'))")
        placement = "none" if self.prune else check_placement(placement)
        if placement == "bias_aware" and profile is None and not hasattr(reranker, "profile_for"):
            raise ValueError(f"bias_aware placement after a {type(reranker).__name__} needs a position "
                             "profile; pass profile=PositionProfile.load(FILE) (see `ragkit bias-profile`)")
        self.reranker = reranker
        self.placement = placement
        self.answerer = answerer
        self.profile = profile
        self.name = name or reranker.name
        self.top_k = top_k

    @property
    def needs_answers(self) -> bool:
        """Whether the reranker reads reference answers (pass ``answers`` to :meth:`run_many`)."""
        return bool(self.reranker.needs_answers)

    def _profile(self, k: int) -> Any:
        if self.placement != "bias_aware":
            return None
        return self.profile if self.profile is not None else self.reranker.profile_for(k)  # type: ignore[attr-defined]

    def profiles_used(self) -> list[dict[str, Any]]:
        """Where the position profiles used so far (placement's and the reranker's) came from.

        One entry per distinct profile: ``source`` (file, cache, calibrated, embedded, flat, given),
        the file's ``path`` and ``sha256`` when there is one, and its model, template and ``k``.
        """
        found: list[dict[str, Any]] = []
        if self.placement == "bias_aware" and self.profile is not None and hasattr(self.profile, "provenance"):
            found.append(self.profile.provenance)
        if hasattr(self.reranker, "profiles_used"):
            found.extend(self.reranker.profiles_used())
        out: list[dict[str, Any]] = []
        for p in found:
            if p not in out:
                out.append(p)
        return out

    def run_many(
        self,
        questions: Sequence[str | Query],
        passages: Sequence[Sequence[Passage | str]],
        scores: Sequence[Sequence[float] | None] | None = None,
        answers: Sequence[Sequence[str]] | None = None,
        generate_answer: bool = True,
        rankings: Sequence[RankedList] | None = None,
    ) -> list[MethodOutput]:
        """Rank, place and answer several queries (each step one batched call).

        Parameters
        ----------
        questions
            Question texts or :class:`Query` objects.
        passages
            Per query, the candidates in retriever order.
        scores
            Per query, optional retriever scores.
        answers
            Per query, reference answers; handed to the reranker only when it
            :attr:`needs_answers` (an oracle), never to the answerer.
        generate_answer
            Run the answerer (else the outputs have ``answer=None``).
        rankings
            Per query, a ranking of the same passages already computed by this reranker (with the
            same settings), e.g. by :meth:`rank_many` or by a method that differs from this one only
            in placement; the reranker is then not run and only placement and answering are. The
            rankings are used as given: a ranking of other settings gives another method's result.
        """
        queries, ps = self._inputs(questions, passages, answers)
        if generate_answer and self.answerer is None:
            raise ValueError(f"method {self.name!r} has no answerer; build it with a generator "
                             "(get_method(name, generator)) or pass generate_answer=False")
        if rankings is None:
            rankings = self._rank(queries, ps, scores)
        elif len(rankings) != len(queries):
            raise ValueError(f"{len(queries)} questions but {len(rankings)} precomputed rankings")
        return self._place_and_answer(queries, ps, list(rankings), generate_answer)

    def rank_many(
        self,
        questions: Sequence[str | Query],
        passages: Sequence[Sequence[Passage | str]],
        scores: Sequence[Sequence[float] | None] | None = None,
        answers: Sequence[Sequence[str]] | None = None,
    ) -> list[RankedList]:
        """The reranker's step of :meth:`run_many` alone: one ranking per query (arguments as there).

        ``run_many(..., rankings=rank_many(...))`` gives what ``run_many(...)`` gives; splitting
        the two lets a caller meter them apart or hand the rankings to a method that places them
        differently.
        """
        queries, ps = self._inputs(questions, passages, answers)
        return self._rank(queries, ps, scores)

    def _inputs(
        self,
        questions: Sequence[str | Query],
        passages: Sequence[Sequence[Passage | str]],
        answers: Sequence[Sequence[str]] | None,
    ) -> tuple[list[Query], list[list[Passage]]]:
        """The queries (with reference answers only for an oracle reranker) and passage lists, checked."""
        n = len(questions)
        if len(passages) != n:
            raise ValueError(f"{n} questions but {len(passages)} passage lists")
        if answers is not None and len(answers) != n:
            raise ValueError(f"{n} questions but {len(answers)} answer lists")
        queries = []
        for i, q in enumerate(questions):
            text = q.text if isinstance(q, Query) else str(q)
            gold = tuple(answers[i]) if answers is not None else (q.answers if isinstance(q, Query) else ())
            queries.append(Query(text=text, id=q.id if isinstance(q, Query) else "",
                                 answers=gold if self.needs_answers else ()))
        if self.needs_answers and not all(q.answers for q in queries):
            raise ValueError(f"method {self.name!r} ranks with the gold answers (an oracle); pass answers= "
                             "with at least one reference answer per question")
        return queries, [as_passages(p) for p in passages]

    def _rank(self, queries: list[Query], ps: list[list[Passage]],
              scores: Sequence[Sequence[float] | None] | None) -> list[RankedList]:
        rankings = self.reranker.rank_many(queries, ps, scores)
        if len(rankings) != len(queries):  # never zip a short answer away
            raise RuntimeError(f"{type(self.reranker).__name__} returned {len(rankings)} rankings "
                               f"for {len(queries)} queries")
        return rankings

    def _place_and_answer(self, queries: list[Query], ps: list[list[Passage]], rankings: list[RankedList],
                          generate_answer: bool) -> list[MethodOutput]:
        outs: list[MethodOutput] = []
        for q, p, rk in zip(queries, ps, rankings):
            idx = _indices(rk, p)
            extra = self._reranker_extra(rk)
            keep = idx if self.top_k is None else idx[: self.top_k]
            if self.prune:
                from ragkit.debias.prune import prune

                pr = prune(idx, extra["raw_utilities"], self.top_k or len(idx))
                keep = list(pr.selected)
                extra.update(abstain=pr.abstain, harmful=[p[i].id for i in pr.harmful])
            order = place(keep, self.placement, self._profile(len(keep)))
            outs.append(MethodOutput(ranking=rk.with_(query=q), order=order, generator_calls=rk.info.generator_calls,
                                     extra=extra))
        if generate_answer:
            assert self.answerer is not None
            placed = [[p[j] for j in o.order] for p, o in zip(ps, outs)]
            results = self.answerer.answer_many([q.text for q in queries], placed)
            for q, o, pl, r in zip(queries, outs, placed, results):
                o.answer = r.answer
                o.generator_calls += r.generator_calls
                if r.scores is not None:  # the answerer reranked (PSC) the placed passages; the rest follow
                    psc = RankedList.from_scores(pl, r.scores, q)
                    placed_ids = {id(x) for x in pl}
                    o.ranking = RankedList.from_scores(
                        [*psc.passages(), *(h.passage for h in o.ranking if id(h.passage) not in placed_ids)],
                        [float(-i) for i in range(len(o.ranking))], q, info=o.ranking.info)
                o.order = [o.order[j] for j in r.order]
                o.extra.update(r.extra)
        return outs

    def _reranker_extra(self, ranking: RankedList) -> dict[str, Any]:
        """The reranker's diagnostics a method output keeps in ``extra`` (from ``ranking.info``)."""
        d = ranking.info.details
        out: dict[str, Any] = {key: d[key] for key in ("utilities", "outcomes", "ordering_answers", "target")
                               if key in d}
        if not d:
            return out
        out["fallback"] = bool(ranking.info.fallback)
        if d.get("raw_utilities") is not None:
            raw = np.asarray(d["raw_utilities"], dtype=np.float64)
            out["raw_utilities"] = raw.tolist()
            if d.get("design") == "loo":
                # signed leave-one-out utilities: u_i < 0, the outcome is higher without passage i
                out["harmful_share"] = float(np.mean(~(raw >= 0)))
        return out


def get_method(name: str, generator: GeneratorLike | None = None, **kwargs: Any) -> Method:
    """Build a method from its preset name (see the module table; checked before any model loads).

    Parameters
    ----------
    name
        A name of :func:`available_methods` (``student:PATH``, ``cross-encoder:NAME`` included).
    generator
        The :class:`ragkit.generation.Generator` that answers (and that MoI runs on).
    **kwargs
        ``seed`` and ``max_new_tokens`` (all); ``placement`` and ``profile`` (the placement and
        its profile; ``placement="prune"`` after an MoI preset with the ``loo`` design keeps only
        passages with leave-one-out utility >= 0, :mod:`ragkit.debias.prune`); ``top_k`` (at most
        this many of the ranked passages go into the prompt); ``design``, ``budget``, ``rrf_k`` for
        ``voting``/``psc_*``; any MoI argument for ``moi*``; ``device``, ``batch_size``,
        ``max_length`` for ``student:``/``cross-encoder:``.
    """
    preset = resolve_method(name)
    kw = dict(kwargs)
    seed = kw.pop("seed", 0)
    mnt = kw.pop("max_new_tokens", 16)
    placement = kw.pop("placement", preset.placement)
    placement = placement if placement == "prune" else check_placement(placement)
    top_k = kw.pop("top_k", None)
    profile = kw.get("profile")
    if isinstance(profile, (str, Path)):  # a profile JSON (e.g. `ragkit eval --profile FILE`)
        from ragkit.debias.profile import PositionProfile

        profile = kw["profile"] = PositionProfile.load(profile)
    kind = parse_reranker(preset.reranker)[0]
    answerer_kw: dict[str, Any] = {"max_new_tokens": mnt}
    if preset.answerer != "single":
        answerer_kw["seed"] = seed
        answerer_kw.update({key: kw.pop(key) for key in ("design", "budget", "rrf_k") if key in kw})
    rr_kw = dict(kw)
    if kind in _MOI_RERANKERS:
        rr_kw.update(seed=seed, max_new_tokens=mnt)
    else:
        rr_kw.pop("profile", None)  # used by the placement only
        if kind == "random":
            rr_kw["seed"] = seed
    reranker = get_reranker(preset.reranker, generator, **rr_kw)
    answerer = get_answerer(preset.answerer, generator, **answerer_kw) if generator is not None else None
    return Method(reranker, placement, answerer, profile=profile, name=preset.name, top_k=top_k)
