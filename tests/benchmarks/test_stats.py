"""benchmarks/_stats.py: per-query ranking metrics and the paired bootstrap, on hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _stats import paired_ci, rank_metrics  # noqa: E402


@pytest.mark.parametrize(("ranking", "gold", "mrr", "rec2"), [
    (["a", "b", "c"], {"a"}, 1.0, 1.0),              # gold first
    (["x", "y", "g1", "g2"], {"g1", "g2"}, 1 / 3, 0.0),  # first gold at rank 3, none in the top 2
    (["x", "g2", "y", "g1"], {"g1", "g2"}, 0.5, 0.5),  # one of two gold in the top 2
    (["x"] * 10 + ["g"], {"g"}, 0.0, 0.0),           # gold at rank 11: outside MRR@10
])
def test_rank_metrics_hand_values(ranking: list[str], gold: set[str], mrr: float, rec2: float) -> None:
    assert rank_metrics(ranking, gold, 10) == pytest.approx((mrr, rec2))


def test_paired_ci_is_the_mean_difference_with_an_interval_around_it() -> None:
    x = [1.0, 0.5, 0.0, 1.0]
    y = [0.5, 0.5, 0.0, 0.0]
    mean, low, high = paired_ci(x, y, seed=0)
    assert mean == pytest.approx(0.375)  # (0.5 + 0 + 0 + 1) / 4
    assert 0.0 <= low <= mean <= high <= 1.0
    assert paired_ci([0.2, 0.2], [0.2, 0.2]) == pytest.approx([0.0, 0.0, 0.0])
    assert paired_ci(x, y, seed=0) == paired_ci(x, y, seed=0)  # seeded
