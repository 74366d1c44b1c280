"""Tests of the CORD order perturbations (interpolation space, score-aware alpha, Kendall tau)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from ragkit.training.perturb import (
    OrderPerturbation,
    alpha_max,
    interpolate_order,
    kendall_distance,
    kendall_tau,
    minmax,
    sample_alpha,
)


def test_alpha_zero_is_the_retriever_order() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = np.sort(rng.normal(size=8))[::-1]
        assert interpolate_order(s, 0.0, rng).tolist() == list(range(8))
    # unsorted scores: alpha=0 sorts by score (ties by index)
    assert interpolate_order([1.0, 3.0, 2.0, 3.0], 0.0, 0).tolist() == [1, 3, 2, 0]


def test_alpha_one_is_a_uniform_shuffle() -> None:
    k, n = 5, 5000
    rng = np.random.default_rng(1)
    s = np.array([100.0, 1.0, 0.5, 0.2, 0.0])  # strongly skewed: must not matter at alpha = 1
    counts = np.zeros((k, k), dtype=int)  # counts[passage, slot]
    for _ in range(n):
        order = interpolate_order(s, 1.0, rng)
        counts[order, np.arange(k)] += 1
    for p in range(k):
        assert chisquare(counts[p]).pvalue > 1e-3, counts[p]
    assert chisquare(counts.ravel()).pvalue > 1e-3


def test_mean_kendall_tau_falls_as_alpha_grows() -> None:
    rng = np.random.default_rng(2)
    s = np.linspace(1.0, 0.0, 10)
    means = [np.mean([kendall_tau(interpolate_order(s, a, rng)) for _ in range(400)])
             for a in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert means[0] == 1.0
    assert all(x > y for x, y in zip(means, means[1:])), means
    assert abs(means[-1]) < 0.05


def test_close_scores_swap_first() -> None:
    rng = np.random.default_rng(3)
    s = [10.0, 9.99, 5.0, 0.0]
    orders = [interpolate_order(s, 0.2, rng) for _ in range(500)]
    swap01 = np.mean([o[0] == 1 for o in orders])
    swap23 = np.mean([o[2] == 3 for o in orders])
    assert swap01 > 0.3 and swap23 == 0.0


def test_kendall_tau_and_distance() -> None:
    assert kendall_tau([0, 1, 2, 3]) == 1.0
    assert kendall_tau([3, 2, 1, 0]) == -1.0
    assert kendall_distance([1, 0, 2]) == pytest.approx(1 / 3)
    assert kendall_tau([0]) == 1.0
    with pytest.raises(ValueError, match="permutation"):
        kendall_tau([0, 0, 1])


def test_alpha_max_is_score_aware() -> None:
    assert alpha_max([1.0, 1.0, 1.0]) == 1.0  # flat: order carries no information
    assert alpha_max([5.0]) == 0.0
    dominant = [10.0, 1.0, 0.9, 0.8, 0.7]
    flatish = [1.0, 0.99, 0.9, 0.8, 0.7]
    assert alpha_max(dominant) < 0.1 < alpha_max(flatish)
    assert alpha_max(flatish, gamma=0.1) > alpha_max(flatish, gamma=1.0) > alpha_max(flatish, gamma=10.0)
    rng = np.random.default_rng(4)
    draws = [sample_alpha(flatish, 1.0, rng) for _ in range(200)]
    assert 0.0 <= min(draws) and max(draws) <= alpha_max(flatish)
    with pytest.raises(ValueError, match="gamma"):
        alpha_max(flatish, gamma=-1)


def test_minmax_and_bad_input() -> None:
    assert minmax([2.0, 4.0, 3.0]).tolist() == [0.0, 1.0, 0.5]
    assert minmax([3.0, 3.0]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="alpha"):
        interpolate_order([1.0, 0.0], 1.5, 0)
    with pytest.raises(ValueError, match="finite"):
        interpolate_order([1.0, float("nan")], 0.5, 0)


def test_order_perturbation_is_seeded() -> None:
    pert = OrderPerturbation(gamma=0.5)
    a = pert.sample([3.0, 2.9, 2.8, 1.0], rng=7)
    b = pert.sample([3.0, 2.9, 2.8, 1.0], rng=7)
    assert a[0].tolist() == b[0].tolist() and a[1] == b[1]
    o, alpha = OrderPerturbation(alpha=1.0).sample(None, k=6, rng=1)
    assert sorted(o.tolist()) == list(range(6)) and alpha == 1.0
    assert OrderPerturbation(alpha=0.9, alpha_cap=0.0).sample(None, k=4, rng=1)[0].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="k"):
        OrderPerturbation().sample(None)
    with pytest.raises(ValueError, match="alpha"):
        OrderPerturbation(alpha=2.0)
