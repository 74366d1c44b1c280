"""The evaluation runner behind ``ragkit eval``: datasets x retrievers x debiasing methods.

For each record the runner builds a candidate list (``given``: the record's own passages in the
dataset's order; ``bm25``/``dense``/``hybrid``: top-k from the pooled corpus of all records'
passages), runs every method (a preset of :mod:`ragkit.debias.presets`: reranker -> placement
-> answerer, ``get_method(name, generator).run_many``) in chunks, scores each answer with the
dataset's metrics and the method's passage ranking with gold-passage IR metrics, and aggregates
means with seeded percentile-bootstrap 95% intervals (Efron & Tibshirani, 1993).

Resumability: every finished (method, question) output is appended (fsync'd) to
``<out>.partial.jsonl``; the first line of that file fingerprints the configuration. A restarted
run with the same configuration skips finished items, so it ends with the same per-question
outputs as an uninterrupted run (chunks are cut at the same boundaries). The final report is
written atomically and the partial file removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.debias.presets import Method, get_method, resolve_method
from ragkit.eval import msmarco_official
from ragkit.eval.metrics import (
    best_subspan_em,
    bleu,
    exact_match_max,
    f1_max,
    ir_metrics_per_query,
    rouge_l,
)
from ragkit.eval.stats import bootstrap_ci
from ragkit.io import append_jsonl, atomic_write_text, progress, resume_appended_jsonl, write_json
from ragkit.types import Passage, QARecord, RankedList

__all__ = [
    "EvalConfig",
    "RETRIEVERS",
    "DATASET_METRICS",
    "RANKING_METRICS",
    "answer_metrics",
    "bootstrap_ci",
    "build_retriever",
    "candidates_for",
    "paired_differences",
    "run_eval",
    "DEFAULT_REPORT",
]


logger = logging.getLogger(__name__)

RETRIEVERS: tuple[str, ...] = ("given", "bm25", "dense", "hybrid")
DATASET_METRICS: dict[str, tuple[str, ...]] = {
    "hotpotqa": ("em", "f1"),
    "msmarco": ("rouge_l", "bleu1", "bleu2", "rougeL_official", "bleu1_official", "bleu2_official",
                "bleu3_official", "bleu4_official"),
    "nq-open": ("subspan_em", "em", "f1"),
}
RANKING_METRICS: tuple[str, ...] = ("mrr@10", "recall@2")
DEFAULT_REPORT = "ragkit-eval-report.json"


@dataclass
class EvalConfig:
    """Everything that defines an evaluation run (stored in the report and fingerprinted).

    Parameters
    ----------
    dataset
        ``"hotpotqa"``, ``"msmarco"`` or ``"nq-open"``.
    data_file
        Local file; ``None`` with ``sample=True`` uses the bundled HotpotQA sample, otherwise the hub.
    limit
        First ``limit`` records.
    retriever
        ``"given"``, ``"bm25"``, ``"dense"`` or ``"hybrid"`` (BM25 + dense, RRF).
    methods
        Method names of :func:`ragkit.debias.available_methods` (``student:DIR`` and
        ``cross-encoder:NAME`` included); checked when the config is built, before any model loads.
    k
        Candidates per question.
    model
        Generator (``None``: the embedded SmolLM2).
    embedder
        Sentence-transformer for the dense/hybrid retrievers (``None``: embedded MiniLM).
    passage_max_tokens
        Per-passage truncation in the prompt (``None``: none).
    max_new_tokens
        Answer length budget.
    chunk_size
        Questions handed to ``run_many`` at once (and appended to the partial file together).
    seed
        Seeds methods and the bootstrap.
    n_bootstrap
        Bootstrap resamples for the 95% intervals.
    """

    dataset: str = "hotpotqa"
    data_file: str | None = None
    sample: bool = False
    limit: int | None = None
    split: str | None = None
    setting: str | None = None
    retriever: str = "given"
    methods: tuple[str, ...] = ("none",)
    k: int = 10
    model: str | None = None
    embedder: str | None = None
    template: str = "auto"
    passage_max_tokens: int | None = None
    max_new_tokens: int = 32
    batch_size: int = 8
    chunk_size: int = 8
    seed: int = 0
    n_bootstrap: int = 1000
    device: str = "auto"
    method_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"unknown retriever {self.retriever!r}; choose one of {', '.join(RETRIEVERS)}")
        if not self.methods:
            raise ValueError("no methods given; pass e.g. --methods none,moi")
        for m in self.methods:
            resolve_method(m)  # a typo is reported before any model loads, listing the valid names
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"a method is listed twice in {','.join(self.methods)}; list each once")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        for name in ("max_new_tokens", "batch_size", "n_bootstrap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:  # never read as "all" or "all but the last"
            raise ValueError(f"limit must be >= 1 (or None for all questions), got {self.limit}")

    def fingerprint(self) -> str:
        """Hash of the fields that change per-question outputs (not n_bootstrap/limit/methods)."""
        d = asdict(self)
        for key in ("n_bootstrap", "limit", "methods", "chunk_size", "batch_size", "device"):
            d.pop(key, None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def answer_metrics(dataset: str, prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """The dataset's answer metrics for one prediction (empty when there is no reference)."""
    if not answers:
        return {}
    if dataset == "hotpotqa":
        return {"em": exact_match_max(prediction, answers), "f1": f1_max(prediction, answers)}
    if dataset == "msmarco":
        return {
            "rouge_l": rouge_l(prediction, answers),
            "bleu1": bleu(prediction, answers, n=1),
            "bleu2": bleu(prediction, answers, n=2),
            # the leaderboard's protocol (ragkit.eval.msmarco_official): spaCy tokens, beta 1.2
            **msmarco_official.answer_metrics(prediction, answers),
        }
    if dataset == "nq-open":
        return {
            "subspan_em": best_subspan_em(prediction, answers),
            "em": exact_match_max(prediction, answers),
            "f1": f1_max(prediction, answers),
        }
    raise ValueError(f"no answer metrics for dataset {dataset!r}")


def _load_records(cfg: EvalConfig) -> list[QARecord]:
    from ragkit.datasets import load_dataset, sample_records

    if cfg.sample and cfg.data_file is None:
        return sample_records(cfg.limit)
    return load_dataset(cfg.dataset, cfg.data_file, limit=cfg.limit, split=cfg.split, setting=cfg.setting)


def build_retriever(cfg: EvalConfig, corpus: list[Passage]) -> Any:
    """The run's retriever (:func:`ragkit.retrievers.make_retriever` of ``cfg.retriever``), indexed on ``corpus``."""
    from ragkit.retrievers import make_retriever

    return make_retriever(cfg.retriever, embedder=cfg.embedder, device=cfg.device).index(corpus)


def candidates_for(
    cfg: EvalConfig, records: Sequence[QARecord], retriever: Any | None = None
) -> list[RankedList]:
    """Candidate passages per record, best first.

    ``given``: the record's passages in the dataset's order (scores ``k, k-1, ..., 1`` so the
    given order is the ranking). Otherwise the retriever (built on the pooled corpus of all
    records when ``retriever`` is None) returns top-``k``.
    """
    if cfg.retriever == "given":
        out = []
        for r in records:
            ps = list(r.passages[: cfg.k])
            out.append(RankedList.from_scores(ps, [float(len(ps) - i) for i in range(len(ps))], r.query))
        return out
    if retriever is None:
        from ragkit.datasets import pooled_corpus

        corpus = pooled_corpus(records)
        if not corpus:
            raise ValueError(
                f"the records have no passages to pool for --retriever {cfg.retriever}; "
                "use a dataset file with passages (e.g. the NQ-open oracle file)"
            )
        retriever = build_retriever(cfg, corpus)
    return list(retriever.search([r.query for r in records], k=cfg.k))


def _method(name: str, generator: Any, cfg: EvalConfig) -> Method:
    """The preset ``name`` with the run's seed, answer length (and device for a cross-encoder)."""
    kw: dict[str, Any] = {"seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens}
    if resolve_method(name).loads_encoder:
        kw["device"] = cfg.device
    kw.update(cfg.method_kwargs.get(name, {}))
    return get_method(name, generator, **kw)


def _row(method: str, rec: QARecord, cand: RankedList, out: Any, dataset: str, elapsed: float) -> dict[str, Any]:
    answer = out.answer if out.answer is not None else ""
    ranking: RankedList = out.ranking
    return {
        "method": method,
        "qid": rec.id,
        "question": rec.question,
        "answers": list(rec.answers),
        "prediction": answer,
        "candidates": cand.ids(),
        "ranking": ranking.ids(),
        "order": [int(i) for i in out.order],
        "gold_ids": list(rec.gold_ids),
        "generator_calls": int(getattr(out, "generator_calls", 0) or 0),
        "seconds": round(elapsed, 4),
        "metrics": answer_metrics(dataset, answer, rec.answers),
    }


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def aggregate(
    rows: Sequence[dict[str, Any]], dataset: str, methods: Sequence[str], n_bootstrap: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Per-method means + bootstrap intervals of answer metrics and gold-passage IR metrics."""
    agg: dict[str, dict[str, Any]] = {}
    for m in methods:
        mrows = [r for r in rows if r["method"] == m]
        res: dict[str, Any] = {}
        for name in DATASET_METRICS[dataset]:
            vals = [r["metrics"][name] for r in mrows if name in r["metrics"]]
            res[name] = bootstrap_ci(vals, n_bootstrap, seed)
        qrels = {r["qid"]: r["gold_ids"] for r in mrows if r["gold_ids"]}
        if qrels:
            run = {r["qid"]: {pid: float(len(r["ranking"]) - i) for i, pid in enumerate(r["ranking"])} for r in mrows}
            per = ir_metrics_per_query(qrels, run, RANKING_METRICS)
            for name in RANKING_METRICS:
                res[name] = bootstrap_ci(list(per[name].values()), n_bootstrap, seed)
        res["generator_calls_per_question"] = float(np.mean([r["generator_calls"] for r in mrows])) if mrows else 0.0
        res["seconds_per_question"] = float(np.mean([r["seconds"] for r in mrows])) if mrows else 0.0
        res["questions"] = len(mrows)
        agg[m] = res
    return agg


def paired_differences(
    rows: Sequence[dict[str, Any]], dataset: str, methods: Sequence[str], n_bootstrap: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Each method minus the first one (the baseline), question by question, with a bootstrap interval.

    For method ``m`` and metric ``s``, ``d_q = s_m(q) - s_base(q)`` over the questions both answered;
    the result is ``mean(d)`` with the percentile-bootstrap interval of :func:`bootstrap_ci`
    (resampling questions, so the pairing is kept: a paired bootstrap, Efron & Tibshirani 1993, ch. 16).
    An interval that excludes 0 means the difference is unlikely to come from the question sample.

    Returns
    -------
    dict
        ``{"<m> - <base>": {metric: {"mean", "lo", "hi", "n"}}}`` for every ``m`` after the first.
    """
    if len(methods) < 2:
        return {}
    base = methods[0]
    by = {(r["method"], r["qid"]): r for r in rows}
    out: dict[str, dict[str, Any]] = {}
    for m in methods[1:]:
        qids = [q for (mm, q) in by if mm == m and (base, q) in by]
        res: dict[str, Any] = {}
        for name in DATASET_METRICS[dataset]:
            diffs = [by[(m, q)]["metrics"][name] - by[(base, q)]["metrics"][name] for q in qids
                     if name in by[(m, q)]["metrics"] and name in by[(base, q)]["metrics"]]
            res[name] = bootstrap_ci(diffs, n_bootstrap, seed)
        out[f"{m} - {base}"] = res
    return out


def run_eval(
    cfg: EvalConfig,
    out: str | os.PathLike[str] = DEFAULT_REPORT,
    report_md: str | os.PathLike[str] | None = None,
    plot_dir: str | os.PathLike[str] | None = None,
    resume: bool = True,
    records: Sequence[QARecord] | None = None,
    generator: Any | None = None,
    show_progress: bool | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run an evaluation and write its JSON (and markdown) report.

    Parameters
    ----------
    cfg
        The run configuration.
    out
        JSON report path; per-question outputs stream to ``<out>.partial.jsonl`` meanwhile.
    report_md
        Markdown table path (default: ``out`` with suffix ``.md``).
    plot_dir
        Write PNG bar plots of the aggregate metrics here.
    resume
        Skip the (method, question) items already in the partial file.
    records, generator
        Pre-loaded records / a :class:`ragkit.generation.Generator` (else built from ``cfg``).
    on_chunk
        Progress callback, called after each chunk is appended (fsync'd) to the partial file with
        the number of items appended so far in this call; an exception it raises stops the run,
        which a later call resumes.

    Returns
    -------
    dict
        The report (``config``, ``models``, ``aggregate``, ``outputs``, ...).
    """
    t0 = time.perf_counter()
    out_path = Path(out)
    md_path = Path(report_md) if report_md else out_path.with_suffix(".md")
    recs = list(records) if records is not None else _load_records(cfg)
    if not recs:
        raise ValueError("no records to evaluate (empty dataset or --limit 0)")
    dataset = "hotpotqa" if cfg.sample and cfg.data_file is None else cfg.dataset
    from ragkit.datasets import _canonical

    dataset = _canonical(dataset)
    if cfg.retriever == "given" and any(r.metadata.get("setting") == "fullwiki" for r in recs):
        logger.warning("HotpotQA fullwiki with --retriever given uses the hub's own context paragraphs; "
                       "pass --retriever bm25|dense|hybrid to retrieve from the pooled corpus")
    ids = [r.id for r in recs]
    if len(set(ids)) != len(ids):
        raise ValueError("record ids are not unique; the runner keys outputs by (method, id)")

    partial = _partial_path(out_path)
    fp = cfg.fingerprint()
    done = {(r["method"], r["qid"]): r
            for r in resume_appended_jsonl(partial, {"_fingerprint": fp, "config": asdict(cfg)}, resume,
                                           key="_fingerprint") if "method" in r}
    if done:
        logger.info("resuming: %d (method, question) outputs already in %s", len(done), partial)

    todo = {m: [r for r in recs if (m, r.id) not in done] for m in cfg.methods}
    n_todo = sum(len(v) for v in todo.values())
    t_load = time.perf_counter()
    cands_by_id: dict[str, RankedList] = {}
    if n_todo:
        # retrieval always sees all records (the pooled corpus must not depend on what is done)
        all_cands = candidates_for(cfg, recs)
        cands_by_id = {r.id: c for r, c in zip(recs, all_cands)}
        if generator is None:
            from ragkit.generation import load_generator

            generator = load_generator(
                cfg.model,
                device=cfg.device,
                template=cfg.template,
                batch_size=cfg.batch_size,
                passage_max_tokens=cfg.passage_max_tokens,
                show_progress=False,
            )
    load_s = time.perf_counter() - t_load

    appended = 0
    bar = progress(range(n_todo), show=show_progress, desc="eval", unit="q") if n_todo else None
    bar_it = iter(bar) if bar is not None else None
    for m in cfg.methods:
        items = todo[m]
        if not items:
            continue
        method = _method(m, generator, cfg)
        for start in range(0, len(items), cfg.chunk_size):
            chunk = items[start : start + cfg.chunk_size]
            cands = [cands_by_id[r.id] for r in chunk]
            tc = time.perf_counter()
            outs = method.run_many(
                [r.query for r in chunk],
                [c.passages() for c in cands],
                # the dataset's order has no retriever scores (its k..1 only sort it): MoI's
                # blend="auto" then leaves an order that may be random (HotpotQA) unblended
                None if cfg.retriever == "given" else [c.scores() for c in cands],
                # gold answers reach only oracle rerankers (moi_gold), never the answerer
                [list(r.answers) for r in chunk] if method.needs_answers else None,
                True,
            )
            per_item = (time.perf_counter() - tc) / len(chunk)
            rows = [_row(m, r, c, o, dataset, per_item) for r, c, o in zip(chunk, cands, outs)]
            append_jsonl(partial, rows)
            for row in rows:
                done[(m, row["qid"])] = row
                if bar_it is not None:
                    next(bar_it, None)
            appended += len(rows)
            if on_chunk is not None:
                on_chunk(appended)
    if bar_it is not None:
        for _ in bar_it:
            pass

    rows_final = [done[(m, r.id)] for m in cfg.methods for r in recs]
    agg = aggregate(rows_final, dataset, cfg.methods, cfg.n_bootstrap, cfg.seed)
    model_name = getattr(generator, "name", None) or cfg.model or "embedded-default"
    report: dict[str, Any] = {
        "ragkit_eval": 1,
        "dataset": dataset,
        "config": asdict(cfg),
        "models": {
            "generator": str(model_name),
            "embedder": (cfg.embedder or "embedded-default") if cfg.retriever in ("dense", "hybrid") else None,
        },
        "n_questions": len(recs),
        "metrics": list(DATASET_METRICS[dataset]),
        "aggregate": agg,
        "paired": paired_differences(rows_final, dataset, cfg.methods, cfg.n_bootstrap, cfg.seed),
        "timing": {
            "total_seconds": round(time.perf_counter() - t0, 3),
            "setup_seconds": round(load_s, 3),
            "resumed_items": len(rows_final) - appended,
        },
        "outputs": rows_final,
    }
    from ragkit.eval.report import markdown_report

    write_json(out_path, report)
    atomic_write_text(md_path, markdown_report(report))
    if plot_dir:
        from ragkit.eval.plots import plot_aggregate

        report["plots"] = plot_aggregate(report, plot_dir)
        write_json(out_path, report)
    partial.unlink(missing_ok=True)
    return report
