"""benchmarks/_stats.py: per-query ranking metrics and the paired bootstrap, on hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _stats import label_references, paired_ci, rank_metrics  # noqa: E402


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


def test_label_references_hand_values() -> None:
    """The label's own ranking puts its gold 2nd of 3 (MRR 1/2, recall@2 1); a random order of 3
    with one gold: MRR (1 + 1/2 + 1/3) / 3 = 11/18, recall@2 2/3."""
    from types import SimpleNamespace

    lab = SimpleNamespace(ranking=["x", "g", "y"], passage_ids=["g", "x", "y"], gold_ids=["g"])
    refs = label_references([lab], seed=0, n_perm=3000)
    assert refs["teacher"] == {"mrr@10": [0.5], "recall@2": [1.0]}
    assert refs["random"]["mrr@10"][0] == pytest.approx(11 / 18, abs=0.02)
    assert refs["random"]["recall@2"][0] == pytest.approx(2 / 3, abs=0.03)
