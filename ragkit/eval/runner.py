"""The evaluation runner behind ``ragkit eval``: datasets x retrievers x debiasing methods.

The pipeline protocol: for each question the first stage returns ``N`` candidates
(``candidates``; ``given``: the record's own passages in the dataset's order;
``bm25``/``dense``/``hybrid``: top-``N`` from a corpus pooled from **every** record of the data
file, whatever ``limit`` says, plus any extra corpus files, so a question's distractors include
the other questions' passages), every method (a preset of :mod:`ragkit.debias.presets`: reranker
-> placement -> answerer) reranks the ``N`` candidates and puts its top ``K`` (``k``) into the
prompt (``NAME@prune``: only the passages whose leave-one-out utility is not below zero), and the
generator answers once from them. Each answer is scored with the dataset's metrics, each ranking
with gold-passage nDCG@10 and MRR@10, each prompt with recall@K of the gold passages; means get
seeded percentile-bootstrap 95% intervals (Efron & Tibshirani, 1993), each method minus the first
a paired interval, and the headline table (:func:`headline`) those differences on recall@K, nDCG@10
and the answer metrics, Holm-corrected across all its rows.

Per question and method the report keeps the candidates, the ranking, the prompt's passages, the
gold ids, the answer, the fallback flag and the cost ledger: generator sequences, forward
passes, tokens prefilled, tokens generated, seconds. The generator charges every forward to the
open meters (:func:`ragkit.generation.base.metered`); the runner meters each chunk of questions
and gives every question of the chunk the chunk's mean (exact totals and means;
``chunk_size=1`` for exact per-question numbers).

Shared rankings: a method that differs from another of the run only in placement (``moi@prune``
beside ``moi``, with the same reranker settings: :func:`ranking_sources`) does not rank again; it
places and answers from the ranking its source computed for the same question and candidates
(the reranker is deterministic given the seed, so the rows are the ones a separate run gives).
The sources run first. The ledger stays honest about what each row costs on its own: every row
carries ``ranking_cost`` (the ranking's share of the chunk's model work and seconds, metered apart
from placement and answering, with the reranker's generator sequences and ``model_passes``, the
reranker's own forward passes per question: encoder passes for a cross-encoder or a distilled
student, which the generator meter does not see, generator forwards for a generator reranker), and
a reusing row's ``cost`` is its source's ``ranking_cost`` plus its own placement and answer, with
``ranking_reused_from`` naming the source. The aggregate's ``ranking_cost_per_question`` is their
mean. A reusing row ranks for itself (and carries
no ``ranking_reused_from``) when its source's ranking is not in this process's memory, as when the
source's rows were resumed from the partial file.

Resumability: every finished (method, question) output is appended (fsync'd) to
``<out>.partial.jsonl``; the first line of that file fingerprints the configuration. A restarted
run with the same configuration skips finished items, so it ends with the same per-question
outputs as an uninterrupted run (chunks are cut at the same boundaries). The final report is
written atomically and the partial file removed; started again, a finished run with the same
configuration takes its rows from that report and runs nothing again (``resume=False`` to redo it).

Reused rows (``reuse``): a study that adds methods to a finished run (the same questions, corpus,
generator and settings) need not pay again for the methods that run already has. Rows of another
report are taken for a method when the two configurations agree on everything that changes outputs
except the method list and the other methods' settings (:func:`_reusable_rows`) and the row's
candidates are the ones this run retrieves for that question (a check of the pooled corpus, which
the configuration does not name). A taken row keeps its own ledger, measured when it ran, and names
its report in ``reused_from``; the report counts them in ``timing.reused_items``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
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
from ragkit.generation.base import SHARE_KEYS, metered
from ragkit.io import (
    append_jsonl,
    atomic_write_text,
    partial_path,
    progress,
    resume_appended_jsonl,
    write_json,
)
from ragkit.models import check_dtype
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
    "pipeline_corpus",
    "records_with_candidates",
    "select_questions",
    "split_method",
    "ranking_sources",
    "add_ranking_metrics",
    "metric_names",
    "aggregate",
    "LEDGER_KEYS",
    "paired_differences",
    "headline",
    "HEADLINE_ANSWER_METRICS",
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
RANKING_METRICS: tuple[str, ...] = ("ndcg@10", "mrr@10")
"""Metrics of each method's ranking of the candidates against the gold passages (recall@K is of the prompt)."""
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
        Passages that go into the prompt (the top ``K`` of each method's ranking).
    candidates
        First-stage depth ``N``: how many passages the retriever returns and the reranker sees
        (``None``: ``k``, so the whole list goes into the prompt).
    corpus
        Extra corpus files (JSONL ``{"id", "text", "title"}``) pooled with the data file's passages
        for ``bm25``/``dense``/``hybrid``.
    offset
        Skip the first ``offset`` records before taking ``limit`` (e.g. NQ-open questions outside
        the first 100).
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
    dtype
        The generator's weights: ``"auto"`` (bf16 on CUDA, fp32 on a CPU), ``"float32"`` or
        ``"bfloat16"`` (about twice as fast on CPUs with AVX512-BF16 or AMX:
        ``benchmarks/cpu_dtype.py``). Part of the fingerprint, since it moves scores and answers.
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
    candidates: int | None = None
    corpus: tuple[str, ...] = ()
    offset: int = 0
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
    dtype: str = "auto"

    def __post_init__(self) -> None:
        self.methods = tuple(self.methods)
        self.corpus = tuple(str(c) for c in self.corpus)
        if self.retriever not in RETRIEVERS:
            raise ValueError(f"unknown retriever {self.retriever!r}; choose one of {', '.join(RETRIEVERS)}")
        if not self.methods:
            raise ValueError("no methods given; pass e.g. --methods none,moi")
        for m in self.methods:
            split_method(m)  # a typo is reported before any model loads, listing the valid names
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"a method is listed twice in {','.join(self.methods)}; list each once")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.candidates is not None and self.candidates < self.k:
            raise ValueError(f"--candidates {self.candidates} is smaller than -k {self.k}: the prompt takes the top K "
                             "of the N candidates; pass N >= K")
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")
        if self.corpus and self.retriever == "given":
            raise ValueError("--corpus adds passages to the retriever's pooled corpus; pass --retriever "
                             "bm25|dense|hybrid with it")
        for c in self.corpus:
            if not Path(c).is_file():
                raise FileNotFoundError(f"--corpus {c}: no such file (JSONL lines {{\"id\", \"text\", \"title\"}})")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        check_dtype(self.dtype)
        for name in ("max_new_tokens", "batch_size", "n_bootstrap"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:  # never read as "all" or "all but the last"
            raise ValueError(f"limit must be >= 1 (or None for all questions), got {self.limit}")

    @property
    def n_candidates(self) -> int:
        """The first-stage depth ``N`` (``candidates``, else ``k``)."""
        return self.k if self.candidates is None else int(self.candidates)

    def fingerprint(self) -> str:
        """Hash of the fields that change per-question outputs (not n_bootstrap/limit/methods).

        The pipeline fields at their defaults (``candidates=None``, no ``corpus``, ``offset=0``) and
        ``dtype="auto"`` are left out, so a run without them keeps its earlier fingerprint; a
        retrieved run names its pooling (every record of the file), which changed the candidates of
        limited runs.
        """
        return config_fingerprint(asdict(self))


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """:meth:`EvalConfig.fingerprint` of a configuration as a report stores it (``report["config"]``)."""
    d = dict(config)
    for key in ("n_bootstrap", "limit", "methods", "chunk_size", "batch_size", "device", "offset"):
        d.pop(key, None)
    for key, default in (("candidates", None), ("corpus", ()), ("dtype", "auto")):
        if d.get(key) in (default, list(default) if isinstance(default, tuple) else default):
            d.pop(key, None)
    if d.get("retriever") != "given":
        d["pool"] = "all-records"
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _finished_report(out: Path, fingerprint: str
                     ) -> tuple[dict[str, Any] | None, dict[tuple[str, str], dict[str, Any]]]:
    """``(report, rows)`` of a finished report at ``out`` made with the same configuration (``None, {}`` otherwise).

    A finished run removes its partial file, so without this a second start of the same command
    would run every question again: hours for a generator study, and a second dev run of a config
    meant to run once. Its rows are checked as resumed partial rows are (:func:`_check_resumed_row`).
    """
    try:
        report = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, {}
    if not isinstance(report, dict) or not isinstance(report.get("config"), dict) \
            or config_fingerprint(report["config"]) != fingerprint or not isinstance(report.get("outputs"), list):
        return None, {}
    return report, {(r["method"], r["qid"]): r for r in (_check_resumed_row(out, i, r) for i, r in
                                                          enumerate(report["outputs"]))}


def _same_run(report: Mapping[str, Any], cfg: EvalConfig, keys: Sequence[tuple[str, str]]) -> bool:
    """Whether a finished report is exactly what ``cfg`` would write: the same settings (bootstrap and
    batch size included) and the same (method, question) rows, nothing more or less."""
    mine = json.loads(json.dumps(asdict(cfg), default=str))
    rows = [(r.get("method"), r.get("qid")) for r in report.get("outputs", [])]
    return report.get("config") == mine and sorted(rows) == sorted(keys) and len(set(rows)) == len(rows)


def _reusable_rows(
    paths: Sequence[str | os.PathLike[str]], cfg: EvalConfig,
) -> dict[tuple[str, str], dict[str, Any]]:
    """Rows of the reports at ``paths`` that a run of ``cfg`` may take instead of computing them.

    A report qualifies when its configuration has :func:`config_fingerprint` of ``cfg`` once both
    drop ``method_kwargs``; of its methods, those that ``cfg`` also runs with the same settings
    (``method_kwargs[method]``, compared as JSON) give their rows. Each row is checked as a resumed
    row is (:func:`_check_resumed_row`) and gains ``reused_from``; the first report that has a
    (method, question) wins. A report of another configuration is logged and skipped (reuse only
    saves work); a file that is not an eval report raises ``ValueError`` naming it.
    """
    def norm(v: Any) -> str:
        return json.dumps(v or {}, sort_keys=True, default=str)

    mine = asdict(cfg)
    base_fp = config_fingerprint({**mine, "method_kwargs": {}})
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for p in paths:
        path = Path(p)
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            theirs = report["config"]
            rows = report["outputs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"cannot reuse rows of {path}: {e}; pass a ragkit eval report (JSON)") from e
        if config_fingerprint({**theirs, "method_kwargs": {}}) != base_fp:
            logger.warning("not reusing rows of %s: its configuration differs from this run's beyond the methods",
                           path)
            continue
        same = {m for m in cfg.methods if m in (theirs.get("methods") or [])
                and norm((theirs.get("method_kwargs") or {}).get(m)) == norm(cfg.method_kwargs.get(m))}
        for i, row in enumerate(rows):
            if isinstance(row, dict) and row.get("method") in same and (row["method"], row.get("qid")) not in out:
                out[(row["method"], row["qid"])] = {**_check_resumed_row(path, i, row), "reused_from": str(path)}
    return out


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


def _load_all(cfg: EvalConfig) -> list[QARecord]:
    """Every record of the run's source (the data file whole; the bundled sample; the hub up to ``limit``)."""
    from ragkit.datasets import load_dataset, sample_records

    if cfg.sample and cfg.data_file is None:
        return sample_records(None)
    hub_limit = None if cfg.data_file else (None if cfg.limit is None else cfg.offset + cfg.limit)
    return load_dataset(cfg.dataset, cfg.data_file, limit=hub_limit, split=cfg.split, setting=cfg.setting)


def select_questions(cfg: EvalConfig, records: Sequence[QARecord]) -> list[QARecord]:
    """The evaluated questions: ``records[offset : offset + limit]``."""
    end = None if cfg.limit is None else cfg.offset + cfg.limit
    return list(records[cfg.offset:end])


def _load_records(cfg: EvalConfig) -> list[QARecord]:
    return select_questions(cfg, _load_all(cfg))


def pipeline_corpus(cfg: EvalConfig, records: Sequence[QARecord]) -> list[Passage]:
    """The retriever's corpus: ``records``' passages pooled (de-duplicated by id, first wins), then
    the passages of each ``cfg.corpus`` file whose id is new."""
    from ragkit.datasets import pooled_corpus
    from ragkit.retrievers.base import iter_passages

    corpus = pooled_corpus(records)
    seen = {p.id for p in corpus}
    for f in cfg.corpus:
        for p in iter_passages(f):
            if p.id not in seen:
                seen.add(p.id)
                corpus.append(p)
    return corpus


def build_retriever(cfg: EvalConfig, corpus: list[Passage]) -> Any:
    """The run's retriever (:func:`ragkit.retrievers.make_retriever` of ``cfg.retriever``), indexed on ``corpus``."""
    from ragkit.retrievers import make_retriever

    return make_retriever(cfg.retriever, embedder=cfg.embedder, device=cfg.device).index(corpus)


def candidates_for(
    cfg: EvalConfig, records: Sequence[QARecord], retriever: Any | None = None,
    pool: Sequence[QARecord] | None = None,
) -> list[RankedList]:
    """Candidate passages per record, best first (``cfg.n_candidates`` of them).

    ``given``: the record's passages in the dataset's order (scores ``N, N-1, ..., 1`` so the
    given order is the ranking). Otherwise the retriever (built, when ``retriever`` is None, on
    :func:`pipeline_corpus` of ``pool``, default ``records``) returns the top ``N``.
    """
    n = cfg.n_candidates
    if cfg.retriever == "given":
        out = []
        for r in records:
            ps = list(r.passages[:n])
            out.append(RankedList.from_scores(ps, [float(len(ps) - i) for i in range(len(ps))], r.query))
        return out
    if retriever is None:
        corpus = pipeline_corpus(cfg, records if pool is None else pool)
        if not corpus:
            raise ValueError(
                f"the records have no passages to pool for --retriever {cfg.retriever}; "
                "use a dataset file with passages (e.g. the NQ-open oracle file) or add --corpus FILE"
            )
        retriever = build_retriever(cfg, corpus)
    return list(retriever.search([r.query for r in records], k=n))


def records_with_candidates(cfg: EvalConfig, records: Sequence[QARecord],
                            pool: Sequence[QARecord] | None = None) -> list[QARecord]:
    """``records`` with the first stage's top ``cfg.n_candidates`` (:func:`candidates_for` over the corpus
    pooled from ``pool``, default ``records``) as their passages, best first.

    The pipeline protocol's candidates as records, e.g. for labels (``ragkit distill labels
    --retriever bm25``): pass every record of the data file (and of the pool files) as ``pool`` so
    that a question's candidates do not depend on which questions are labelled.
    """
    import dataclasses

    cands = candidates_for(cfg, records, pool=pool)
    return [dataclasses.replace(r, passages=tuple(h.passage for h in c)) for r, c in zip(records, cands)]


PIPELINE_PLACEMENTS: tuple[str, ...] = ("none", "reverse", "both_ends", "bias_aware", "prune")
"""What may follow ``@`` in a method name (``moi@prune``, ``upr@both_ends``)."""


def split_method(name: str) -> tuple[str, str | None]:
    """``"moi@prune"`` -> ``("moi", "prune")``; ``"upr"`` -> ``("upr", None)`` (checked, nothing loaded).

    ``@PLACEMENT`` overrides the preset's placement; ``prune`` needs leave-one-out utilities, so
    only MoI presets with the ``loo`` design take it.
    """
    from ragkit.debias.presets import moi_settings

    base, sep, placement = str(name).rpartition("@") if "@" in str(name) else (str(name), "", "")
    resolve_method(base)
    if not sep:
        return base, None
    if placement not in PIPELINE_PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r} in method {name!r}; choose one of "
                         f"{', '.join(PIPELINE_PLACEMENTS)}")
    if placement == "prune" and moi_settings(base).get("design") != "loo":
        raise ValueError(f"{name!r}: prune keeps passages by their leave-one-out utility; use it after an MoI "
                         "preset with the loo design (moi, moi_masked, moi_loo, moi_loo_q, moi_loo_gold)")
    return base, placement


def _method(name: str, generator: Any, cfg: EvalConfig) -> Method:
    """The preset ``name`` with the run's seed, answer length, prompt size ``k`` (and device for a cross-encoder)."""
    base, placement = split_method(name)
    kw: dict[str, Any] = {"seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens, "top_k": cfg.k}
    if placement is not None:
        kw["placement"] = placement
    if resolve_method(base).loads_encoder:
        kw["device"] = cfg.device
    kw.update(cfg.method_kwargs.get(name, {}))
    return get_method(base, generator, **kw)


_PLACEMENT_ONLY_KW: tuple[str, ...] = ("placement", "top_k")
"""Method settings that act after the reranker (:func:`ragkit.debias.presets.get_method` takes them off
before it builds the reranker); any other setting may change the ranking."""


def ranking_sources(cfg: EvalConfig) -> dict[str, str]:
    """``{method: base}`` for each ``BASE@PLACEMENT`` of ``cfg.methods`` that can reuse ``BASE``'s rankings.

    ``moi@prune`` runs the same reranker as ``moi`` and only places its ranking differently, so when
    both are listed and their settings (``cfg.method_kwargs``) agree on everything but
    placement-only keys (``placement``, ``top_k``), ``moi@prune`` takes ``moi``'s ranking of the same
    question instead of running the reranker again (:func:`run_eval`). Differing settings (another
    ``blend``, ``profile``, ...) could change the ranking, so those methods rank for themselves.
    """
    def reranker_kw(name: str) -> dict[str, Any]:
        return {k: v for k, v in (cfg.method_kwargs.get(name) or {}).items() if k not in _PLACEMENT_ONLY_KW}

    out: dict[str, str] = {}
    for m in cfg.methods:
        base, placement = split_method(m)
        if placement is not None and base in cfg.methods and reranker_kw(m) == reranker_kw(base):
            out[m] = base
    return out


LEDGER_KEYS: tuple[str, ...] = ("generator_calls", *SHARE_KEYS)
"""The cost ledger of every row (generator sequences, model forwards, prefilled and generated tokens, seconds)."""


def _row(method: str, rec: QARecord, cand: RankedList, out: Any, dataset: str, cost: dict[str, Any]) -> dict[str, Any]:
    answer = out.answer if out.answer is not None else ""
    ranking: RankedList = out.ranking
    cids = cand.ids()
    extra = getattr(out, "extra", {}) or {}
    row: dict[str, Any] = {
        "method": method,
        "qid": rec.id,
        "question": rec.question,
        "answers": list(rec.answers),
        "prediction": answer,
        "candidates": cids,
        "candidate_scores": [round(float(x), 6) for x in cand.scores()],
        "ranking": ranking.ids(),
        "order": [int(i) for i in out.order],
        "prompt": [cids[int(i)] for i in out.order],
        "gold_ids": list(rec.gold_ids),
        # the reranker kept the input order (MoI's interventions did not separate the passages)
        "fallback": bool(ranking.info.fallback or extra.get("fallback", False)),
        "generator_calls": int(getattr(out, "generator_calls", 0) or 0),
        "seconds": round(float(cost["seconds"]), 4),
        "cost": {"generator_calls": int(getattr(out, "generator_calls", 0) or 0), **cost},
        "metrics": answer_metrics(dataset, answer, rec.answers),
    }
    for key in ("abstain", "harmful_share", "harmful"):
        if key in extra:
            row[key] = extra[key]
    if extra.get("raw_utilities") is not None:  # MoI's utilities before blend/fallback, in candidate order
        row["utilities"] = [round(float(u), 6) for u in extra["raw_utilities"]]
    return row


_ROW_FIELDS: dict[str, type | tuple[type, ...]] = {
    "method": str, "qid": str, "question": str, "answers": list, "prediction": str, "candidates": list,
    "ranking": list, "order": list, "gold_ids": list, "generator_calls": int, "seconds": (int, float),
    "metrics": dict,
}


def _check_resumed_row(path: Path, line: int, row: Any) -> dict[str, Any]:
    """``row`` of a resumed partial file, checked as the runner wrote it: every field of
    :func:`_row` with its type, string lists, whole-number slot orders, a finite non-negative time,
    and answer metrics that are finite numbers in [0, 1]. An edited or damaged row (an F1 of 7.5,
    NaN, a missing key) would otherwise enter the summary, or stop every resume with a bare
    ``KeyError``; it raises ``ValueError`` naming the file, the line and the fix."""
    def bad(problem: str) -> ValueError:
        return ValueError(f"{path}:{line}: {problem}; that line was edited or damaged: delete it (its question is "
                          "then run again) or pass --no-resume to start over")

    if not isinstance(row, dict):
        raise bad(f"a JSON {type(row).__name__}, not an output row")
    missing = [k for k in _ROW_FIELDS if k not in row]
    if missing:
        raise bad(f"the output row lacks {missing}")
    for k, t in _ROW_FIELDS.items():
        if not isinstance(row[k], t) or isinstance(row[k], bool):
            raise bad(f"{k!r} is a {type(row[k]).__name__}")
    for k in ("answers", "candidates", "ranking", "gold_ids"):
        if not all(isinstance(x, str) for x in row[k]):
            raise bad(f"{k!r} holds a value that is not a string")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row["order"]):
        raise bad("'order' holds a value that is not a slot number")
    if not (math.isfinite(row["seconds"]) and row["seconds"] >= 0) or row["generator_calls"] < 0:
        raise bad(f"'seconds' {row['seconds']!r} or 'generator_calls' {row['generator_calls']!r} is not a count")
    for name, v in row["metrics"].items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise bad(f"the metric {name!r} is {v!r}, not a number in [0, 1]")
    return row


def recall_key(k: int) -> str:
    """The name of the prompt-recall metric for ``k`` prompt passages (``"recall@3"``)."""
    return f"recall@{int(k)}"


def metric_names(dataset: str, k: int) -> tuple[str, ...]:
    """Answer metrics of ``dataset``, then nDCG@10 and MRR@10 of the ranking, then recall@K of the prompt."""
    return (*DATASET_METRICS[dataset], *RANKING_METRICS, recall_key(k))


def add_ranking_metrics(rows: Sequence[dict[str, Any]], k: int) -> None:
    """Put nDCG@10 and MRR@10 of each row's ranking and recall@K of its prompt into ``row["metrics"]``.

    Gold passages are the row's ``gold_ids`` (rows without gold get none of the three).
    recall@K = |gold ∩ prompt| / |gold|, over the passages that reached the prompt (``prompt``; for
    rows written before it existed, the candidates in prompt ``order``), so a gold passage the first
    stage missed counts as missed, and ``prune`` is charged for what it drops.
    """
    by_method: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("gold_ids"):
            by_method.setdefault(r["method"], []).append(r)
    rk = recall_key(k)
    for mrows in by_method.values():
        qrels = {r["qid"]: r["gold_ids"] for r in mrows}
        run = {r["qid"]: {pid: float(len(r["ranking"]) - i) for i, pid in enumerate(r["ranking"])} for r in mrows}
        per = ir_metrics_per_query(qrels, run, RANKING_METRICS)
        for r in mrows:
            for name in RANKING_METRICS:
                r["metrics"][name] = float(per[name].get(r["qid"], 0.0))
            prompt = r.get("prompt") or [r["candidates"][i] for i in r.get("order", [])]
            gold = set(r["gold_ids"])
            r["metrics"][rk] = len(gold & set(prompt)) / len(gold)


def aggregate(
    rows: Sequence[dict[str, Any]], dataset: str, methods: Sequence[str], n_bootstrap: int, seed: int,
    k: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-method means + bootstrap intervals of the answer, ranking and prompt metrics, and the mean cost ledger.

    ``k`` (the prompt size) names recall@K; ranking metrics are computed from the rows
    (:func:`add_ranking_metrics`) when missing. ``fallback_rate`` is the share of questions whose
    reranker kept the retriever order; ``abstain_rate`` and ``harmful_share`` appear for ``prune``.
    """
    if k is None:
        k = max((len(r.get("order", [])) for r in rows), default=1) or 1
    if any(r.get("gold_ids") and RANKING_METRICS[0] not in r["metrics"] for r in rows):
        add_ranking_metrics(rows, k)
    agg: dict[str, dict[str, Any]] = {}
    for m in methods:
        mrows = [r for r in rows if r["method"] == m]
        res: dict[str, Any] = {}
        for name in metric_names(dataset, k):
            vals = [r["metrics"][name] for r in mrows if name in r["metrics"]]
            if vals or name in DATASET_METRICS[dataset]:
                res[name] = bootstrap_ci(vals, n_bootstrap, seed)
        res["generator_calls_per_question"] = float(np.mean([r["generator_calls"] for r in mrows])) if mrows else 0.0
        res["seconds_per_question"] = float(np.mean([r["seconds"] for r in mrows])) if mrows else 0.0
        costs = [r["cost"] for r in mrows if isinstance(r.get("cost"), dict)]
        res["cost_per_question"] = {key: float(np.mean([c[key] for c in costs if c.get(key) is not None]))
                                    for key in LEDGER_KEYS
                                    if any(c.get(key) is not None for c in costs)}
        rcosts = [r.get("ranking_cost") for r in mrows]
        if mrows and all(isinstance(c, dict) for c in rcosts):  # the reranker's share (older rows lack it)
            res["ranking_cost_per_question"] = {key: float(np.mean([c[key] for c in rcosts]))
                                                for key in (*LEDGER_KEYS, "model_passes")
                                                if all(c.get(key) is not None for c in rcosts)}
        res["fallbacks"] = sum(bool(r.get("fallback", False)) for r in mrows)
        res["fallback_rate"] = float(np.mean([bool(r.get("fallback")) for r in mrows])) if mrows else 0.0
        for key in ("abstain", "harmful_share"):
            vals = [float(r[key]) for r in mrows if key in r]
            if vals:
                res[f"{key}_rate" if key == "abstain" else key] = float(np.mean(vals))
        res["prompt_passages_per_question"] = float(np.mean([len(r.get("order", [])) for r in mrows])) if mrows else 0.0
        res["questions"] = len(mrows)
        agg[m] = res
    return agg


def paired_differences(
    rows: Sequence[dict[str, Any]], dataset: str, methods: Sequence[str], n_bootstrap: int, seed: int,
    k: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each method minus the first one (the baseline), question by question, with a bootstrap interval.

    For method ``m`` and metric ``s``, ``d_q = s_m(q) - s_base(q)`` over the questions both answered;
    the result is ``mean(d)`` with the percentile-bootstrap interval of :func:`bootstrap_ci`
    (resampling questions, so the pairing is kept: a paired bootstrap, Efron & Tibshirani 1993, ch. 16).
    An interval that excludes 0 means the difference is unlikely to come from the question sample.
    Metrics: the dataset's answer metrics, and nDCG@10 / MRR@10 / recall@K when the rows carry them.

    Returns
    -------
    dict
        ``{"<m> - <base>": {metric: {"mean", "lo", "hi", "n"}}}`` for every ``m`` after the first.
    """
    if len(methods) < 2:
        return {}
    if k is None:
        k = max((len(r.get("order", [])) for r in rows), default=1) or 1
    base = methods[0]
    by = {(r["method"], r["qid"]): r for r in rows}
    out: dict[str, dict[str, Any]] = {}
    for m in methods[1:]:
        qids = [q for (mm, q) in by if mm == m and (base, q) in by]
        res: dict[str, Any] = {}
        for name in metric_names(dataset, k):
            diffs = [by[(m, q)]["metrics"][name] - by[(base, q)]["metrics"][name] for q in qids
                     if name in by[(m, q)]["metrics"] and name in by[(base, q)]["metrics"]]
            if diffs or name in DATASET_METRICS[dataset]:
                res[name] = bootstrap_ci(diffs, n_bootstrap, seed)
        out[f"{m} - {base}"] = res
    return out


HEADLINE_ANSWER_METRICS: dict[str, tuple[str, ...]] = {
    "hotpotqa": ("f1", "em"),
    "nq-open": ("subspan_em", "f1"),
    "msmarco": ("rouge_l", "rougeL_official"),
}
"""The answer metrics of the headline table, per dataset (beside recall@K and nDCG@10)."""


def headline(
    rows: Sequence[dict[str, Any]], dataset: str, methods: Sequence[str], k: int, n_bootstrap: int, seed: int,
    alpha: float = 0.05, pairs: Sequence[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The headline table: each method after the first against the first, Holm-corrected across all its rows.

    ``pairs`` replaces the default contrasts (``(m, methods[0])`` for each later method) by any
    ``(a, b)`` pairs, each read as ``a - b``: one reranker against several first stages, say,
    whose rows come from different runs on the same questions (``baseline`` is then ``None``).

    A row is (method, metric) for recall@K, nDCG@10 and the dataset's headline answer metrics
    (:data:`HEADLINE_ANSWER_METRICS`): the mean paired difference with its 95% paired-bootstrap
    interval, the two-sided bootstrap p-value (:func:`ragkit.eval.stats.paired_p_value`), the
    Holm-adjusted p-value over the ``m`` rows of the table (:func:`ragkit.eval.stats.holm`; Holm,
    1979) and the Holm interval: the percentile interval at level ``1 − alpha / (m − r)`` for the
    row with the ``r``-th smallest p-value (0-based), the level Holm's step-down tests it at.
    ``holds`` is the test's verdict, the adjusted p-value below alpha; read it, not the interval.
    The two usually agree, but a Holm interval can exclude 0 on a row that does not hold: the
    step-down stops at the first row it cannot reject and rejects none after it, and for
    differences that take few values (EM's -1, 0, 1) the centred-bootstrap p-value and the
    percentile interval can fall on either side of the level.
    """
    from ragkit.eval.stats import holm, paired_p_value

    if pairs is None:
        if len(methods) < 2:
            return {"baseline": methods[0] if methods else None, "alpha": alpha, "rows": []}
        pairs = [(m, methods[0]) for m in methods[1:]]
        base: str | None = methods[0]
    else:
        base = None
    by = {(r["method"], r["qid"]): r for r in rows}
    metrics = (recall_key(k), "ndcg@10", *HEADLINE_ANSWER_METRICS.get(dataset, DATASET_METRICS[dataset][:1]))
    entries: list[dict[str, Any]] = []
    diffs_of: list[list[float]] = []
    for m, b in pairs:
        qids = [q for (mm, q) in by if mm == m and (b, q) in by]
        for name in metrics:
            both = [(by[(m, q)]["metrics"][name], by[(b, q)]["metrics"][name]) for q in qids
                    if name in by[(m, q)]["metrics"] and name in by[(b, q)]["metrics"]]
            if not both:
                continue
            x, y = [u for u, _ in both], [v for _, v in both]
            d = [u - v for u, v in both]
            ci = bootstrap_ci(d, n_bootstrap, seed)
            entries.append({"contrast": f"{m} - {b}", "method": m, "metric": name, "mean": ci["mean"],
                            "lo": ci["lo"], "hi": ci["hi"], "n": ci["n"],
                            "p": paired_p_value(x, y, seed=seed, n_boot=n_bootstrap)})
            diffs_of.append(d)
    adjusted = holm([e["p"] for e in entries]) if entries else []
    order = sorted(range(len(entries)), key=lambda i: entries[i]["p"])
    for rank, i in enumerate(order):
        level = alpha / (len(entries) - rank)
        hci = bootstrap_ci(diffs_of[i], n_bootstrap, seed, alpha=level)
        entries[i].update(p_holm=adjusted[i], holm_lo=hci["lo"], holm_hi=hci["hi"], holds=bool(adjusted[i] < alpha))
    return {"baseline": base, "alpha": alpha, "family": len(entries), "rows": entries}


def _model_passes(ranking: RankedList) -> float:
    """The reranker's own forward passes for one query: its call's ``info.forward_passes`` over the call's queries.

    Encoder passes (one per question-passage pair, or per text embedded) for a cross-encoder or
    student, which the generator meter does not see; generator forwards for a generator reranker.
    """
    return round(ranking.info.forward_passes / max(1, ranking.info.batch_queries), 2)


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
    pool: Sequence[QARecord] | None = None,
    reuse: Sequence[str | os.PathLike[str]] = (),
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
        Pre-loaded questions / a :class:`ragkit.generation.Generator` (else built from ``cfg``).
    pool
        With ``records``: the records whose passages form the retriever's corpus (default: ``records``).
        Without ``records`` the corpus pools every record of ``cfg``'s data file.
    reuse
        Finished reports whose rows this run may take instead of computing them: the methods they
        ran with this run's settings on the same candidates (see the module docstring).
    on_chunk
        Progress callback, called after each chunk is appended (fsync'd) to the partial file with
        the number of items appended so far in this call; an exception it raises stops the run,
        which a later call resumes.

    Notes
    -----
    Methods run in ``cfg.methods`` order, except that a method whose rankings another reuses
    (:func:`ranking_sources`) runs before it; the reusing rows' ``cost`` includes the reused
    ranking's ``ranking_cost`` (see the module docstring).

    Returns
    -------
    dict
        The report (``config``, ``models``, ``aggregate``, ``outputs``, ...).
    """
    t0 = time.perf_counter()
    out_path = Path(out)
    md_path = Path(report_md) if report_md else out_path.with_suffix(".md")
    pool_recs: list[QARecord] | None = None
    if records is not None:
        recs = list(records)
        pool_recs = list(pool) if pool is not None else None
    else:
        pool_recs = _load_all(cfg)
        recs = select_questions(cfg, pool_recs)
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

    partial = partial_path(out_path)
    fp = cfg.fingerprint()
    finished_rows: dict[tuple[str, str], dict[str, Any]] | None = None  # the finished report's, read once
    if resume and not partial.exists() and out_path.is_file():
        finished, finished_rows = _finished_report(out_path, fp)
        if finished is not None and plot_dir is None \
                and _same_run(finished, cfg, [(m, r.id) for m in cfg.methods for r in recs]):
            # rewriting it would only replace its wall time, corpus size and profiles with a no-op's
            logger.info("%s is finished with this configuration; nothing to run, the report is left as it is", out_path)
            return finished
    done = {(r["method"], r["qid"]): r
            for r in (_check_resumed_row(partial, i, r) for i, r in resume_appended_jsonl(
                partial, {"_fingerprint": fp, "config": asdict(cfg)}, resume, key="_fingerprint", with_lines=True))}
    if done:
        logger.info("resuming: %d (method, question) outputs already in %s", len(done), partial)
    elif resume and out_path.is_file():
        done = finished_rows if finished_rows is not None else _finished_report(out_path, fp)[1]
        if done:
            logger.info("resuming: %d (method, question) outputs of the finished report %s", len(done), out_path)

    todo = {m: [r for r in recs if (m, r.id) not in done] for m in cfg.methods}
    n_todo = sum(len(v) for v in todo.values())
    offered = {key: row for key, row in _reusable_rows(reuse, cfg).items() if key not in done} if reuse else {}
    t_load = time.perf_counter()
    cands_by_id: dict[str, RankedList] = {}
    corpus_size: int | None = None
    if n_todo:
        # retrieval always sees all records (the pooled corpus must not depend on what is done)
        retriever = None
        if cfg.retriever != "given":
            corpus = pipeline_corpus(cfg, pool_recs if pool_recs is not None else recs)
            if not corpus:
                raise ValueError(f"the records have no passages to pool for --retriever {cfg.retriever}; use a "
                                 "dataset file with passages (e.g. the NQ-open oracle file) or add --corpus FILE")
            corpus_size = len(corpus)
            retriever = build_retriever(cfg, corpus)
        all_cands = candidates_for(cfg, recs, retriever)
        cands_by_id = {r.id: c for r, c in zip(recs, all_cands)}
        taken = [row for m, items in todo.items() for r in items if (row := offered.get((m, r.id))) is not None
                 and row["candidates"] == cands_by_id[r.id].ids()]
        if len(taken) < sum(1 for m, items in todo.items() for r in items if (m, r.id) in offered):
            logger.warning("some reusable rows have other candidates than this run retrieves (another corpus?): "
                           "those questions run again")
        if taken:
            append_jsonl(partial, taken)
            for row in taken:
                done[(row["method"], row["qid"])] = row
            logger.info("reusing %d (method, question) outputs of %s", len(taken), ", ".join(map(str, reuse)))
            todo = {m: [r for r in recs if (m, r.id) not in done] for m in cfg.methods}
            n_todo = sum(len(v) for v in todo.values())
        if generator is None and n_todo:
            from ragkit.generation import load_generator

            generator = load_generator(
                cfg.model,
                device=cfg.device,
                dtype=cfg.dtype,
                template=cfg.template,
                batch_size=cfg.batch_size,
                passage_max_tokens=cfg.passage_max_tokens,
                show_progress=False,
            )
    load_s = time.perf_counter() - t_load

    appended = 0
    profiles: dict[str, list[dict[str, Any]]] = {}
    # a bar advanced by whole chunks (update(n), not iteration: an iterated bar shows an item only when the
    # next is asked for, one chunk late); smoothing=0 bases the ETA on the average rate since the start,
    # the right one for equal chunks that finish in bursts
    bar: Any = progress(iter(()), show=show_progress if n_todo else False, desc="eval", unit="q", total=n_todo,
                        smoothing=0.0, delay=0)
    bar_update = getattr(bar, "update", None)
    sources = ranking_sources(cfg)
    # rankings of a source method kept for the methods that reuse them: {source: {qid: (ranking, ranking_cost)}}
    kept: dict[str, dict[str, tuple[RankedList, dict[str, Any]]]] = {b: {} for b in sources.values()}
    # a source ranks before the methods that reuse it (the report keeps cfg.methods' order)
    for m in [m for m in cfg.methods if m not in sources] + [m for m in cfg.methods if m in sources]:
        items = todo[m]
        if not items:
            continue
        method = _method(m, generator, cfg)
        cache = kept.get(sources.get(m, ""), {})
        for start in range(0, len(items), cfg.chunk_size):
            chunk = items[start : start + cfg.chunk_size]
            cands = [cands_by_id[r.id] for r in chunk]
            args = (
                [r.query for r in chunk],
                [c.passages() for c in cands],
                # the dataset's order has no retriever scores (its k..1 only sort it): MoI's
                # blend="auto" then leaves an order that may be random (HotpotQA) unblended
                None if cfg.retriever == "given" else [c.scores() for c in cands],
                # gold answers reach only oracle rerankers (moi_gold), never the answerer
                [list(r.answers) for r in chunk] if method.needs_answers else None,
            )
            # reuse only whole chunks, so a ranking is always one of a batch cut as a run without reuse cuts it
            reused = bool(cache) and all(r.id in cache for r in chunk)
            tc = time.perf_counter()
            with metered() as meter:  # this run's model work only (meters are per context)
                with metered() as rank_meter:  # nested: the ranking's share of it
                    rankings = [cache[r.id][0] for r in chunk] if reused else method.rank_many(*args)
                rank_s = time.perf_counter() - tc
                outs = method.run_many(*args, True, rankings=rankings)
            cost = meter.per_item(len(chunk), time.perf_counter() - tc)
            rows = [_row(m, r, c, o, dataset, cost) for r, c, o in zip(chunk, cands, outs)]
            rank_cost = rank_meter.per_item(len(chunk), rank_s)
            for r, row, rk in zip(chunk, rows, rankings):
                if reused:  # the ledger charges the ranking this row stands on, then its own placement + answer
                    row["ranking_cost"] = base_cost = cache[r.id][1]
                    row["ranking_reused_from"] = sources[m]
                    row["cost"].update({key: round(row["cost"][key] + base_cost[key], 4 if key == "seconds" else 2)
                                        for key in SHARE_KEYS})
                    row["seconds"] = row["cost"]["seconds"]
                else:
                    row["ranking_cost"] = {"generator_calls": int(rk.info.generator_calls), **rank_cost,
                                           "model_passes": _model_passes(rk)}
                if m in kept:
                    kept[m][r.id] = (rk, row["ranking_cost"])
            append_jsonl(partial, rows)
            for row in rows:
                done[(m, row["qid"])] = row
            if bar_update is not None:
                bar_update(len(rows))
            appended += len(rows)
            if on_chunk is not None:
                on_chunk(appended)
        if hasattr(method, "profiles_used"):
            profiles[m] = method.profiles_used()
    if hasattr(bar, "close"):
        bar.close()
    profiles = {m: profiles[m] for m in cfg.methods if m in profiles}

    rows_final = [done[(m, r.id)] for m in cfg.methods for r in recs]
    add_ranking_metrics(rows_final, cfg.k)
    agg = aggregate(rows_final, dataset, cfg.methods, cfg.n_bootstrap, cfg.seed, cfg.k)
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
        # which position profile each method used (file / cache / calibrated / embedded / flat, path, sha256):
        # a cached `ragkit bias-profile` changes results, so the report names it
        "profiles": profiles,
        "metrics": list(DATASET_METRICS[dataset]),
        "ranking_metrics": [*RANKING_METRICS, recall_key(cfg.k)],
        "protocol": {"candidates": cfg.n_candidates, "k": cfg.k, "retriever": cfg.retriever,
                     "corpus_passages": corpus_size, "offset": cfg.offset},
        "aggregate": agg,
        "paired": paired_differences(rows_final, dataset, cfg.methods, cfg.n_bootstrap, cfg.seed, cfg.k),
        "headline": headline(rows_final, dataset, cfg.methods, cfg.k, cfg.n_bootstrap, cfg.seed),
        "timing": {
            "total_seconds": round(time.perf_counter() - t0, 3),
            "setup_seconds": round(load_s, 3),
            "resumed_items": len(rows_final) - appended - sum("reused_from" in r for r in rows_final),
            "reused_items": sum("reused_from" in r for r in rows_final),
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
