"""MoI presence designs (issue 20), the separation test and blend, the adaptive budget (issue 15.3),
the per-model profile (issue 14.5) and tests that fail under mutations of MoI's estimator (issue 14.9).

Synthetic outcomes come from a known model with hand-chosen utilities; the end-to-end tests use
the tiny random LM of ``conftest.py`` (a real ``Generator``).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from ragkit.debias.designs import (
    DESIGNS,
    PRESENCE_DESIGNS,
    ablate,
    check_interventions,
    keep_masks,
    loo,
    make_design,
    mixed,
)
from ragkit.debias.estimators import (
    UtilityFit,
    blend_with_retriever,
    lasso,
    logit_of_logprob,
    loo_utilities,
    mixed_utilities,
    retriever_prior,
    ridge_utilities,
    separates,
    surrogate_utilities,
)
from ragkit.debias.moi import MoI
from ragkit.debias.outcomes import OutcomeResult
from ragkit.debias.profile import PositionProfile, profile_cache_path
from ragkit.debias.reranker import MoIReranker
from ragkit.types import Passage, QARecord


def passages(k: int) -> list[Passage]:
    return [Passage(id=f"p{i}", text=f"passage number {i}") for i in range(k)]


def subset_outcome(u: np.ndarray, a: np.ndarray | None = None, b: float = -2.0, noise: float = 0.0,
                   seed: int = 0, logprob: bool = False):
    """A synthetic generator: ``o = b + Σ_j a_{k − L + j} u_{π(j)}`` over the passages present.

    ``a`` is start-indexed for ``k`` slots; an intervention of length ``L`` uses its last ``L``
    weights (slot counted from the end of the block). ``a=None``: every present passage weighs 1
    (a pure presence model). ``logprob``: return ``log σ(...)`` (a log-probability whose logit is
    the linear predictor).
    """
    rng = np.random.default_rng(seed)
    k = u.shape[0]
    w = np.ones(k) if a is None else np.asarray(a, dtype=float)

    def lin(order: list[int]) -> float:
        L = len(order)
        return b + sum(w[k - L + j] * u[p] for j, p in enumerate(order))

    def fn(generator, questions, ps, orderings, answers) -> list[OutcomeResult]:
        out = []
        for ods in orderings:
            x = np.array([lin(list(o)) for o in ods]) + noise * rng.standard_normal(len(ods))
            out.append(OutcomeResult(values=-np.log1p(np.exp(-x)) if logprob else x, generator_calls=len(ods)))
        return out

    return fn


# ------------------------------------------------------------------ designs
def test_loo_design_hand() -> None:
    assert loo(3) == [[0, 1, 2], [1, 2], [0, 2], [0, 1]]
    assert make_design("loo", 3) == loo(3)
    with pytest.raises(ValueError, match="k \\+ 1"):
        make_design("loo", 3, budget=2)


def test_ablate_and_mixed_designs() -> None:
    d = ablate(6, rng=3)
    assert len(d) == 12 and d == ablate(6, rng=np.random.default_rng(3))  # default N = 2k, seeded
    assert all(r == sorted(r) for r in d)  # kept passages stay in retriever order
    z = keep_masks(ablate(10, 400, rng=0), 10)
    assert 0.45 < z.mean() < 0.55  # keep probability 0.5
    m = mixed(6, rng=1)
    assert len(m) == 18 and m == mixed(6, rng=1)
    assert any(r != sorted(r) for r in m)  # random orders
    assert keep_masks([[2, 0], []], 3).tolist() == [[1, 0, 1], [0, 0, 0]]
    with pytest.raises(ValueError, match="distinct"):
        check_interventions([[0, 0]], 3)
    with pytest.raises(ValueError, match="p_keep"):
        ablate(3, p_keep=1.0)
    assert set(PRESENCE_DESIGNS) <= set(DESIGNS)


# ------------------------------------------------------------------ estimators, hand values
def test_loo_utilities_hand() -> None:
    # full -1.0; without p0 -1.5, without p1 -1.1, without p2 -0.9 -> drops 0.5, 0.1, -0.1
    fit = loo_utilities(loo(3), [-1.0, -1.5, -1.1, -0.9], 3)
    assert np.allclose(fit.utilities, [0.5, 0.1, -0.1])
    # the leave-one-out prompts may come in any order
    fit2 = loo_utilities([[0, 1, 2], [0, 1], [1, 2], [0, 2]], [-1.0, -0.9, -1.5, -1.1], 3)
    assert np.allclose(fit2.utilities, [0.5, 0.1, -0.1])
    with pytest.raises(ValueError, match="leave-one-out"):
        loo_utilities([[0, 1, 2], [0, 1]], [-1.0, -2.0], 3)


def test_logit_of_logprob() -> None:
    x = np.array([-3.0, 0.0, 2.5])
    assert np.allclose(logit_of_logprob(-np.log1p(np.exp(-x))), x)  # logit(σ(x)) = x
    assert np.isfinite(logit_of_logprob([0.0])).all()  # p = 1 is clipped, not inf


def test_lasso_matches_sklearn() -> None:
    sk = pytest.importorskip("sklearn.linear_model")
    rng = np.random.default_rng(0)
    X = (rng.random((30, 8)) < 0.5).astype(float)
    y = X @ np.arange(8.0) + rng.standard_normal(30)
    w, b = lasso(X, y, alpha=0.05)
    ref = sk.Lasso(alpha=0.05, tol=1e-12, max_iter=100000).fit(X, y)
    assert np.allclose(w, ref.coef_, atol=1e-6) and b == pytest.approx(ref.intercept_, abs=1e-6)
    # a large alpha zeroes every coefficient (sparsity)
    assert np.all(lasso(X, y, alpha=100.0)[0] == 0.0)


def test_ablate_surrogate_recovers_logit_weights() -> None:
    """Outcomes log σ(b + z·w): the ridge surrogate on the logit recovers w exactly, Lasso closely."""
    w = np.array([2.0, 0.0, -1.0, 0.5, 0.0, 1.0])
    k = w.shape[0]
    d = ablate(k, 4 * k, rng=2)
    z = keep_masks(d, k)
    o = -np.log1p(np.exp(-(-1.0 + z @ w)))
    fit = surrogate_utilities(d, o, k, method="ridge", lam=1e-10)
    assert np.allclose(fit.utilities, w, atol=1e-6)
    las = surrogate_utilities(d, o, k, method="lasso", alpha=0.01)
    assert np.abs(las.utilities - w).max() < 0.1
    assert np.argsort(-las.utilities)[:2].tolist() == [0, 5]
    # without the logit transform the fit is on the log-prob scale: the weights differ
    raw = surrogate_utilities(d, o, k, method="ridge", lam=1e-10, transform="none")
    assert not np.allclose(raw.utilities, w, atol=1e-2)


def test_mixed_recovers_utilities_and_slot_weights() -> None:
    k = 6
    a = np.array([0.08, 0.10, 0.12, 0.15, 0.20, 0.35])  # start-indexed, recency-heavy
    u = np.array([0.3, -0.5, 1.2, 0.0, 0.7, -0.2])
    d = mixed(k, 8 * k, rng=5)
    o = subset_outcome(u, a)(None, ["q"], [passages(k)], [d], None)[0].values
    fit = mixed_utilities(d, o, k)
    assert np.argsort(-fit.utilities).tolist() == np.argsort(-u).tolist()
    assert np.corrcoef(fit.utilities, u)[0, 1] > 0.9999
    # slot weights up to scale, on the slots next to the question (observed in most interventions)
    est = fit.weights[-4:] / fit.weights[-4:].sum()
    assert np.allclose(est, a[-4:] / a[-4:].sum(), atol=0.01)
    assert separates(fit)[0]


# ------------------------------------------------------------------ issue 14.9: mutations of the ridge estimator
def test_ridge_column_centring_hand() -> None:
    """k = 2, orderings [0,1] and [1,0], a = (0.25, 0.75), o = (-1, -2), lam = 1 (relative).

    Centred: A_c = [[-.25, .25], [.25, -.25]], o_c = (.5, -.5), G = A_cᵀA_c = [[.125, -.125],
    [-.125, .125]], λ = 1 · tr(G) / 2 = .125, A_cᵀo_c = (-.25, .25); (G + λI) u = A_cᵀo_c gives
    u = (-2/3, 2/3). Without centring (A itself) the same solve gives (-2/7, 2/7).
    """
    u = ridge_utilities([[0, 1], [1, 0]], [-1.0, -2.0], np.array([0.25, 0.75]), lam=1.0)
    assert np.allclose(u, [-2 / 3, 2 / 3], atol=1e-9)


def test_ridge_prior_rescaling_hand() -> None:
    """As above with retriever scores (1, 0): z = (1, -1), rescaled by std(o) / ||a − ā|| =
    .5 / (.25·√2) = √2, so u_prior = (√2, -√2). Right-hand side (-.25 + .125√2, .25 − .125√2),
    u = rhs / .375 = (-0.1952621, 0.1952621). Without the rescaling it would be (-1/3, 1/3).
    """
    u = ridge_utilities([[0, 1], [1, 0]], [-1.0, -2.0], np.array([0.25, 0.75]), lam=1.0, scores=[1.0, 0.0])
    x = (0.25 - 0.125 * np.sqrt(2)) / 0.375
    assert np.allclose(u, [-x, x], atol=1e-9) and x == pytest.approx(0.1952621, abs=1e-7)


# ------------------------------------------------------------------ separation test, blend, fallback
def test_separates_f_test_hand() -> None:
    """y = 0..5, fitted (.5, .5, 2, 3, 4.5, 4.5), p = 1: SS_tot = 17.5, SS_res = 1, d = 4,
    F = (16.5 / 1) / (1 / 4) = 66, P(F_{1,4} > 66) = 0.0012486."""
    fit = UtilityFit(utilities=np.zeros(1), fitted=np.array([0.5, 0.5, 2, 3, 4.5, 4.5]),
                     target=np.arange(6.0), n_params=1)
    ok, st = separates(fit)
    assert ok and st["f"] == pytest.approx(66.0) and st["pvalue"] == pytest.approx(0.0012486, abs=1e-6)
    assert st["r2"] == pytest.approx(1 - 1 / 17.5) and st["df_resid"] == 4
    assert not separates(fit, alpha=0.001)[0]
    # saturated (loo): the outcome must move and the best passage must stand out.
    # drops (1.0, 0.01, -0.005): median 0.01, MAD = median(0.99, 0, 0.015) = 0.015,
    # z = 0.6745 · 0.99 / 0.015 = 44.5 -> separated
    sat = loo_utilities(loo(3), [-1.0, -2.0, -1.01, -0.995], 3)
    ok, st = separates(sat)
    assert ok and st["max_z"] == pytest.approx(0.6745 * 0.99 / 0.015)
    # drops (0.02, 0.01, -0.005): MAD 0.01, z = 0.6745 < 3.5 -> no passage stands out
    assert not separates(loo_utilities(loo(3), [-1.0, -1.02, -1.01, -0.995], 3))[0]
    # drops (0.004, 0.0001, -0.00005) stand out (z = 17.5) but the outcome barely moved (< 0.01 nats)
    tiny = loo_utilities(loo(3), [-1.0, -1.004, -1.0001, -0.99995], 3)
    assert not separates(tiny)[0] and separates(tiny, min_spread=0.001)[0]


def test_blend_and_prior() -> None:
    assert np.allclose(retriever_prior(3), [1.2247449, 0.0, -1.2247449])
    assert np.allclose(retriever_prior(3, [0.1, 0.9, 0.5]), [-1.2247449, 1.2247449, 0.0])
    u = np.array([0.0, 1.0, 2.0])
    assert np.array_equal(blend_with_retriever(u, 0.0), u)
    assert np.allclose(blend_with_retriever(u, 1.0), retriever_prior(3))
    assert np.allclose(blend_with_retriever(u, 0.5), [0.0, 0.0, 0.0])  # z(u) = -prior
    with pytest.raises(ValueError, match="blend"):
        blend_with_retriever(u, 1.5)


def test_auto_blend_weighs_the_retriever_only_when_it_gave_scores() -> None:
    """``blend="auto"``: β = 0.75 with retriever scores, 0 without. Utilities u = (0, 0, 3, 0) on a
    list scored (3, 2, 1, 0): z(u) = (−0.577, −0.577, 1.732, −0.577), z(scores) = (1.342, 0.447,
    −0.447, −1.342); at β = 0.75 the blend is (0.862, 0.191, 0.098, −1.151), so the retriever's
    top two stay first; unblended, p2 leads."""
    k = 4
    out = subset_outcome(np.array([0.0, 0.0, 3.0, 0.0]))
    moi = MoI.from_settings(None, design="loo", outcome=out)
    assert moi.blend == "auto" and moi.blend_for([1.0] * k) == 0.75 and moi.blend_for(None) == 0.0
    (with_scores, without) = moi.run_batch(["q", "q"], [passages(k), passages(k)], [[3.0, 2.0, 1.0, 0.0], None],
                                          generate_answer=False)
    assert with_scores.ranking.ids() == ["p0", "p1", "p2", "p3"]
    assert with_scores.utilities == pytest.approx([0.862, 0.191, 0.098, -1.151], abs=1e-3)
    assert without.ranking.ids()[0] == "p2"
    (fixed,) = MoI.from_settings(None, design="loo", outcome=out, blend=0.0).run_batch(
        ["q"], [passages(k)], [[3.0, 2.0, 1.0, 0.0]], generate_answer=False)
    assert fixed.ranking.ids()[0] == "p2"
    with pytest.raises(ValueError, match="'auto'"):
        MoI.from_settings(None, design="loo", outcome=out, blend="retriever")


def test_fallback_keeps_retriever_order() -> None:
    """Outcomes that do not move: no separation -> the retriever order (by score), flagged."""
    k = 5
    flat = subset_outcome(np.zeros(k))
    for design in ("loo", "ablate", "mixed", "cyclic"):
        moi = MoI.from_settings(None, design=design, outcome=flat)
        (r,) = moi.run_batch(["q"], [passages(k)], [[0.1, 0.5, 0.3, 0.9, 0.2]], generate_answer=False)
        assert r.fallback, design
        assert r.ranking.ids() == ["p3", "p1", "p2", "p4", "p0"], design
    # the same outcomes with fallback off and no blend give the tie order (retriever index), not the scores
    (r,) = MoI.from_settings(None, design="loo", outcome=flat, fallback=False, blend=0.0).run_batch(
        ["q"], [passages(k)], [[0.1, 0.5, 0.3, 0.9, 0.2]], generate_answer=False)
    assert not r.fallback and r.ranking.ids() == [f"p{i}" for i in range(k)]


def test_fallback_on_noise_only_f_test() -> None:
    """ablate with outcomes that are pure noise: the F-test does not reject -> fallback."""
    k = 6
    moi = MoI.from_settings(None, design="ablate", outcome=subset_outcome(np.zeros(k), noise=0.3, seed=1),
                            transform="none",
              surrogate="ridge")
    (r,) = moi.run_batch(["q"], [passages(k)], generate_answer=False)
    assert r.fit_stats["df_resid"] >= 1 and r.fit_stats["pvalue"] > 0.05
    assert r.fallback and r.ranking.ids() == [f"p{i}" for i in range(k)]


@pytest.mark.parametrize("design", ["loo", "ablate", "mixed"])
def test_presence_designs_find_the_useful_passage(design: str) -> None:
    """The retriever puts the only useful passage 7th of 8; every presence design ranks it first."""
    k = 8
    u = np.array([0.05, -0.02, 0.0, 0.03, -0.04, 0.01, 1.5, 0.02])
    a = None if design != "mixed" else np.linspace(0.5, 1.5, k)
    moi = MoI.from_settings(None, design=design, outcome=subset_outcome(u, a, logprob=True), blend=0.0)
    (r,) = moi.run_batch(["q"], [passages(k)], [np.linspace(1, 0, k)], generate_answer=False)
    assert not r.fallback
    assert r.ranking.ids()[0] == "p6"
    assert len(r.orderings) == {"loo": k + 1, "ablate": 2 * k, "mixed": 3 * k}[design]
    # a blend of 1 is the retriever order
    (b,) = MoI.from_settings(None, design=design, outcome=subset_outcome(u, a, logprob=True), blend=1.0).run_batch(
        ["q"], [passages(k)], [np.linspace(1, 0, k)], generate_answer=False)
    assert b.ranking.ids() == [f"p{i}" for i in range(k)]


# ------------------------------------------------------------------ issue 15.3: adaptive budget
def test_adaptive_budget_stops_early_when_easy() -> None:
    k = 8
    a = np.array([0.2, 0.1, 0.05, 0.05, 0.05, 0.1, 0.15, 0.3])
    easy_u = np.array([0.0, 3.0, 0.1, -0.1, 0.05, 1.5, -0.05, 0.0])  # two clear winners, noise-free
    hard_u = np.zeros(k)  # nothing to find: the noise decides the top
    perm = lambda u, noise: subset_outcome(u, a, noise=noise, seed=3)  # noqa: E731  full orderings
    # the stopping rule is under test here, not the fallback (5 of 8 rotations smear the estimates)
    easy = MoI.from_settings(None, design="cyclic", budget="auto", outcome=perm(easy_u, 0.0),
                             profile=PositionProfile(a),
               lam=1e-3, fallback=False).run_batch(["q"], [passages(k)], generate_answer=False)[0]
    hard = MoI.from_settings(None, design="cyclic", budget="auto", outcome=perm(hard_u, 0.5),
                             profile=PositionProfile(a),
               lam=1e-3, fallback=False).run_batch(["q"], [passages(k)], generate_answer=False)[0]
    assert easy.rounds == 2 and len(easy.orderings) == 5  # 3 + 2, top-2 unchanged after round 2
    assert easy.ranking.ids()[0] == "p1"
    assert hard.rounds > easy.rounds and len(hard.orderings) > len(easy.orderings)
    assert len(hard.orderings) <= k and len({tuple(o) for o in hard.orderings}) == len(hard.orderings)
    assert easy.generator_calls == 5  # outcomes of earlier rounds are reused
    # presence design: rounds of masks, same stopping rule
    u = np.array([0.0, 0.1, 2.0, 0.0, 0.0, 0.0])
    r = MoI.from_settings(None, design="ablate", budget="auto", outcome=subset_outcome(u, logprob=True)).run_batch(
        ["q"], [passages(6)], generate_answer=False)[0]
    assert r.ranking.ids()[0] == "p2" and r.rounds == 2 and len(r.orderings) == 6 + 3
    with pytest.raises(ValueError, match="auto"):
        MoI.from_settings(None, outcome=perm(easy_u, 0.0), budget="many")


# ------------------------------------------------------------------ issue 14.5: the model's profile
class ProbeGenerator:
    """A synthetic generator for the gold-passage probe: outcome = -3 + 2·a_j with the gold
    passage (index 0 of each record's list) at slot j, -3 without it."""

    def __init__(self, a: np.ndarray, name: str = "org/my-model") -> None:
        from types import SimpleNamespace

        self.a, self.name = np.asarray(a), name
        self.template = SimpleNamespace(name="chat")
        self.calls = 0

    def score_orderings(self, questions, passages, orderings, answers):
        from ragkit.generation.generator import ScoreResult

        self.calls += 1
        out = []
        for ods in orderings:
            vals = [-3.0 + (2.0 * self.a[o.index(0)] if 0 in o else 0.0) for o in ods]
            out.append(ScoreResult.from_token_logprobs([np.array([v]) for v in vals]))
        return out


def probe_records(n: int = 3) -> list[QARecord]:
    ps = tuple(Passage(id=f"d{i}", text=f"text {i}") for i in range(7))
    return [QARecord(id=f"q{i}", question=f"question {i}?", answers=("x",), passages=ps, gold_ids=("d0",))
            for i in range(n)]


def test_calibration_recovers_known_profile() -> None:
    a = np.array([0.3, 0.1, 0.05, 0.15, 0.4])
    prof = PositionProfile.calibrate(ProbeGenerator(a), probe_records(), k=5, data="probe")
    assert np.allclose(prof.weights, a, atol=1e-6)
    assert prof.model == "org/my-model" and prof.template == "chat" and prof.k == 5
    assert prof.meta["data"] == "probe" and prof.meta["question_ids"] == ["q0", "q1", "q2"]


def test_profile_for_generator_cache_flat_and_embedded(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path))
    a = np.array([0.3, 0.1, 0.05, 0.15, 0.4])
    gen = ProbeGenerator(a, name=f"org/my-model-{tmp_path.name}")  # a name not warned about yet
    with caplog.at_level(logging.WARNING, logger="ragkit.debias.profile"):
        flat = PositionProfile.for_generator(gen, 5)
    assert np.allclose(flat.weights, 0.2) and "ragkit bias-profile" in caplog.text
    assert gen.calls == 0
    cal = PositionProfile.for_generator(gen, 5, calibrate=True, records=probe_records(4), n_questions=2)
    assert np.allclose(cal.weights, a, atol=1e-6) and gen.calls == 1
    path = profile_cache_path(gen.name, "chat", 5)
    assert path.is_file() and str(path).startswith(str(tmp_path))
    saved = json.loads(path.read_text())
    assert saved["model"] == gen.name and saved["template"] == "chat" and saved["k"] == 5
    assert saved["meta"]["question_ids"] == ["q0", "q1"] and "data" in saved["meta"]
    again = PositionProfile.for_generator(gen, 5)  # cached: no new calibration
    assert np.allclose(again.weights, a, atol=1e-6) and gen.calls == 1
    assert np.allclose(PositionProfile.for_generator(gen, 4).weights, 0.25)  # per k
    # the embedded SmolLM2: its measured recency profile
    emb = PositionProfile.for_generator(ProbeGenerator(a, name="SmolLM2-135M-Instruct"), 10)
    assert np.isclose(emb.weights[-1], 0.3)


def test_moi_uses_the_models_profile(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path))
    a = np.array([0.3, 0.1, 0.05, 0.15, 0.4])
    gen = ProbeGenerator(a)
    PositionProfile.calibrate(gen, probe_records(), k=5).save_cached()
    u = np.array([0.0, 0.2, 1.0, -0.3, 0.1])
    moi = MoI.from_settings(gen, design="cyclic", outcome=subset_outcome(u, a), lam=0.0)
    (r,) = moi.run_batch(["q"], [passages(5)], generate_answer=False)
    assert np.allclose(r.weights, a, atol=1e-6)
    assert r.ranking.ids() == [f"p{i}" for i in np.argsort(-u)]
    assert r.order[4] == 2  # bias-aware: the best passage into the heaviest slot (the last)
    # a profile JSON path works too
    path = tmp_path / "given.json"
    PositionProfile(np.array([0.5, 0.2, 0.1, 0.1, 0.1])).save(path)
    assert MoI.from_settings(gen, outcome=subset_outcome(u, a), profile=str(path)).profile_for(5).weights[0] == 0.5


def test_reports_can_name_the_profile_used(tmp_path, monkeypatch) -> None:
    """A profile knows where it came from (file / cache / calibrated / embedded / flat, path, sha256)."""
    import hashlib

    from ragkit.debias.presets import Method

    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path))
    a = np.array([0.3, 0.1, 0.05, 0.15, 0.4])
    gen = ProbeGenerator(a, name=f"org/prov-{tmp_path.name}")
    moi = MoI.from_settings(gen, design="cyclic", outcome=subset_outcome(np.zeros(5), a), lam=0.0)
    moi.profile_for(5)
    assert moi.profiles_used() == [{"source": "flat", "model": gen.name, "template": "chat", "k": 5}]
    cached = PositionProfile.calibrate(gen, probe_records(), k=5).save_cached()
    moi = MoI.from_settings(gen, design="cyclic", outcome=subset_outcome(np.zeros(5), a), lam=0.0)
    (prov,) = [moi.profile_for(5).provenance]
    assert prov["source"] == "cache" and prov["path"] == str(cached.resolve())
    assert prov["sha256"] == hashlib.sha256(cached.read_bytes()).hexdigest()
    assert "provenance" not in json.loads(cached.read_text())["meta"]  # never saved into the file
    given = tmp_path / "given.json"
    PositionProfile.load(cached).save(given)  # a loaded profile saved again holds no stale provenance
    assert "provenance" not in json.loads(given.read_text())["meta"]
    method = Method(MoIReranker(gen, design="cyclic", outcome="question"), "bias_aware", "single",
                    profile=PositionProfile.load(given))
    assert method.profiles_used()[0]["source"] == "file" and method.profiles_used()[0]["path"] == str(given)
    emb = PositionProfile.for_generator(ProbeGenerator(a, name="SmolLM2-135M-Instruct"), 10)
    assert emb.provenance["source"] == "embedded"


# ------------------------------------------------------------------ tiny real model end to end
def _words(k: int) -> list[Passage]:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    return [Passage(id=f"d{i}", title=f"T{i}", text=f"{words[i % 6]} is a word number {i}.") for i in range(k)]


@pytest.mark.parametrize("design", ["loo", "ablate", "mixed"])
def test_presence_designs_tiny_lm(gen, design: str) -> None:
    ps = _words(4)
    budget = {"loo": None, "ablate": 6, "mixed": 8}[design]
    moi = MoI.from_settings(gen, design=design, budget=budget, outcome="gold", max_new_tokens=2)
    (r,) = moi.run_batch(["Which word is number 1?"], [ps], [[4.0, 3.0, 2.0, 1.0]], answers_list=[["bravo"]])
    M = {"loo": 5, "ablate": 6, "mixed": 8}[design]
    assert len(r.orderings) == M and len(r.outcomes) == M and np.all(np.isfinite(r.outcomes))
    assert any(len(o) < 4 for o in r.orderings)  # passages were dropped
    assert sorted(r.ranking.ids()) == [p.id for p in ps] and sorted(r.order) == [0, 1, 2, 3]
    assert r.generator_calls == M + 1 and isinstance(r.answer, str)
    if design == "loo":  # the loo utilities are the drops of the real outcomes
        exp = r.outcomes[0] - r.outcomes[1:]
        assert not r.fallback and np.allclose(r.raw_utilities, exp)  # gold: no fallback (fallback="auto")
    # the gold outcome under the full prompt equals a plain score() of that prompt
    full = [o for o in r.orderings if len(o) == 4]
    if full:
        m = r.orderings.index(full[0])
        ref = gen.score([gen.build_prompt("Which word is number 1?", [ps[i] for i in full[0]])], ["bravo"]).mean[0]
        assert r.outcomes[m] == pytest.approx(ref, abs=1e-4)


def test_adaptive_consensus_tiny_lm(gen) -> None:
    """budget="auto" with the consensus outcome: every round re-scores all interventions (counted)."""
    ps = _words(5)
    (r,) = MoI.from_settings(gen, design="ablate", outcome="consensus", budget="auto", max_new_tokens=2).run_batch(
        ["Which word is number 3?"], [ps], generate_answer=False)
    assert 5 <= len(r.orderings) <= 20 and r.rounds == 1 + (len(r.orderings) - 5) // 2
    assert len(r.outcomes) == len(r.orderings) and sorted(r.ranking.ids()) == [p.id for p in ps]
    # each round generates (and, unless every answer is empty, scores) all interventions so far
    rounds_sizes = [5 + 2 * i for i in range(r.rounds)]
    assert sum(rounds_sizes) <= r.generator_calls <= 4 * sum(rounds_sizes)  # M generations + <= 3 tied scorings


def test_cli_presence_design_and_cached_profile(tiny_lm_dir, tmp_path, monkeypatch) -> None:
    """`ragkit bias-profile` caches the profile that `ragkit rerank` then uses; presence designs and
    budget=auto from the command line."""
    from ragkit.cli import main
    from ragkit.datasets import SAMPLE_HOTPOTQA
    from ragkit.io import write_jsonl

    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "p.jsonl"
    write_jsonl(f, [{"id": f"x{i}", "text": f"passage {i} text", "score": 3.0 - i} for i in range(3)])
    out = tmp_path / "r.json"
    assert main(["rerank", "--query", "which passage?", "--passages", str(f), "--model", str(tiny_lm_dir),
                 "--design", "loo", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["orderings"] == [[0, 1, 2], [1, 2], [0, 2], [0, 1]]
    assert main(["rerank", "--query", "q?", "--passages", str(f), "--model", str(tiny_lm_dir),
                 "--design", "ablate", "--budget", "auto", "--outcome", "full_answer", "--out", str(out)]) == 0
    assert len(json.loads(out.read_text())["orderings"]) >= 3
    prof = tmp_path / "prof.json"
    assert main(["bias-profile", "--data", str(SAMPLE_HOTPOTQA), "--k", "3", "--limit", "2", "--model",
                 str(tiny_lm_dir), "--out", str(prof)]) == 0
    saved = json.loads(prof.read_text())
    assert saved["meta"]["data"] == str(SAMPLE_HOTPOTQA) and len(saved["meta"]["question_ids"]) == 2
    cached = list((tmp_path / "cache" / "profiles").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["weights"] == saved["weights"]
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), show_progress=False)
    assert np.allclose(MoI.from_settings(gen).profile_for(3).weights, saved["weights"])  # picked up from the cache


def test_cli_eval_profile_file(tiny_lm_dir, tmp_path) -> None:
    """`ragkit eval --profile FILE`: the MoI method and its placement use the given profile."""
    from ragkit.cli import main

    prof = tmp_path / "prof.json"
    PositionProfile(np.array([0.1, 0.3, 0.6])).save(prof)  # heaviest last: bias-aware = reversed ranking
    out = tmp_path / "rep.json"
    assert main(["eval", "--methods", "none,moi_prior", "--limit", "1", "-k", "3", "--model", str(tiny_lm_dir),
                 "--max-new-tokens", "2", "--profile", str(prof), "--out", str(out), "--quiet"]) == 0
    rep = json.loads(out.read_text())
    assert rep["config"]["method_kwargs"]["moi_prior"] == {"profile": str(prof)}
    (row,) = [r for r in rep["outputs"] if r["method"] == "moi_prior"]
    assert [row["candidates"][i] for i in row["order"]] == row["ranking"][::-1]
    assert main(["eval", "--methods", "none", "--profile", str(tmp_path / "missing.json"),
                 "--out", str(out)]) == 1


def test_gold_outcome_never_falls_back_by_default(gen) -> None:
    """``fallback="auto"``: the gold outcome's utilities are the label (oracle, distillation), so a
    query whose drops do not pass the separation test still ranks by them; label-free outcomes and
    ``fallback=True`` keep the input order. ``min_spread`` is set above any drop of the tiny model so
    that the test fails for every query."""
    k = 5
    ps = passages(k)
    kw = {"design": "loo", "min_spread": 1e3, "blend": 0.0}
    assert MoI.from_settings(gen, outcome="gold").falls_back is False and MoI.from_settings(gen).falls_back is True
    assert MoI.from_settings(gen, outcome="gold", fallback=True).falls_back is True
    (auto,) = MoI.from_settings(gen, outcome="gold", **kw).run_batch(["q"], [ps], answers_list=[["p3"]],
                                generate_answer=False)
    (forced,) = MoI.from_settings(gen, outcome="gold", fallback=True, **kw).run_batch(["q"], [ps],
                                  answers_list=[["p3"]],
                                                                       generate_answer=False)
    raw = np.asarray(auto.raw_utilities)
    assert not auto.fallback and forced.fallback
    assert np.allclose(auto.utilities, raw) and np.allclose(forced.raw_utilities, raw)
    assert auto.ranking.ids() == [f"p{j}" for j in sorted(range(k), key=lambda j: (-raw[j], j))]
    assert forced.ranking.ids() == [f"p{j}" for j in range(k)]
    assert auto.ranking.ids() != forced.ranking.ids()  # the tiny model's drops are not in input order
    (q,) = MoI.from_settings(gen, outcome="question", **kw).run_batch(["q"], [ps], generate_answer=False)
    assert q.fallback and q.ranking.ids() == [f"p{j}" for j in range(k)]
    with pytest.raises(ValueError, match="'auto'"):
        MoI.from_settings(gen, fallback="sometimes")


def test_designs_and_outcomes_are_small_objects() -> None:
    """Each design owns its budget, rounds and fit; MoI holds no per-design branch and few parameters."""
    import inspect

    from ragkit.debias.interventions import Ablate, Cyclic, LeaveOneOut, Prior, design_from_name
    from ragkit.debias.moi import FallbackTest
    from ragkit.debias.outcomes import Consensus, Gold, outcome_from_name

    assert design_from_name("prior", head=2, budget=3) == Prior(budget=3, head=2)
    with pytest.raises(TypeError, match="takes no head"):
        design_from_name("loo", head=2)
    with pytest.raises(ValueError, match="surrogate"):
        Ablate(surrogate="elastic")
    with pytest.raises(ValueError, match="budget"):
        Cyclic(budget=0)
    rng = np.random.default_rng(0)
    assert LeaveOneOut().interventions(3, rng) == [[0, 1, 2], [1, 2], [0, 2], [0, 1]]
    cands, first, step = Prior(head=2).rounds(4, rng)
    assert (first, step) == (2, 2) and all(o[2:] == [2, 3] for o in cands)  # only the head (2 orders) rotates
    assert outcome_from_name("consensus", max_new_tokens=4, max_tied=1) == Consensus(max_new_tokens=4, max_tied=1)
    moi = MoI(None, design=Prior(budget=2, lam=0.5), outcome=lambda *a: [], fallback=FallbackTest(True, alpha=0.1))
    assert moi.design.lam == 0.5 and moi.fallback.alpha == 0.1 and moi.falls_back
    assert not MoI.from_settings(object(), outcome="gold").falls_back and Gold.needs_answers  # type: ignore[arg-type]
    params = [p for p in inspect.signature(MoI).parameters if p != "generator"]
    assert len(params) <= 10, params
    src = inspect.getsource(MoI)
    assert "self.design ==" not in src and "self.outcome ==" not in src
