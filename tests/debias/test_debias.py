"""Numeric tests of Mixture-of-Intervention: designs, estimator, profile, synthetic oracles."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.debias import MoI, PositionProfile
from ragkit.debias.designs import cyclic, is_latin_square, make_design, prior, random_design, slots_of
from ragkit.debias.estimators import design_matrix, ridge_utilities
from ragkit.debias.outcomes import OutcomeResult
from ragkit.debias.placement import place
from ragkit.types import Passage


def u_shape(k: int) -> np.ndarray:
    """A strictly varied U-shaped, recency-heavy profile (no two slots equal)."""
    x = np.linspace(-1, 1, k)
    w = 0.2 + x**2 + 0.3 * np.clip(x, 0, None) + 0.01 * np.arange(k)
    return w / w.sum()


def oracle(a: np.ndarray, u: np.ndarray, b: float = -2.0, noise: float = 0.0, seed: int = 0):
    """Outcome function o(π) = b + Σ_j a_j u_{π(j)} (+ Gaussian noise): a synthetic generator."""
    rng = np.random.default_rng(seed)

    def fn(generator, questions, passages, orderings, answers) -> list[OutcomeResult]:
        out = []
        for ods in orderings:
            o = np.array([b + float(np.dot(a, u[np.asarray(order)])) for order in ods])
            out.append(OutcomeResult(values=o + noise * rng.standard_normal(len(o)), generator_calls=len(ods)))
        return out

    return fn


def passages(k: int) -> list[Passage]:
    return [Passage(id=f"p{i}", text=f"passage number {i}") for i in range(k)]


# ------------------------------------------------------------------ designs
@pytest.mark.parametrize("k", [1, 2, 5, 10])
def test_cyclic_is_latin_square(k: int) -> None:
    d = cyclic(k)
    assert len(d) == k and is_latin_square(d)
    assert d[0] == list(range(k))


def test_non_latin_square_detected() -> None:
    assert not is_latin_square([[0, 1, 2], [0, 2, 1], [1, 0, 2]])
    assert not is_latin_square(prior(10, 3))


def test_prior_design() -> None:
    d = prior(10, 3)
    assert d[0] == list(range(10))
    assert d[1] == list(range(10))[::-1]
    assert d[2] == [(j + 5) % 10 for j in range(10)]
    assert len({tuple(o) for o in prior(10, 20)}) == 20
    assert len(prior(10, 50)) == 20  # capped at the 2k distinct orderings
    h = prior(10, 4, head=4)
    assert len(h) == 4 and all(o[4:] == list(range(4, 10)) for o in h)
    assert is_latin_square([o[:4] for o in h])
    assert len(prior(2, 3)) == 2  # identity and reversal coincide with the rotation


def test_random_design_seeded() -> None:
    a = random_design(6, 4, np.random.default_rng(3))
    b = random_design(6, 4, 3)
    assert a == b and len(a) == 4
    assert all(sorted(o) == list(range(6)) for o in a)


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_budget(bad: int) -> None:
    with pytest.raises(ValueError, match="budget"):
        prior(5, bad)
    with pytest.raises(ValueError, match="budget"):
        MoI.from_settings(None, outcome=oracle(np.ones(3) / 3, np.zeros(3)), budget=bad)
    with pytest.raises(ValueError, match="design"):
        make_design("zigzag", 4)


def test_design_matrix_and_slots() -> None:
    a = np.array([0.5, 0.3, 0.2])
    A = design_matrix([[2, 0, 1]], a)
    assert np.allclose(A, [[0.3, 0.2, 0.5]])
    assert slots_of([[2, 0, 1]]).tolist() == [[1, 2, 0]]
    with pytest.raises(ValueError, match="permutation"):
        design_matrix([[0, 0, 1]], a)


# ------------------------------------------------------------------ estimator
@pytest.mark.parametrize("k", [3, 5, 10])
def test_cyclic_exact_recovery(k: int) -> None:
    rng = np.random.default_rng(k)
    a, u = u_shape(k), rng.standard_normal(k)
    d = cyclic(k)
    o = np.array([-1.5 + a @ u[np.asarray(order)] for order in d])
    est = ridge_utilities(d, o, a, lam=0.0)
    assert np.allclose(est, u - u.mean(), atol=1e-8)  # exact up to the constant
    assert np.argsort(-est).tolist() == np.argsort(-u).tolist()


def test_flat_profile_falls_back_to_prior() -> None:
    k = 6
    d = cyclic(k)
    o = np.arange(k, dtype=float)
    scores = [6, 5, 4, 3, 2, 1]
    est = ridge_utilities(d, o, np.full(k, 1 / k), lam=0.1, scores=scores)
    assert np.argsort(-est).tolist() == list(range(k))
    with pytest.raises(ValueError, match="outcomes"):
        ridge_utilities(d, o[:3], np.full(k, 1 / k))


def test_prior_head_design_recovers_top_passage() -> None:
    """The retriever ranks the useful passage 2nd or 3rd; rotating the top-3 head finds it."""
    k = 10
    a = u_shape(k)
    for seed in range(20):
        rng = np.random.default_rng(seed)
        g = int(rng.integers(1, 3))
        u = 0.1 * rng.standard_normal(k)
        u[g] += 1.0
        d = prior(k, 3, head=3)
        o = np.array([a @ u[np.asarray(order)] for order in d])
        est = ridge_utilities(d, o, a, lam=0.1, scores=np.linspace(1, 0, k))
        assert int(np.argmax(est)) == g


def test_prior_design_beats_chance_on_one_useful_passage() -> None:
    """Three orderings (given, reversed, half rotation), no retriever scores, lam > 0."""
    k, hits = 10, 0
    a = u_shape(k)
    for seed in range(100):
        rng = np.random.default_rng(seed)
        g = int(rng.integers(k))
        u = 0.1 * rng.standard_normal(k)
        u[g] += 2.0
        d = prior(k, 3)
        o = np.array([a @ u[np.asarray(order)] for order in d])
        hits += int(np.argmax(ridge_utilities(d, o, a, lam=0.1)) == g)
    assert hits >= 25  # chance is 10 / 100


# ------------------------------------------------------------------ MoI end to end on an oracle
def test_moi_cyclic_recovers_exact_order() -> None:
    k = 8
    rng = np.random.default_rng(1)
    a, u = u_shape(k), rng.standard_normal(k)
    moi = MoI.from_settings(None, design="cyclic", outcome=oracle(a, u), lam=0.0, profile=PositionProfile(a),
                            fallback=False)
    (r,) = moi.run_batch(["q?"], [passages(k)], generate_answer=False)
    assert r.ranking.ids() == [f"p{i}" for i in np.argsort(-u)]
    assert r.generator_calls == k and len(r.orderings) == k
    # bias-aware placement puts the best passage into the heaviest slot
    assert r.order[int(np.argmax(a))] == int(np.argmax(u))
    assert sorted(r.order) == list(range(k))
    assert [p.id for p in r.passages()] == [f"p{i}" for i in r.order]


def test_moi_noisy_oracle_and_batching() -> None:
    k = 10
    us = [np.random.default_rng(s).standard_normal(k) for s in range(3)]
    a = u_shape(k)

    def fn(generator, questions, ps, orderings, answers):
        return [oracle(a, us[int(q)], noise=1e-5, seed=int(q))(None, [q], [p], [o], None)[0]
                for q, p, o in zip(questions, ps, orderings)]

    moi = MoI.from_settings(None, design="cyclic", outcome=fn, profile=PositionProfile(a), lam=1e-6, fallback=False)
    res = moi.run_batch(["0", "1", "2"], [passages(k)] * 3, generate_answer=False)
    for r, u in zip(res, us):
        assert r.ranking.ids()[0] == f"p{int(np.argmax(u))}"


def test_k1_and_empty_inputs() -> None:
    moi = MoI.from_settings(None, outcome=oracle(np.ones(1), np.zeros(1)))
    (r,) = moi.run_batch(["q?"], [passages(1)], generate_answer=False)
    assert r.ranking.ids() == ["p0"] and r.order == [0] and r.generator_calls == 0
    with pytest.raises(ValueError, match="no passages"):
        moi.run_batch(["q?"], [[]], generate_answer=False)
    with pytest.raises(ValueError, match="generator"):
        MoI.from_settings(None, outcome="consensus")
    with pytest.raises(ValueError, match="outcome"):
        MoI.from_settings(None, outcome="vibes")


def test_placement() -> None:
    a = np.array([0.1, 0.2, 0.3, 0.4])
    assert place([2, 0, 1, 3], "bias_aware", a) == [3, 1, 0, 2]
    assert place([2, 0, 1, 3], "ranked", a) == [2, 0, 1, 3]
    rec = PositionProfile.recency(10)
    order = place(list(range(10)), "bias_aware", rec.weights)
    assert order[-1] == 0 and order[:9] == list(range(1, 10))


# ------------------------------------------------------------------ profile
def test_profile_from_probe_and_flat_fallback(tmp_path) -> None:
    slot = np.array([[-2.0, -2.5, -1.0], [-2.2, -2.4, -1.2]])
    absent = np.array([-2.4, -2.4])
    p = PositionProfile.from_probe(slot, absent, model="m", shrink_z=0.0)
    assert np.isclose(p.weights.sum(), 1.0) and p.weights[1] == 0.0 and np.argmax(p.weights) == 2
    # no position signal: every slot equals the gold-absent baseline -> flat
    f = PositionProfile.from_probe(np.full((4, 5), -1.0), np.full(4, -1.0))
    assert np.allclose(f.weights, 0.2) and f.meta["kind"] == "flat-fallback"
    p.save(tmp_path / "prof.json")
    q = PositionProfile.load(tmp_path / "prof.json")
    assert np.allclose(q.weights, p.weights) and q.model == "m" and q.k == 3
    p.plot(tmp_path / "prof.png")
    assert (tmp_path / "prof.png").stat().st_size > 1000


def test_profile_shrinks_slot_effects_within_their_noise() -> None:
    """Q = 2, k = 3: outcomes (-1, -2, -3) and (-1, -3, -2), gold absent -2.5. Centred per question:
    (1, 0, -1) and (1, -1, 0): effects e = (1, -0.5, -0.5), standard errors (0, 0.5, 0.5). At z = 1
    the effects become (1, 0, 0): slot means (-1, -2, -2), weights ∝ (1.5, 0.5, 0.5) = (0.6, 0.2, 0.2).
    Raw (z = 0): slot means (-1, -2.5, -2.5), weights (1, 0, 0)."""
    slot = np.array([[-1.0, -2.0, -3.0], [-1.0, -3.0, -2.0]])
    absent = np.array([-2.5, -2.5])
    p = PositionProfile.from_probe(slot, absent, shrink_z=1.0)
    assert np.allclose(p.weights, [0.6, 0.2, 0.2])
    assert np.allclose(p.meta["slot_effect"], [1.0, -0.5, -0.5]) and np.allclose(p.meta["slot_se"], [0.0, 0.5, 0.5])
    assert np.allclose(p.meta["shrunk_slot_mean"], [-1.0, -2.0, -2.0])
    assert np.allclose(PositionProfile.from_probe(slot, absent, shrink_z=0.0).weights, [1.0, 0.0, 0.0])
    # the noisy slots tie, and tied slots are filled in slot order: the ranking goes in best first
    assert place([2, 0, 1], "bias_aware", p) == [2, 0, 1]
    # questions that disagree: raw slot means (-1.833, -2, -2.167) rank the slots, but the effects
    # (1/6, 0, -1/6) lie within 1.96 standard errors (0.601, 0, 0.601): the default profile is flat
    noisy = np.array([[-1.0, -2.0, -3.0], [-3.0, -2.0, -1.0], [-1.5, -2.0, -2.5]])
    assert np.allclose(PositionProfile.from_probe(noisy, np.full(3, -4.0)).weights, 1 / 3)
    assert np.allclose(PositionProfile.from_probe(noisy, np.full(3, -4.0), shrink_z=0.0).weights,
                       np.array([13, 12, 11]) / 36)
    with pytest.raises(ValueError, match="shrink_z"):
        PositionProfile.from_probe(slot, absent, shrink_z=-1.0)


def test_profile_validation_and_resize() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        PositionProfile(np.array([0.5, -0.1]))
    r = PositionProfile.recency(10)
    assert np.isclose(r.weights[-1], 0.3) and np.isclose(r.weights.sum(), 1.0)
    r5 = r.resized(5)
    assert r5.k == 5 and np.argmax(r5.weights) == 4 and np.isclose(r5.weights.sum(), 1.0)
    assert np.allclose(PositionProfile.flat(4).weights, 0.25)
