"""Consistency of a RAG system across paraphrases of the same question (Con-RAG metrics).

Hamman et al., "Improving Consistency in Retrieval-Augmented Systems with Group Similarity
Rewards" (NeurIPS 2025, arXiv 2510.04392) measure three levels over a paraphrase set
``Q = {q_1..q_n}`` of one question:

* retriever-level: ``C_ret = 2/(n(n-1)) Σ_{i<j} J(R_k(q_i), R_k(q_j))`` with
  ``J(A, B) = |A ∩ B| / |A ∪ B|`` the Jaccard index of the top-k id sets;
* generator-level: ``C_gen = 2/(n(n-1)) Σ_{i<j} sim(y_i, y_j)`` of the greedy outputs ``y_i`` for
  ``q_i`` with the passages held fixed (those retrieved for the original question);
* end-to-end: the same with the passages retrieved for each paraphrase.

``sim`` is symmetrised: ``(s(a, b) + s(b, a)) / 2`` with ``s`` one of the PS-GRPO similarities
of :mod:`ragkit.similarity` (default ``"bleu2"``: sentence BLEU-2 on SQuAD-normalised
tokens; ``"f1"``: token F1; ``"rougel"``). Identical non-empty outputs score 1; an empty output
agrees with nothing (0). Accuracy (EM/F1 of the original question's answer, and the mean over
paraphrases) is reported beside them. Every summary is a mean over paraphrase sets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from ragkit.eval.metrics import exact_match_max, f1_max
from ragkit.generation.base import generator_fingerprint
from ragkit.io import append_jsonl, progress, resume_appended_jsonl
from ragkit.types import QARecord, RankedList

__all__ = [
    "jaccard",
    "pairwise_mean",
    "output_similarity",
    "retriever_consistency",
    "generator_consistency",
    "end_to_end_consistency",
    "paraphrase_sets",
    "ConsistencyReport",
    "evaluate_consistency",
]

logger = logging.getLogger(__name__)


def jaccard(a: Sequence[str], b: Sequence[str]) -> float:
    """``|A ∩ B| / |A ∪ B|`` of two id collections (1.0 when both are empty)."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def pairwise_mean(items: Sequence[Any], sim: Callable[[Any, Any], float]) -> float:
    """Mean of ``sim`` over the unordered pairs of ``items`` (1.0 for fewer than two items)."""
    pairs = list(combinations(range(len(items)), 2))
    if not pairs:
        return 1.0
    return float(np.mean([sim(items[i], items[j]) for i, j in pairs]))


def _pair_sim(similarity: str | Callable[[Sequence[str], Sequence[str]], np.ndarray]) -> Callable[..., np.ndarray]:
    from ragkit.similarity import get_similarity

    return get_similarity(similarity)


def output_similarity(a: str, b: str, similarity: str = "bleu2") -> float:
    """Symmetrised similarity of two outputs: ``(s(a, b) + s(b, a)) / 2``."""
    f = _pair_sim(similarity)
    v = np.asarray(f([a, b], [b, a]), dtype=float)
    return float(v.mean())


def _ids(x: RankedList | Sequence[str], k: int | None) -> list[str]:
    ids = x.ids() if isinstance(x, RankedList) else list(x)
    return ids[:k] if k is not None else ids


def retriever_consistency(
    rankings: Sequence[Sequence[RankedList | Sequence[str]]], k: int | None = None
) -> float:
    """Mean over paraphrase sets of the mean pairwise Jaccard of the top-``k`` id sets.

    Parameters
    ----------
    rankings
        Per paraphrase set, one ranking (a ``RankedList`` or a list of ids) per paraphrase.
    k
        Cut each ranking to its first ``k`` ids (``None``: as given).
    """
    if not rankings:
        raise ValueError("retriever_consistency needs at least one paraphrase set")
    return float(np.mean([pairwise_mean([_ids(r, k) for r in s], jaccard) for s in rankings]))


def _set_consistency(outputs: Sequence[str], f: Callable[..., np.ndarray]) -> float:
    pairs = list(combinations(range(len(outputs)), 2))
    if not pairs:
        return 1.0
    hyps = [outputs[i] for i, j in pairs] + [outputs[j] for i, j in pairs]
    refs = [outputs[j] for i, j in pairs] + [outputs[i] for i, j in pairs]
    v = np.asarray(f(hyps, refs), dtype=float)
    return float(v.mean())


def generator_consistency(outputs: Sequence[Sequence[str]], similarity: str = "bleu2") -> float:
    """Mean over paraphrase sets of the mean pairwise (symmetrised) similarity of the outputs.

    ``outputs[s]`` are the greedy answers to the paraphrases of set ``s`` generated with the
    passages held fixed.
    """
    if not outputs:
        raise ValueError("generator_consistency needs at least one paraphrase set")
    f = _pair_sim(similarity)
    return float(np.mean([_set_consistency(list(o), f) for o in outputs]))


def end_to_end_consistency(outputs: Sequence[Sequence[str]], similarity: str = "bleu2") -> float:
    """Like :func:`generator_consistency`, for outputs generated with per-paraphrase retrieval."""
    return generator_consistency(outputs, similarity)


def paraphrase_sets(
    records: Sequence[QARecord], n: int = 4, source: str = "auto", generator: Any | None = None, seed: int = 0
) -> list[list[str]]:
    """Per record: ``[original, paraphrase_1, ..., paraphrase_n]``.

    ``source``: ``"data"`` (``metadata["paraphrases"]``), ``"rule"``
    (:class:`ragkit.paraphrase.RuleParaphraser`), ``"llm"``
    (:class:`~ragkit.paraphrase.LLMParaphraser` through ``generator``, screened by
    :class:`~ragkit.paraphrase.RewriteFilter`, the rule paraphraser filling in for rejected samples) or ``"auto"``
    (data when every record has paraphrases, else rule).
    """
    if n < 1:
        raise ValueError(f"n (paraphrases per question) must be >= 1, got {n}")
    if source == "auto":
        source = "data" if records and all(r.metadata.get("paraphrases") for r in records) else "rule"
    questions = [r.question for r in records]
    if source == "data":
        missing = [r.id for r in records if not r.metadata.get("paraphrases")]
        if missing:
            raise ValueError(f"{len(missing)} records have no metadata['paraphrases'] (e.g. {missing[0]!r}); "
                             "use --paraphraser rule")
        paras = [list(r.metadata["paraphrases"])[:n] for r in records]
    elif source in ("rule", "llm"):
        from ragkit import paraphrase as P

        if source == "rule":
            para = P.RuleParaphraser(seed=seed)
        else:
            if generator is None:
                raise ValueError("the LLM paraphraser needs a generator")
            para = P.LLMParaphraser(generator, seed=seed, rewrite_filter=P.RewriteFilter())
        paras = para.paraphrase(questions, n)
    else:
        raise ValueError(f"unknown paraphrase source {source!r}; use data, rule, llm or auto")
    return [[q, *[p for p in ps if p != q]] for q, ps in zip(questions, paras)]


@dataclass
class ConsistencyReport:
    """Result of :func:`evaluate_consistency` (means over paraphrase sets)."""

    retriever: float | None
    generator: float
    end_to_end: float | None
    em: float
    f1: float
    em_paraphrases: float
    f1_paraphrases: float
    n_sets: int
    similarity: str
    per_set: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "retriever_consistency": self.retriever,
            "generator_consistency": self.generator,
            "end_to_end_consistency": self.end_to_end,
            "em": self.em,
            "f1": self.f1,
            "em_paraphrases": self.em_paraphrases,
            "f1_paraphrases": self.f1_paraphrases,
            "n_sets": self.n_sets,
            "similarity": self.similarity,
            "per_set": self.per_set,
        }


def _evaluate_sets(generator: Any, records: Sequence[QARecord], paraphrases: Sequence[Sequence[str]],
                   retriever: Any | None, k: int, f: Callable[[list[str], list[str]], Any],
                   max_new_tokens: int) -> list[dict[str, Any]]:
    """Per-set entries of :func:`evaluate_consistency` for one chunk of sets."""
    flat_q = [q for ps in paraphrases for q in ps]
    owner = [i for i, ps in enumerate(paraphrases) for _ in ps]
    if retriever is not None:
        rl_orig = retriever.search([r.question for r in records], k=k)
        fixed = [rl.passages() for rl in rl_orig]
        rl_para = retriever.search(flat_q, k=k)
    else:
        fixed = [list(r.passages[:k]) for r in records]
        rl_para = None
    outs_fixed = generator.answer(flat_q, [fixed[i] for i in owner], max_new_tokens=max_new_tokens)
    outs_e2e = (
        generator.answer(flat_q, [rl.passages() for rl in rl_para], max_new_tokens=max_new_tokens)
        if rl_para is not None
        else None
    )
    per_set: list[dict[str, Any]] = []
    pos = 0
    for rec, ps in zip(records, paraphrases):
        sl = slice(pos, pos + len(ps))
        pos += len(ps)
        g_out = list(outs_fixed[sl])
        entry: dict[str, Any] = {
            "qid": rec.id,
            "paraphrases": list(ps),
            "outputs_fixed": g_out,
            "generator": _set_consistency(g_out, f),
            "em": exact_match_max(g_out[0], rec.answers) if rec.answers else float("nan"),
            "f1": f1_max(g_out[0], rec.answers) if rec.answers else float("nan"),
            "em_paraphrases": (float(np.mean([exact_match_max(o, rec.answers) for o in g_out]))
                               if rec.answers else float("nan")),
            "f1_paraphrases": float(np.mean([f1_max(o, rec.answers) for o in g_out])) if rec.answers else float("nan"),
        }
        if rl_para is not None and outs_e2e is not None:
            rls = list(rl_para[sl])
            e_out = list(outs_e2e[sl])
            entry["retrieved"] = [rl.ids() for rl in rls]
            entry["outputs_e2e"] = e_out
            entry["retriever"] = pairwise_mean([rl.ids() for rl in rls], jaccard)
            entry["end_to_end"] = _set_consistency(e_out, f)
        per_set.append(entry)
    return per_set


def evaluate_consistency(
    generator: Any,
    records: Sequence[QARecord],
    paraphrases: Sequence[Sequence[str]],
    retriever: Any | None = None,
    k: int = 5,
    similarity: str = "bleu2",
    max_new_tokens: int = 16,
    partial: str | os.PathLike[str] | None = None,
    resume: bool = True,
    chunk_sets: int = 10,
    show_progress: bool | None = None,
) -> ConsistencyReport:
    """Retriever-, generator- and end-to-end consistency with EM/F1 beside them.

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator`.
    records
        Questions with answers; without a retriever their own first ``k`` passages are the
        fixed passages (then retriever-level and end-to-end are not defined and reported as None).
    paraphrases
        Per record ``[original, p_1, ..., p_n]`` (see :func:`paraphrase_sets`).
    retriever
        An indexed :class:`ragkit.retrievers.Retriever` (``search(queries, k)``).
    partial
        JSONL file that makes the evaluation resumable: the sets are run ``chunk_sets`` at a time
        and each chunk's per-set entries are appended here (its first line fingerprints the
        settings, the sets and their wordings). A restarted evaluation with the same settings skips
        the sets already there; other settings raise ``ValueError`` (``resume=False`` starts over).
        ``None``: nothing written.
    resume
        Reuse ``partial``'s entries (``False``: delete the file first).
    chunk_sets
        Paraphrase sets per chunk: one retrieval call and one or two ``answer`` calls each.
    show_progress
        Progress bar over chunks (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).
    """
    if len(paraphrases) != len(records):
        raise ValueError(f"{len(records)} records but {len(paraphrases)} paraphrase sets")
    if chunk_sets < 1:
        raise ValueError(f"chunk_sets must be >= 1, got {chunk_sets}")
    f = _pair_sim(similarity)
    entries: dict[int, dict[str, Any]] = {}
    if partial is not None:
        fingerprint = {**generator_fingerprint(generator), "k": k, "similarity": similarity,
                       "max_new_tokens": max_new_tokens, "retriever": retriever is not None,
                       "sets": [[r.id, *ps] for r, ps in zip(records, paraphrases)]}
        for row in resume_appended_jsonl(partial, {"_consistency": fingerprint}, resume, key="_consistency"):
            i = row.pop("_set")
            entries[i] = row
        if entries:
            logger.info("resuming: %d of %d paraphrase sets already in %s", len(entries), len(records), partial)
    todo = [i for i in range(len(records)) if i not in entries]
    chunks = [todo[c: c + chunk_sets] for c in range(0, len(todo), chunk_sets)]
    for idx in progress(chunks, show=show_progress, desc="consistency", unit="chunk"):
        done = _evaluate_sets(generator, [records[i] for i in idx], [paraphrases[i] for i in idx], retriever, k, f,
                              max_new_tokens)
        entries.update(zip(idx, done))
        if partial is not None:
            append_jsonl(partial, [{"_set": i, **e} for i, e in zip(idx, done)])
    per_set = [entries[i] for i in range(len(records))]

    def mean(key: str) -> float:
        v = [e[key] for e in per_set if key in e and not np.isnan(e[key])]
        return float(np.mean(v)) if v else float("nan")

    return ConsistencyReport(
        retriever=mean("retriever") if retriever is not None else None,
        generator=mean("generator"),
        end_to_end=mean("end_to_end") if retriever is not None else None,
        em=mean("em"),
        f1=mean("f1"),
        em_paraphrases=mean("em_paraphrases"),
        f1_paraphrases=mean("f1_paraphrases"),
        n_sets=len(per_set),
        similarity=similarity,
        per_set=per_set,
    )
