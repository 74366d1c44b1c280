"""ragkit.eval: metrics, the evaluation runner, the position sweep and consistency metrics.

The dataset loaders live in the shared core, :mod:`ragkit.datasets`.

>>> from ragkit.datasets import load_dataset                        # doctest: +SKIP
>>> from ragkit.eval import f1_max, best_subspan_em                 # doctest: +SKIP
>>> recs = load_dataset("nq-open", "nq-open-oracle.jsonl.gz", limit=10)   # doctest: +SKIP

The runner (:func:`ragkit.eval.runner.run_eval`) is what ``ragkit eval`` calls.
"""

from __future__ import annotations

from typing import Any

from ragkit.eval.metrics import (
    best_subspan_em,
    bleu,
    exact_match,
    exact_match_max,
    f1_max,
    f1_score,
    ir_metrics,
    ir_metrics_per_query,
    rouge_l,
)

__all__ = [
    "exact_match",
    "exact_match_max",
    "f1_score",
    "f1_max",
    "best_subspan_em",
    "rouge_l",
    "bleu",
    "ir_metrics",
    "ir_metrics_per_query",
    "EvalConfig",
    "run_eval",
    "headline",
    "position_sweep",
    "SweepResult",
    "retriever_consistency",
    "generator_consistency",
    "end_to_end_consistency",
    "evaluate_consistency",
]

_LAZY = {
    "EvalConfig": "ragkit.eval.runner",
    "run_eval": "ragkit.eval.runner",
    "headline": "ragkit.eval.runner",
    "position_sweep": "ragkit.eval.sweep",
    "SweepResult": "ragkit.eval.sweep",
    "retriever_consistency": "ragkit.eval.consistency",
    "generator_consistency": "ragkit.eval.consistency",
    "end_to_end_consistency": "ragkit.eval.consistency",
    "evaluate_consistency": "ragkit.eval.consistency",
}


def __getattr__(name: str) -> Any:  # numpy-heavy modules load on first use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ragkit.eval' has no attribute {name!r}")
