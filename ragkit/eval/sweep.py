"""Position sweep ("lost in the middle") of a generator.

Protocol of Liu et al., "Lost in the Middle: How Language Models Use Long Contexts"
(TACL 2024): for each NQ-open question, the gold passage is put at slot ``g`` of ``k``
(``g ∈ {0, k/4, k/2, 3k/4, k-1}``) among ``k-1`` distractors that contain no answer alias of
the question. The distractors are gold passages of OTHER questions (drawn once per question
with a seeded generator and shared by every slot and every ``k``, so that only the position of
the gold passage changes; the ``k=10`` distractors are the first 9 of the ``k=20`` ones).

Two outcomes per (question, k, slot):

* best-subspan EM of the greedy answer (:func:`ragkit.eval.metrics.best_subspan_em`);
* the gold answer's mean per-token log-probability ``(1/|a|) Σ_t log p(a_t | x, a_<t)``
  under teacher forcing (first alias), which moves smoothly with position even for small models.

Anchors: closed-book (no passages) and oracle (gold passage only). Summary per ``k``: the curve,
the worst slot, the best−worst gap of each outcome, and the mean per-question spread

    spread = (1/Q) Σ_q ( max_g o_{q,g} − min_g o_{q,g} ),

which, unlike the gap of the slot means, is not a best-minus-worst pick over noisy means.

With ``permutations = P`` the same ``k`` passages (gold and distractors) are also shown in ``P``
seeded random orders, and the summary gains the permutation sensitivity rate: the share of
questions whose normalised greedy answer is not the same in all ``P`` orders (Stable-RAG,
arXiv 2601.02993).

Cost: a question's contexts of one ``k`` are orderings of the same ``k`` passages, so they run as
one query of :meth:`~ragkit.generation.Generator.run_orderings`: the prompt prefix they share (the
instruction, the question and, between two slots, the distractors before the earlier one) is
computed once, each context's rest once, and the gold answer is scored as a continuation of the
context's own cache. The greedy answers are those of ``answer`` and the log-probs those of
``score``, up to float error, at about half the prefill of answering and scoring each context
apart. Each per-question row carries ``cost``: its chunk's model work (forwards, tokens prefilled
and generated, counted by :func:`ragkit.generation.base.metered`) and wall seconds shared equally
over the chunk's contexts (one batched call, whose contexts' own costs are not separable), so a
question's cost is the sum of its rows and :attr:`SweepResult.cost` the run's total.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragkit.eval.metrics import best_subspan_em
from ragkit.generation.base import SHARE_KEYS, generator_fingerprint, metered
from ragkit.io import append_jsonl, progress, resume_appended_jsonl
from ragkit.text import normalize_answer
from ragkit.types import Passage, QARecord

__all__ = ["SweepResult", "default_slots", "draw_distractors", "position_sweep"]

logger = logging.getLogger(__name__)


def default_slots(k: int) -> list[int]:
    """``sorted({0, k//4, k//2, 3k//4, k-1})`` (0-based slots)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return sorted({0, k // 4, k // 2, (3 * k) // 4, k - 1})


def _gold_passage(rec: QARecord) -> Passage | None:
    gold = set(rec.gold_ids)
    for p in rec.passages:
        if p.id in gold:
            return p
    return None


def _contains_alias(text: str, aliases: Sequence[str]) -> bool:
    t = normalize_answer(text)
    return any(a and a in t for a in (normalize_answer(x) for x in aliases))


def draw_distractors(
    record: QARecord, pool: Sequence[QARecord], n: int, rng: np.random.Generator
) -> list[Passage]:
    """``n`` distinct gold passages of other records that contain no answer alias of ``record``.

    Raises ``ValueError`` when the pool has fewer than ``n`` such passages.
    """
    cands: list[Passage] = []
    own = _gold_passage(record)
    seen: set[str] = set()
    for other in pool:
        if other.id == record.id:
            continue
        p = _gold_passage(other)
        if p is None or p.id in seen or (own is not None and p.text == own.text):
            continue
        if _contains_alias(p.contents, record.answers):
            continue
        seen.add(p.id)
        cands.append(p)
    if len(cands) < n:
        raise ValueError(
            f"question {record.id!r}: only {len(cands)} answer-free distractors in the pool, {n} needed; "
            "use more records (a larger distractor pool) or a smaller k"
        )
    idx = rng.choice(len(cands), size=n, replace=False)
    return [cands[int(i)] for i in idx]


@dataclass
class SweepResult:
    """Outcome of :func:`position_sweep`.

    ``rows``: one dict per (setting, k, slot) with ``subspan_em`` and ``logprob`` means;
    ``per_question``: the raw values, with the context's ``passage_ids`` in prompt order and the
    ``gold_id``; ``summary``: per k the worst slot and best−worst gaps; ``per_question_metrics``:
    per k and question id, the values the summary averages (``subspan_em`` and ``logprob``: means
    over the gold slots; ``subspan_em_spread`` and ``logprob_spread``: ``max − min`` over the slots,
    NaN with fewer than two; ``psr``: 1.0 when the greedy answer changed across the random orders,
    NaN without permutations), so that a study pairs questions across models without recomputing them;
    ``cost``: the summed ledger of the per-question rows (``contexts``: rows with a ledger; rows
    resumed from a partial file written before rows carried one have ``cost`` None and are not counted).
    """

    model: str
    n_questions: int
    k_values: list[int]
    slots: dict[int, list[int]]
    rows: list[dict[str, Any]]
    per_question: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    per_question_metrics: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "model": self.model,
            "n_questions": self.n_questions,
            "k_values": self.k_values,
            "slots": {str(k): v for k, v in self.slots.items()},
            "rows": self.rows,
            "summary": self.summary,
            "config": self.config,
            "per_question": self.per_question,
            "per_question_metrics": {str(k): v for k, v in self.per_question_metrics.items()},
            "cost": self.cost,
        }

    def row(self, setting: str, k: int | None = None, slot: int | None = None) -> dict[str, Any]:
        """The row of a setting (``"closed_book"``, ``"oracle"``, ``"slot"``) and k/slot."""
        for r in self.rows:
            if r["setting"] == setting and r.get("k") == k and r.get("slot") == slot:
                return r
        raise KeyError((setting, k, slot))

    def plot(self, path: str | os.PathLike[str]) -> str:
        """Two-panel PNG: best-subspan EM and mean gold log-prob against the gold slot (1-based)."""
        from ragkit.eval.plots import _plt
        from ragkit.io import save_figure

        plt = _plt()
        fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4), layout="constrained")
        cb = self.row("closed_book")
        orc = self.row("oracle")
        panels = ((axes[0], "subspan_em", "best-subspan EM"), (axes[1], "logprob", "gold answer mean log-prob"))
        for ax, key, label in panels:
            for i, k in enumerate(self.k_values):
                rs = [self.row("slot", k, s) for s in self.slots[k]]
                ax.plot([r["slot"] + 1 for r in rs], [r[key] for r in rs], marker="o", color=f"C{i}", label=f"k={k}")
            ax.axhline(cb[key], linestyle="--", color="gray", label="closed-book")
            ax.axhline(orc[key], linestyle=":", color="black", label="oracle")
            ax.set_xlabel("position of the gold passage (1 = first)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        model = os.path.basename(self.model) if os.path.isabs(self.model) else self.model  # a hub id stays whole
        fig.suptitle(f"Position sweep, {self.n_questions} NQ-open questions, {model}", fontsize=10)
        return save_figure(fig, path)


def position_sweep(
    generator: Any,
    records: Sequence[QARecord],
    k: int | Sequence[int] = 10,
    slots: Sequence[int] | None = None,
    pool: Sequence[QARecord] | None = None,
    seed: int = 0,
    max_new_tokens: int = 16,
    score: bool = True,
    generate: bool = True,
    partial: str | os.PathLike[str] | None = None,
    resume: bool = True,
    chunk_questions: int = 10,
    show_progress: bool | None = None,
    permutations: int = 0,
) -> SweepResult:
    """Run the lost-in-the-middle position sweep.

    Parameters
    ----------
    generator
        A :class:`ragkit.generation.Generator` or any
        :class:`~ragkit.generation.base.GeneratorLike` (``run_orderings``, ``score_orderings``).
    records
        Questions with a gold passage (``gold_ids`` naming one of ``passages``) and answers.
    k
        Context size(s), e.g. ``(10, 20)``.
    slots
        0-based gold slots (default :func:`default_slots` per k); must be ``< k``.
    pool
        Records whose gold passages serve as distractors (default: ``records``).
    seed
        Seeds the distractor draw.
    max_new_tokens
        Answer length for the EM outcome.
    score, generate
        Compute the log-prob outcome / the EM outcome.
    partial
        JSONL file that makes the sweep resumable: the questions are run ``chunk_questions`` at a
        time and each chunk's per-question rows are appended here (its first line fingerprints the
        settings). A restarted sweep with the same settings skips the rows already there; other
        settings raise ``ValueError`` (pass ``resume=False`` to start over). ``None``: one pass,
        nothing written.
    resume
        Reuse ``partial``'s rows (``False``: delete the file first).
    chunk_questions
        Questions per chunk (each chunk is one ``run_orderings`` call, or one ``score_orderings``
        call without ``generate``).
    show_progress
        Progress bar over chunks (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).
    permutations
        ``P > 1`` adds, per question and k, ``P`` random orders of the same k passages (setting
        ``"permutation"``, its ``order`` index in the row; seeded by ``seed`` and the question's
        index), answered greedily (needs ``generate``), and ``psr`` in the summary. ``0``: none.

    Returns
    -------
    SweepResult
    """
    ks = [int(k)] if isinstance(k, (int, np.integer)) else [int(x) for x in k]
    if not ks:
        raise ValueError("k must name at least one context size")
    if permutations < 0 or permutations == 1:
        raise ValueError(f"permutations={permutations}: pass 0 (none) or at least 2 orders to compare")
    if permutations and not generate:
        raise ValueError("permutations need greedy answers: pass generate=True")
    recs = [r for r in records if _gold_passage(r) is not None and r.answers]
    if len(recs) < len(records):
        logger.warning("%d records without a gold passage or answers were skipped", len(records) - len(recs))
    if not recs:
        raise ValueError("no record has a gold passage and answers; the sweep needs the NQ-open oracle format")
    slot_map: dict[int, list[int]] = {}
    for kk in ks:
        s = sorted(set(int(x) for x in slots)) if slots is not None else default_slots(kk)
        if any(x < 0 or x >= kk for x in s):
            raise ValueError(f"slots {s} must lie in 0..{kk - 1} for k={kk}")
        slot_map[kk] = s
    pool = list(pool) if pool is not None else recs
    rng = np.random.default_rng(seed)
    kmax = max(ks)
    distractors = [draw_distractors(r, pool, kmax - 1, rng) for r in recs]
    golds = [_gold_passage(r) for r in recs]

    # Every (question, setting) context; they run in chunks of questions (one batched call each).
    # A setting is (question index, name, k, slot, order, ordering); ``order`` numbers the random
    # orders of the "permutation" setting (None elsewhere); ``ordering`` indexes the passages of its
    # query, ``[gold]`` for the anchors (k None) and ``[gold, *distractors[:k-1]]`` for a k, so that
    # one ``run_orderings`` call per chunk computes each query's shared prompt prefix once.
    settings: list[tuple[int, str, int | None, int | None, int | None, list[int]]] = []

    def query_passages(i: int, kk: int | None) -> list[Passage]:
        g = golds[i]
        assert g is not None
        return [g] if kk is None else [g, *distractors[i][: kk - 1]]

    def context(j: int) -> list[Passage]:
        """The passages of setting ``j`` in prompt order."""
        base = query_passages(settings[j][0], settings[j][2])
        return [base[t] for t in settings[j][5]]

    for i in range(len(recs)):
        settings.append((i, "closed_book", None, None, None, []))
        settings.append((i, "oracle", None, None, None, [0]))
        for kk in ks:
            for s in slot_map[kk]:
                order = list(range(1, kk))
                order.insert(s, 0)  # the gold passage at slot s, the distractors in their drawn order
                settings.append((i, "slot", kk, s, None, order))
            if permutations:
                perm_rng = np.random.default_rng([seed, i, kk])
                for o in range(permutations):
                    settings.append((i, "permutation", kk, None, o, [int(t) for t in perm_rng.permutation(kk)]))

    em = np.full(len(settings), np.nan)
    lp = np.full(len(settings), np.nan)
    preds: list[str] = [""] * len(settings)
    costs: list[dict[str, float] | None] = [None] * len(settings)
    config: dict[str, Any] = {"seed": seed, "max_new_tokens": max_new_tokens, "pool_size": len(pool)}
    if permutations:
        config["permutations"] = permutations

    def scored(j: int) -> bool:
        return score and settings[j][1] != "permutation"

    def per_question_row(j: int) -> dict[str, Any]:
        i, st, kk, s, o, _ = settings[j]
        row = {"qid": recs[i].id, "setting": st, "k": kk, "slot": s, "passage_ids": [c.id for c in context(j)],
               "gold_id": golds[i].id, "prediction": preds[j], "subspan_em": float(em[j]),  # type: ignore[union-attr]
               "logprob": float(lp[j]), "cost": costs[j]}
        if o is not None:
            row["order"] = o
        return row

    todo = list(range(len(settings)))
    if partial is not None:
        fingerprint = {**config, **generator_fingerprint(generator), "k": ks,
                       "slots": {str(kk): v for kk, v in slot_map.items()}, "score": score, "generate": generate,
                       "questions": [r.id for r in recs]}
        if permutations:
            fingerprint["permutations"] = permutations
        done = {(r["qid"], r["setting"], r["k"], r["slot"], r.get("order")): r
                for r in resume_appended_jsonl(partial, {"_sweep": fingerprint}, resume, key="_sweep")}
        for j, (i, st, kk, s, o, _) in enumerate(settings):
            row = done.get((recs[i].id, st, kk, s, o))
            if row is not None and row["passage_ids"] == [c.id for c in context(j)]:
                preds[j], em[j], lp[j] = row["prediction"], row["subspan_em"], row["logprob"]
                costs[j] = row.get("cost")
        todo = [j for j in range(len(settings)) if (generate and np.isnan(em[j])) or (scored(j) and np.isnan(lp[j]))]
        if len(todo) < len(settings):
            logger.info("resuming: %d of %d sweep contexts already in %s", len(settings) - len(todo),
                        len(settings), partial)
    chunks: dict[int, list[int]] = {}
    for j in todo:
        chunks.setdefault(settings[j][0] // max(1, chunk_questions), []).append(j)
    for js in progress(list(chunks.values()), show=show_progress, desc="sweep", unit="chunk"):
        # one query per (question, k): its settings are orderings of the same passages
        queries: dict[tuple[int, int | None], list[int]] = {}
        for j in js:
            if generate or scored(j):
                queries.setdefault((settings[j][0], settings[j][2]), []).append(j)
        qkeys = list(queries)
        qs = [recs[i].question for i, _ in qkeys]
        pss = [query_passages(i, kk) for i, kk in qkeys]
        ods = [[settings[j][5] for j in queries[key]] for key in qkeys]
        gold_answers = [recs[i].answers[0] for i, _ in qkeys]
        t0 = time.perf_counter()
        with metered() as meter:  # this chunk's model work
            if generate:
                # greedy answers as ``answer`` gives them (EOS never first), the gold answer scored from
                # each ordering's own cache (``""``: a permutation, not scored)
                rounds = [[[gold_answers[q] if scored(j) else "" for j in queries[key]]] for q, key in enumerate(qkeys)]
                runs = generator.run_orderings(qs, pss, ods, (lambda q, _answers, r=rounds: r[q]) if score else None,
                                               max_new_tokens=max_new_tokens, min_new_tokens=1)
                for q, run in enumerate(runs):
                    for m, j in enumerate(queries[qkeys[q]]):
                        preds[j], em[j] = run.answers[m], best_subspan_em(run.answers[m], recs[settings[j][0]].answers)
                        if scored(j):
                            lp[j] = float(run.scores[0].mean[m])
            elif qkeys:
                for q, res in enumerate(generator.score_orderings(qs, pss, ods, gold_answers)):
                    for m, j in enumerate(queries[qkeys[q]]):
                        lp[j] = float(res.mean[m])
        share = meter.per_item(len(js), time.perf_counter() - t0)
        for j in js:
            costs[j] = dict(share)
        if partial is not None:
            append_jsonl(partial, [per_question_row(j) for j in js])

    rows: list[dict[str, Any]] = []
    keys: list[tuple[str, int | None, int | None]] = [("closed_book", None, None), ("oracle", None, None)]
    keys += [("slot", kk, s) for kk in ks for s in slot_map[kk]]
    keys += [("permutation", kk, None) for kk in ks] if permutations else []
    for setting, kk, s in keys:
        m = np.array([st[1] == setting and st[2] == kk and st[3] == s for st in settings])
        rows.append(
            {
                "setting": setting,
                "k": kk,
                "slot": s,
                "subspan_em": float(np.nanmean(em[m])) if generate else float("nan"),
                "logprob": float(np.nanmean(lp[m])) if score and setting != "permutation" else float("nan"),
                "n": int(m.sum()),
            }
        )
    summary: dict[str, Any] = {}
    per_q_metrics: dict[int, dict[str, dict[str, float]]] = {}
    for kk in ks:
        per_q_metrics[kk] = _question_metrics(settings, [r.id for r in recs], em, lp, preds, kk)
        rs = [r for r in rows if r["setting"] == "slot" and r["k"] == kk]
        entry: dict[str, Any] = {}
        for key in ("subspan_em", "logprob"):
            vals = np.array([r[key] for r in rs])
            if np.all(np.isnan(vals)):
                continue
            worst, best = int(np.nanargmin(vals)), int(np.nanargmax(vals))
            entry[key] = {
                "worst_slot": rs[worst]["slot"],
                "worst": float(vals[worst]),
                "best_slot": rs[best]["slot"],
                "best": float(vals[best]),
                "gap": float(vals[best] - vals[worst]),
                "spread": _nan_mean([q[f"{key}_spread"] for q in per_q_metrics[kk].values()]),
            }
        if permutations:
            entry["psr"] = _nan_mean([q["psr"] for q in per_q_metrics[kk].values()])
        summary[str(kk)] = entry
    per_q = [per_question_row(j) for j in range(len(settings))]
    return SweepResult(
        model=str(getattr(generator, "name", "generator")),
        n_questions=len(recs),
        k_values=ks,
        slots=slot_map,
        rows=rows,
        per_question=per_q,
        summary=summary,
        config=config,
        per_question_metrics=per_q_metrics,
        cost=_total_cost([c for c in costs if c is not None]),
    )


def _total_cost(shares: Sequence[dict[str, float]]) -> dict[str, float]:
    """The summed ledger of the rows that carry one, and how many they are (``contexts``)."""
    totals = {key: round(sum(float(c.get(key, 0.0)) for c in shares), 4) for key in SHARE_KEYS}
    return {"contexts": len(shares), **totals}


def _nan_mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there is none)."""
    x = [v for v in values if np.isfinite(v)]
    return float(np.mean(x)) if x else float("nan")


def _question_spreads(settings: Sequence[tuple], values: np.ndarray, k: int) -> dict[int, float]:
    """Per question index: ``max − min`` of one outcome across the gold slots of context size ``k``
    (questions with fewer than two finite values are left out)."""
    by_q: dict[int, list[float]] = {}
    for j, (i, st, kk, *_rest) in enumerate(settings):
        if st == "slot" and kk == k and np.isfinite(values[j]):
            by_q.setdefault(i, []).append(float(values[j]))
    return {i: max(v) - min(v) for i, v in by_q.items() if len(v) > 1}


def _answer_changed(settings: Sequence[tuple], preds: Sequence[str], k: int) -> dict[int, float]:
    """Per question index with random orders of size ``k``: 1.0 when its normalised greedy answer
    is not the same in all of them, else 0.0."""
    by_q: dict[int, set[str]] = {}
    for j, (i, st, kk, *_rest) in enumerate(settings):
        if st == "permutation" and kk == k:
            by_q.setdefault(i, set()).add(normalize_answer(preds[j]))
    return {i: float(len(v) > 1) for i, v in by_q.items()}


def _question_metrics(settings: Sequence[tuple], qids: Sequence[str], em: np.ndarray, lp: np.ndarray,
                      preds: Sequence[str], k: int) -> dict[str, dict[str, float]]:
    """:attr:`SweepResult.per_question_metrics` of context size ``k``, keyed by question id."""
    slot_js: dict[int, list[int]] = {}
    for j, (i, st, kk, *_rest) in enumerate(settings):
        if st == "slot" and kk == k:
            slot_js.setdefault(i, []).append(j)
    spreads = {"subspan_em_spread": _question_spreads(settings, em, k),
               "logprob_spread": _question_spreads(settings, lp, k)}
    changed = _answer_changed(settings, preds, k)
    nan = float("nan")
    return {qids[i]: {"subspan_em": _nan_mean([float(em[j]) for j in js]),
                      "logprob": _nan_mean([float(lp[j]) for j in js]),
                      **{name: by_q.get(i, nan) for name, by_q in spreads.items()},
                      "psr": changed.get(i, nan)}
            for i, js in sorted(slot_js.items())}
