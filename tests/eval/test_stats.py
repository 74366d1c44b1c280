"""ragkit.eval.stats (intervals, p-values, Holm), rank_metrics and label_references, on hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.eval.metrics import rank_metrics
from ragkit.eval.stats import bootstrap_ci, gap_bootstrap, holm, paired_ci, paired_p_value
from ragkit.training.labels import label_references


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


def test_paired_ci_draws_the_resamples_by_hand() -> None:
    """Two questions, differences (1, 0): resample j is ``d[idx_j]`` with the seeded index draws."""
    x, y = [1.0, 0.0], [0.0, 0.0]
    idx = np.random.default_rng(7).integers(0, 2, size=(4, 2))
    means = np.array([1.0, 0.0])[idx].mean(axis=1)
    assert paired_ci(x, y, seed=7, n_boot=4) == pytest.approx(
        [0.5, float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))])
    with pytest.raises(ValueError, match="one value per question"):
        paired_ci([1.0], [1.0, 2.0])


def test_bootstrap_ci_leaves_out_missing_values() -> None:
    r = bootstrap_ci([1.0, None, float("nan"), 1.0], n_bootstrap=10)
    assert r == {"mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 2}
    assert bootstrap_ci([], 10)["n"] == 0


def test_holm_by_hand() -> None:
    """p = (0.01, 0.04, 0.03, 0.005), m = 4. Sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06,
    0.04*1 = 0.04 -> running max 0.06. Back in input order: (0.03, 0.06, 0.06, 0.02)."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm({"a": 0.5, "b": 0.6}) == pytest.approx({"a": 1.0, "b": 1.0})  # capped at 1
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([1.5])


def test_paired_p_value() -> None:
    assert paired_p_value([0.3, 0.3], [0.3, 0.3]) == 1.0  # no difference at all
    # every difference +1: the centred resamples are all 0, never as far as the observed 1
    assert paired_p_value([1.0] * 5, [0.0] * 5, n_boot=99) == pytest.approx(1 / 100)
    # symmetric differences (+1, -1): the observed mean 0 is matched by every resample
    assert paired_p_value([1.0, 0.0], [0.0, 1.0], n_boot=50) == 1.0


def test_gap_bootstrap_point_values() -> None:
    """Model a: slot means (0, -1) -> gap 1; model b: (0, 0) -> gap 0; b - a = -1. Every question has
    the same scores, so every resample gives the point value."""
    sweeps = {"a": {"per_question_slot_logprob": {"q1": [0.0, -1.0], "q2": [0.0, -1.0]}},
              "b": {"per_question_slot_logprob": {"q1": [0.0, 0.0], "q2": [0.0, 0.0]}},
              "c": {}}
    out = gap_bootstrap(sweeps, n_boot=20)
    assert out["n_questions"] == 2 and set(out["gap"]) == {"a", "b"}
    assert out["gap"]["a"] == {"value": 1.0, "ci95": [1.0, 1.0]}
    assert out["gap_difference"]["b - a"]["value"] == pytest.approx(-1.0)
    assert gap_bootstrap({"c": {}}) == {}


def test_seed_question_bootstrap_by_hand() -> None:
    from ragkit.eval.stats import seed_question_bootstrap

    # arm A: seeds 0 and 1 score 3 questions; arm B is one model. Point: mean(A) - mean(B) = 2.5 - 1 = 1.5
    a = {0: [2.0, 2.0, 2.0], 1: [3.0, 3.0, 3.0]}
    b = {0: [1.0, 1.0, 1.0]}
    r = seed_question_bootstrap(a, b, n_boot=400, seed=0)
    assert r["mean"] == pytest.approx(1.5) and r["n_seeds_a"] == 2 and r["n_seeds_b"] == 1 and r["n_questions"] == 3
    # questions are constant within a seed: the interval comes from the seed draw alone: {1, 1.5, 2}
    assert r["lo"] == pytest.approx(1.0) and r["hi"] == pytest.approx(2.0) and r["p"] == pytest.approx(1 / 401)
    # one seed per arm: the ordinary paired bootstrap over questions (the same draws as a hand loop)
    x, y = [0.1, 0.5, 0.9, 0.2], [0.0, 0.7, 0.4, 0.2]
    r1 = seed_question_bootstrap({0: x}, {0: y}, n_boot=300, seed=3)
    rng = np.random.default_rng(3)
    q = rng.integers(0, 4, size=(300, 4))
    d = np.asarray(x) - np.asarray(y)
    boots = d[q].mean(axis=1)
    assert r1["mean"] == pytest.approx(d.mean())
    assert r1["lo"] == pytest.approx(np.quantile(boots, 0.025)) and r1["hi"] == pytest.approx(np.quantile(boots, 0.975))
    # further levels are read off the same resamples: one call gives both nested intervals
    r2 = seed_question_bootstrap({0: x}, {0: y}, n_boot=300, seed=3, levels={"bonferroni": 0.01})
    assert {k: r2[k] for k in r1} == r1
    assert r2["lo_bonferroni"] == pytest.approx(np.quantile(boots, 0.005))
    assert r2["hi_bonferroni"] == pytest.approx(np.quantile(boots, 0.995))
    with pytest.raises(ValueError, match="strictly between"):
        seed_question_bootstrap({0: x}, {0: y}, levels={"bad": 0.0})
    # a single arm: its mean with an interval over seeds and questions
    assert seed_question_bootstrap(a, n_boot=50)["mean"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="same questions"):
        seed_question_bootstrap({0: [1.0], 1: [1.0, 2.0]})
    with pytest.raises(ValueError, match="different numbers"):
        seed_question_bootstrap({0: [1.0]}, {0: [1.0, 2.0]})


def test_contrast_family_holm_and_bonferroni() -> None:
    from ragkit.eval.stats import contrast_family, holm, seed_question_bootstrap

    rng = np.random.default_rng(0)
    base = {0: rng.normal(0, 1, 40).tolist()}
    up = {s: (np.asarray(base[0]) + 0.8 + rng.normal(0, 0.3, 40)).tolist() for s in (0, 1)}
    same = {s: (np.asarray(base[0]) + rng.normal(0, 0.3, 40)).tolist() for s in (0, 1)}
    fam = contrast_family({"up - base": (up, base), "same - base": (same, base)}, n_boot=500, seed=0)
    one = seed_question_bootstrap(up, base, n_boot=500, seed=0)
    assert {k: fam["up - base"][k] for k in one} == one  # each contrast is its own bootstrap
    assert fam["up - base"]["p_holm"] == holm([fam["up - base"]["p"], fam["same - base"]["p"]])[0]
    for v in fam.values():  # the simultaneous interval is wider
        assert v["lo_bonferroni"] <= v["lo"] and v["hi"] <= v["hi_bonferroni"]
    assert fam["up - base"]["lo_bonferroni"] > 0 and fam["same - base"]["lo_bonferroni"] < 0
    assert contrast_family({}) == {}
