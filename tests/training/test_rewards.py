"""Group similarity rewards of PS-GRPO (exact and the kappa/s approximation)."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.similarity import make_cosine_similarity, sim_bleu2
from ragkit.training.rewards import (
    approx_comparisons,
    approx_group_similarity_rewards,
    exact_comparisons,
    gold_f1,
    group_similarity_rewards,
)

ANSWERS = ["Paris", "the city of Paris", "London", "Rome, Italy", "Paris France", "1844", "yes", "no"]


def _random_rollouts(n: int, g: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[ANSWERS[int(k)] for k in rng.integers(0, len(ANSWERS), g)] for _ in range(n)]


class Counting:
    """A batched similarity that counts its pair evaluations."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, hyps, refs):
        self.calls += len(hyps)
        return sim_bleu2(hyps, refs)


@pytest.mark.parametrize("sim", ["bleu2", "rougel", "f1"])
def test_identical_answers_max_reward_and_lone_dissenter_lowest(sim: str) -> None:
    same = [["Arthur's Magazine"] * 3 for _ in range(4)]
    r = group_similarity_rewards(same, sim=sim)
    assert r.shape == (4, 3) and np.allclose(r, 1.0)
    mixed = [["Arthur's Magazine"] * 3 for _ in range(3)] + [["First for Women"] * 3]
    r2 = group_similarity_rewards(mixed, sim=sim)
    assert np.all(r2[3] < r2[:3].min())  # the dissenter is lowest
    assert r2[3].max() == 0.0 and np.all(r2 <= r + 1e-12)


def test_empty_answers_never_agree() -> None:
    r = group_similarity_rewards([[""] * 2, [""] * 2, ["x y"] * 2])
    assert np.all(r[:2] == 0.0)


def test_exact_matches_brute_force_and_counts() -> None:
    rolls = _random_rollouts(5, 3, seed=1)
    cnt = Counting()
    r, c = group_similarity_rewards(rolls, sim=cnt, return_count=True)
    assert c == cnt.calls == exact_comparisons(5, 3) == 5 * 3 * 4 * 3
    for i in range(5):
        for j in range(3):
            others = [y for i2 in range(5) if i2 != i for y in rolls[i2]]
            want = np.mean(sim_bleu2([rolls[i][j]] * len(others), others))
            assert r[i, j] == pytest.approx(want)


def test_gold_term_added() -> None:
    rolls = [["Paris", "London"], ["Paris", "Paris"]]
    base = group_similarity_rewards(rolls)
    with_gold = group_similarity_rewards(rolls, gold=["Paris"], gold_weight=0.5)
    assert np.allclose(with_gold - base, 0.5 * gold_f1(["Paris", "London", "Paris", "Paris"], ["Paris"]).reshape(2, 2))
    a, _ = approx_group_similarity_rewards(rolls, kappa=1, s=2, rng=0, gold=["Paris"], gold_weight=0.5)
    assert np.allclose(a, with_gold)  # kappa=n-1, s=g is exact


def test_approximation_counts_comparisons() -> None:
    n, g, kappa, s = 6, 4, 3, 1
    rolls = _random_rollouts(n, g, seed=2)
    cnt = Counting()
    _, c = approx_group_similarity_rewards(rolls, kappa=kappa, s=s, rng=0, sim=cnt)
    assert c == cnt.calls == n * g * kappa * s == 72 == approx_comparisons(n, g, kappa, s)
    cnt2 = Counting()
    group_similarity_rewards(rolls, sim=cnt2)
    assert cnt2.calls == n * g * (n - 1) * g == 480


def test_approximation_is_unbiased() -> None:
    rolls = _random_rollouts(6, 4, seed=3)
    exact = group_similarity_rewards(rolls)
    rng = np.random.default_rng(0)
    draws = 1500
    acc = np.zeros_like(exact)
    for _ in range(draws):
        acc += approx_group_similarity_rewards(rolls, kappa=2, s=1, rng=rng)[0]
    mean = acc / draws
    # standard error of a mean of 1500 draws of values in [0, 1] is <= 0.5/sqrt(1500) ~ 0.013
    assert np.max(np.abs(mean - exact)) < 0.05
    # and the approximation is not trivially exact: single draws vary
    one = [approx_group_similarity_rewards(rolls, kappa=2, s=1, rng=k)[0] for k in range(5)]
    assert any(not np.allclose(one[0], o) for o in one[1:])


def test_approximation_deterministic_given_seed_and_validation() -> None:
    rolls = _random_rollouts(4, 3, seed=4)
    a = approx_group_similarity_rewards(rolls, rng=7)[0]
    b = approx_group_similarity_rewards(rolls, rng=7)[0]
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="at least 2"):
        group_similarity_rewards([["a"]])
    with pytest.raises(ValueError, match="same number"):
        group_similarity_rewards([["a", "b"], ["a"]])
    with pytest.raises(ValueError, match="unknown similarity"):
        group_similarity_rewards(rolls, sim="meteor")


def test_cosine_similarity_with_tiny_encoder(tiny_encoder_dir) -> None:
    from sentence_transformers import SentenceTransformer

    enc = SentenceTransformer(str(tiny_encoder_dir), device="cpu")
    cos = make_cosine_similarity(enc)
    v = cos(["Paris", "Paris"], ["Paris", "the history of Roman aqueducts"])
    assert v[0] == pytest.approx(1.0, abs=1e-5) and 0.0 <= v[1] < 1.0
    r = group_similarity_rewards([["Paris"] * 2, ["Paris"] * 2], sim=cos)
    assert np.allclose(r, 1.0, atol=1e-5)
