"""Separate passage utilities from slot weights: ridge least squares over interventions.

Observation model (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented
Generation", NAACL Findings 2025, arXiv 2412.10684; the linear form is the project's choice):

    E[o(π_m)] = b + Σ_j a_j · u_{π_m(j)},   a_j >= 0,  Σ_j a_j = 1

so with the design matrix ``A[m, p] = a[slot of p in π_m]`` the outcomes are ``o ≈ b + A u``.
Centering the columns of ``A`` and the outcomes removes ``b``; the utilities are

    u = argmin_u ||o_c − A_c u||² + λ ||u − u_prior||²
      = (A_cᵀ A_c + λ I)⁻¹ (A_cᵀ o_c + λ u_prior)

with ``u_prior`` = the z-scored retriever scores (zeros without scores). ``λ = 0`` solves the
plain least-squares problem with ``numpy.linalg.lstsq`` (minimum-norm solution): with the cyclic
design (a Latin square) and a non-flat ``a`` this is the exact ``k x k`` solve, identified up to
the constant that centering removes. ``λ > 0`` keeps the problem defined when ``M < k`` or ``a``
is flat.

Scale choices (documented parameters): ``lam`` is relative, ``λ = lam · tr(A_cᵀA_c) / k``, so it
does not depend on how peaked the profile is; and ``u_prior`` is put on the scale of the
utilities by moment matching, ``u_prior = z(s) · std(o) / ||a − mean(a)||`` (a random ordering
of utilities with spread ``σ_u`` gives outcomes with spread about ``σ_u · ||a − ā||``).

Presence designs (:mod:`ragkit.debias.designs`: ``loo``, ``ablate``, ``mixed``) have their own
estimators: :func:`loo_utilities` (the drop when a passage is left out), :func:`surrogate_utilities`
(ContextCite's sparse linear surrogate on the logit of the outcome probability) and
:func:`mixed_utilities` (alternating least squares for ``u`` and ``a`` together). Every estimator
returns a :class:`UtilityFit`, whose fitted values feed :func:`separates`, the per-query test that
decides whether the interventions separated the passages at all; :func:`blend_with_retriever`
mixes the utilities with the retriever order, so that a noisy estimate cannot fall far below the
retriever's own ranking.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ragkit.debias.designs import check_interventions, check_orderings, keep_masks, slots_of

__all__ = [
    "design_matrix",
    "zscore",
    "ridge_utilities",
    "UtilityFit",
    "permutation_fit",
    "loo_utilities",
    "logit_of_logprob",
    "lasso",
    "surrogate_utilities",
    "mixed_utilities",
    "separates",
    "retriever_prior",
    "blend_with_retriever",
]

logger = logging.getLogger(__name__)


@dataclass
class UtilityFit:
    """Utilities estimated from one query's interventions, with what the separation test needs.

    Attributes
    ----------
    utilities
        ``(k,)`` passage utilities (larger is better).
    fitted
        ``(M,)`` the model's fitted outcomes (on the scale of ``target``).
    target
        ``(M,)`` the outcomes the model was fitted to (after any transform).
    n_params
        Free parameters besides the intercept (for the F-test's degrees of freedom).
    weights
        ``(k,)`` slot weights estimated together with ``u`` (``mixed`` only), else ``None``.
    """

    utilities: np.ndarray
    fitted: np.ndarray
    target: np.ndarray
    n_params: int
    weights: np.ndarray | None = None


def design_matrix(orderings: Sequence[Sequence[int]] | np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``A[m, p] = a[slot of passage p in ordering m]`` as an ``(M, k)`` float array."""
    a = np.asarray(weights, dtype=np.float64)
    arr = check_orderings(orderings, a.shape[0])
    return a[slots_of(arr)]


def zscore(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """``(x − mean) / std``; all zeros when ``x`` is constant."""
    v = np.asarray(x, dtype=np.float64)
    sd = v.std()
    return np.zeros_like(v) if sd <= 1e-12 or not np.isfinite(sd) else (v - v.mean()) / sd


def ridge_utilities(
    orderings: Sequence[Sequence[int]] | np.ndarray,
    outcomes: Sequence[float] | np.ndarray,
    weights: np.ndarray,
    lam: float = 0.1,
    scores: Sequence[float] | None = None,
    u_prior: Sequence[float] | None = None,
    scale_prior: bool = True,
) -> np.ndarray:
    """Passage utilities ``u`` from the outcomes of ``M`` orderings (see the module docstring).

    Parameters
    ----------
    orderings
        ``M`` orderings of ``k`` passages.
    outcomes
        ``(M,)`` outcome of each ordering (e.g. an answer's mean log-prob).
    weights
        ``(k,)`` position-bias profile ``a``.
    lam
        Relative ridge strength; ``0`` = plain (minimum-norm) least squares.
    scores
        Retriever scores; their z-scores are the prior ``u_prior`` (ignored if ``u_prior`` given).
    u_prior
        Explicit prior utilities (used as given, not rescaled).
    scale_prior
        Rescale the z-scored ``scores`` to the outcome scale (moment matching, module docstring).

    Returns
    -------
    numpy.ndarray
        ``(k,)`` utilities; larger is better.
    """
    a = np.asarray(weights, dtype=np.float64)
    k = a.shape[0]
    o = np.asarray(outcomes, dtype=np.float64)
    A = design_matrix(orderings, a)
    if o.shape != (A.shape[0],):
        raise ValueError(f"{A.shape[0]} orderings but outcomes of shape {o.shape}")
    if not np.all(np.isfinite(o)):
        raise ValueError("outcomes contain NaN/inf; check the generator's scores")
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    Ac = A - A.mean(axis=0, keepdims=True)
    oc = o - o.mean()
    if u_prior is not None:
        up = np.asarray(u_prior, dtype=np.float64)
        if up.shape != (k,):
            raise ValueError(f"u_prior must have k={k} values, got shape {up.shape}")
    elif scores is not None:
        if len(scores) != k:
            raise ValueError(f"{k} passages but {len(scores)} scores")
        up = zscore(scores)
        spread = float(np.linalg.norm(a - a.mean()))
        if scale_prior and spread > 1e-12:
            up = up * (float(o.std()) / spread)
    else:
        up = np.zeros(k)
    if lam == 0:
        u, *_ = np.linalg.lstsq(Ac, oc, rcond=None)
        return u
    gram = Ac.T @ Ac
    lam_eff = lam * max(float(np.trace(gram)) / k, 1e-12)
    return np.linalg.solve(gram + lam_eff * np.eye(k), Ac.T @ oc + lam_eff * up)


def permutation_fit(
    orderings: Sequence[Sequence[int]] | np.ndarray,
    outcomes: Sequence[float] | np.ndarray,
    weights: np.ndarray,
    lam: float = 0.1,
    scores: Sequence[float] | None = None,
) -> UtilityFit:
    """:func:`ridge_utilities` wrapped in a :class:`UtilityFit` (fitted ``ō + A_c u``)."""
    a = np.asarray(weights, dtype=np.float64)
    o = np.asarray(outcomes, dtype=np.float64)
    u = ridge_utilities(orderings, o, a, lam=lam, scores=scores)
    A = design_matrix(orderings, a)
    Ac = A - A.mean(axis=0, keepdims=True)
    rank = int(np.linalg.matrix_rank(Ac)) if Ac.size else 0
    return UtilityFit(utilities=u, fitted=o.mean() + Ac @ u, target=o, n_params=rank)


def loo_utilities(interventions: Sequence[Sequence[int]], outcomes: Sequence[float] | np.ndarray,
                  k: int) -> UtilityFit:
    """Leave-one-out utilities ``u_p = o(full) − o(full \\ p)`` (AttriBoT, arXiv 2411.15102).

    ``interventions`` must be the :func:`ragkit.debias.designs.loo` design: the full prompt first,
    then each prompt without one passage (the left-out passage is read off each list, so any order
    of the ``k`` leave-one-out prompts works). The model is saturated (``k + 1`` outcomes, ``k``
    utilities and the intercept), so the fitted values equal the outcomes.
    """
    rows = check_interventions(interventions, k)
    o = np.asarray(outcomes, dtype=np.float64)
    if o.shape != (len(rows),):
        raise ValueError(f"{len(rows)} interventions but outcomes of shape {o.shape}")
    if len(rows) != k + 1 or sorted(rows[0]) != list(range(k)):
        raise ValueError(f"the loo estimator needs the full prompt then the k = {k} leave-one-out prompts; "
                         "build them with ragkit.debias.designs.loo(k)")
    u = np.zeros(k)
    seen = set()
    for m in range(1, k + 1):
        missing = set(range(k)) - set(rows[m])
        if len(missing) != 1:
            raise ValueError(f"intervention {m} {rows[m]} must leave out exactly one passage")
        p = missing.pop()
        seen.add(p)
        u[p] = o[0] - o[m]
    if len(seen) != k:
        raise ValueError("the loo interventions must leave out every passage once")
    return UtilityFit(utilities=u, fitted=o.copy(), target=o, n_params=k)


def logit_of_logprob(o: Sequence[float] | np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``logit(p)`` for ``p = exp(o)``: ``o − log(1 − exp(o))``, with ``o`` clipped to ``<= −eps``.

    ContextCite fits its surrogate on the logit of the probability of the response; the MoI
    outcomes are (mean per-token) log-probabilities, so ``exp(o)`` is that probability.
    """
    v = np.minimum(np.asarray(o, dtype=np.float64), -abs(eps))
    return v - np.log(-np.expm1(v))


def lasso(X: np.ndarray, y: np.ndarray, alpha: float = 0.01, max_iter: int = 1000,
          tol: float = 1e-8) -> tuple[np.ndarray, float]:
    """Lasso with an intercept through scikit-learn's ``Lasso`` (coordinate descent); returns ``(w, b)``.

    Minimises ``(1 / 2N) ||y − b − X w||² + α ||w||₁`` (Tibshirani, "Regression Shrinkage and
    Selection via the Lasso", JRSS-B 1996). scikit-learn comes with sentence-transformers, a core
    dependency; constant columns get ``w_p = 0`` (they are zero once centred).
    """
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    with warnings.catch_warnings():  # a few masks rarely converge to 1e-8; the estimate is still the best found
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = Lasso(alpha=alpha, fit_intercept=True, max_iter=max_iter, tol=tol).fit(X, y)
    return np.asarray(model.coef_, dtype=np.float64), float(model.intercept_)


def surrogate_utilities(
    interventions: Sequence[Sequence[int]],
    outcomes: Sequence[float] | np.ndarray,
    k: int,
    method: str = "lasso",
    alpha: float = 0.01,
    lam: float = 0.1,
    transform: str = "logit",
) -> UtilityFit:
    """ContextCite's linear surrogate on keep-masks (Cohen-Wang et al. 2024, arXiv 2409.00729).

    ``y_m = logit(exp(o_m)) ≈ b + Σ_p w_p z_{m,p}`` with ``z_m`` the keep-mask of intervention
    ``m``; the utilities are ``u = w``.

    Parameters
    ----------
    method
        ``"lasso"`` (ContextCite's choice: the masks standardised column-wise, Lasso with
        strength ``alpha``, coefficients mapped back to mask units) or ``"ridge"``
        (``w = (Z_cᵀZ_c + λI)⁻¹ Z_cᵀ y_c``, ``λ = lam · tr(Z_cᵀZ_c) / k``).
    transform
        ``"logit"`` (outcomes are log-probabilities) or ``"none"`` (fit the outcomes as given).
    """
    Z = keep_masks(interventions, k)
    o = np.asarray(outcomes, dtype=np.float64)
    if o.shape != (Z.shape[0],):
        raise ValueError(f"{Z.shape[0]} interventions but outcomes of shape {o.shape}")
    if not np.all(np.isfinite(o)):
        raise ValueError("outcomes contain NaN/inf; check the generator's scores")
    if transform == "logit":
        y = logit_of_logprob(o)
    elif transform == "none":
        y = o
    else:
        raise ValueError(f"unknown transform {transform!r}; choose 'logit' or 'none'")
    Zc = Z - Z.mean(axis=0, keepdims=True)
    if method == "lasso":
        sd = Z.std(axis=0)
        safe = np.where(sd > 1e-12, sd, 1.0)
        ws, b = lasso(Z / safe, y, alpha=alpha)
        w = np.where(sd > 1e-12, ws / safe, 0.0)
    elif method == "ridge":
        gram = Zc.T @ Zc
        lam_eff = lam * max(float(np.trace(gram)) / k, 1e-12)
        w = np.linalg.solve(gram + lam_eff * np.eye(k), Zc.T @ (y - y.mean()))
    else:
        raise ValueError(f"unknown surrogate {method!r}; choose 'lasso' or 'ridge'")
    fitted = y.mean() + Zc @ w
    n_params = int(np.count_nonzero(Z.std(axis=0) > 1e-12))
    return UtilityFit(utilities=w, fitted=fitted, target=y, n_params=n_params)


def _solve_ridge(X: np.ndarray, y: np.ndarray, lam: float, prior: np.ndarray) -> np.ndarray:
    """``argmin ||y_c − X_c β||² + λ ||β − prior||²`` with ``λ = lam · tr(X_cᵀX_c) / p``."""
    Xc = X - X.mean(axis=0, keepdims=True)
    gram = Xc.T @ Xc
    lam_eff = lam * max(float(np.trace(gram)) / X.shape[1], 1e-12)
    return np.linalg.solve(gram + lam_eff * np.eye(X.shape[1]), Xc.T @ (y - y.mean()) + lam_eff * prior)


def mixed_utilities(
    interventions: Sequence[Sequence[int]],
    outcomes: Sequence[float] | np.ndarray,
    k: int,
    weights: np.ndarray | None = None,
    lam: float = 1e-3,
    n_iter: int = 100,
    tol: float = 1e-10,
) -> UtilityFit:
    """Utilities ``u`` and slot weights ``a`` from one regression over subsets in random orders.

    Model (the MoI observation model over the passages present):

        o_m = b + Σ_{j < L_m} a_{L_m − 1 − j} · u_{π_m(j)}

    where ``L_m`` is the length of intervention ``m`` and the slot is counted from the END of the
    passage block (``r = 0``: next to the question), the dominant recency position of causal LMs
    (Liu et al., "Lost in the Middle", TACL 2024, arXiv 2307.03172).
    Presence varying fixes the scale of ``u`` against the intercept, and
    random orders separate ``a`` from ``u``. The model is bilinear; it is fitted by alternating
    least squares (each step a ridge regression with relative strength ``lam``: ``u`` toward 0,
    ``a`` toward its start value), with the gauge ``mean(a) = 1`` and ``a >= 0`` after every
    ``a``-step. Start: ``weights`` (a start-indexed profile of ``k`` slots) or flat.

    Returns
    -------
    UtilityFit
        ``weights`` holds the estimated ``a`` start-indexed for ``k`` slots (slot 0 = first
        passage; ``a_start[j] = a_end[k − 1 − j]``), normalised to sum 1.
    """
    rows = check_interventions(interventions, k)
    o = np.asarray(outcomes, dtype=np.float64)
    M = len(rows)
    if o.shape != (M,):
        raise ValueError(f"{M} interventions but outcomes of shape {o.shape}")
    if not np.all(np.isfinite(o)):
        raise ValueError("outcomes contain NaN/inf; check the generator's scores")
    a0 = np.ones(k) if weights is None else np.asarray(weights, dtype=np.float64)[::-1].copy()
    if a0.shape != (k,) or np.any(a0 < 0) or a0.sum() <= 0:
        raise ValueError(f"weights must be k = {k} non-negative slot weights")
    a0 = a0 / a0.mean()
    a = a0.copy()
    # (m, slot-from-end r, passage p) triples of every present passage
    trip = [(m, len(r) - 1 - j, p) for m, r in enumerate(rows) for j, p in enumerate(r)]
    mi = np.array([t[0] for t in trip], dtype=np.int64)
    ri = np.array([t[1] for t in trip], dtype=np.int64)
    pi = np.array([t[2] for t in trip], dtype=np.int64)
    u = np.zeros(k)
    prev = np.inf
    for _ in range(n_iter):
        Xu = np.zeros((M, k))
        np.add.at(Xu, (mi, pi), a[ri])
        u = _solve_ridge(Xu, o, lam, np.zeros(k))
        Xa = np.zeros((M, k))
        np.add.at(Xa, (mi, ri), u[pi])
        a_new = np.clip(_solve_ridge(Xa, o, lam, a0), 0.0, None)
        if a_new.sum() <= 1e-12:
            break
        scale = a_new.mean()
        a, u = a_new / scale, u * scale
        Xu = np.zeros((M, k))
        np.add.at(Xu, (mi, pi), a[ri])
        Xc = Xu - Xu.mean(axis=0, keepdims=True)
        fitted = o.mean() + Xc @ u
        sse = float(((o - fitted) ** 2).sum())
        if abs(prev - sse) <= tol * max(1.0, sse):
            break
        prev = sse
    Xu = np.zeros((M, k))
    np.add.at(Xu, (mi, pi), a[ri])
    fitted = o.mean() + (Xu - Xu.mean(axis=0, keepdims=True)) @ u
    return UtilityFit(utilities=u, fitted=fitted, target=o, n_params=2 * k - 1, weights=a[::-1] / a.sum())


def separates(fit: UtilityFit, alpha: float = 0.05, min_spread: float = 1e-2,
              z_min: float = 3.5) -> tuple[bool, dict[str, float]]:
    """Did the interventions separate the passages? The per-query test behind MoI's fallback.

    - With residual degrees of freedom ``d = M − p − 1 >= 1`` (``p = fit.n_params``): the
      F-test of the fit's explained variance against the intercept-only model,
      ``F = (R² / p) / ((1 − R²) / d)`` with ``R² = 1 − SS_res / SS_tot``; the passages are
      separated when its p-value ``P(F_{p,d} > F) <= alpha``.
    - Saturated designs (``d < 1``: ``loo``; ``cyclic`` with ``M = k``; ``prior`` with ``M < k``)
      leave no residual to estimate the noise. There the passages are separated when the
      interventions moved the outcome, ``max(o) − min(o) >= min_spread`` (outcome units, nats for
      log-probs), and the best passage stands out from the rest: its modified z-score
      ``0.6745 · (max u − median u) / MAD(u) >= z_min`` (Iglewicz and Hoaglin, "How to Detect and
      Handle Outliers", ASQC 1993, whose outlier threshold is 3.5; ``MAD = 0`` counts as standing
      out when ``max u > median u``; with ``k < 3`` only the spread is tested, since two values
      always give ``z = 0.6745``).

    Shrinkage (ridge, Lasso) makes the F-test approximate (conservative: ``R²`` is lowered).
    Returns ``(separated, stats)`` with ``stats`` = ``r2``, ``f``, ``pvalue``, ``df_resid``,
    ``spread``, ``max_z``.
    """
    y = np.asarray(fit.target, dtype=np.float64)
    spread = float(y.max() - y.min()) if y.size else 0.0
    p = max(int(fit.n_params), 1)
    d = y.size - p - 1
    sst = float(((y - y.mean()) ** 2).sum())
    sse = float(((y - fit.fitted) ** 2).sum())
    r2 = 0.0 if sst <= 1e-300 else max(0.0, 1.0 - sse / sst)
    u = np.asarray(fit.utilities, dtype=np.float64)
    med = float(np.median(u))
    mad = float(np.median(np.abs(u - med)))
    top = float(u.max()) - med
    max_z = (0.6745 * top / mad) if mad > 1e-12 else (float("inf") if top > 1e-12 else 0.0)
    stats = {"r2": r2, "f": float("nan"), "pvalue": float("nan"), "df_resid": float(d), "spread": spread,
             "max_z": max_z}
    if sst <= 1e-300:
        return False, stats
    if d >= 1:
        from scipy.stats import f as f_dist

        if r2 >= 1.0 - 1e-12:
            fval, pval = float("inf"), 0.0
        else:
            fval = (r2 / p) / ((1.0 - r2) / d)
            pval = float(f_dist.sf(fval, p, d))
        stats["f"], stats["pvalue"] = fval, pval
        return pval <= alpha, stats
    if u.size < 3:  # two values always give z = 0.6745: only the spread can speak
        return spread >= min_spread, stats
    return spread >= min_spread and max_z >= z_min, stats


def separation_failure(stats: dict[str, float], alpha: float = 0.05, min_spread: float = 1e-2,
                       z_min: float = 3.5) -> str:
    """Why :func:`separates` said no, as one sentence (from its ``stats`` and thresholds)."""
    spread = float(stats.get("spread", 0.0))
    if spread <= 0.0:
        return "every intervention gave the same outcome, so no passage could be told apart"
    if float(stats.get("df_resid", 0.0)) >= 1:
        return (f"the interventions did not separate the passages (F-test p = {stats.get('pvalue', float('nan')):.3g}"
                f" > {alpha:g})")
    if spread < min_spread:
        return f"the interventions moved the outcome by only {spread:.3g} (< min_spread {min_spread:g})"
    return (f"no passage stood out from the rest (modified z-score {stats.get('max_z', 0.0):.2f} "
            f"< {z_min:g})")


def retriever_prior(k: int, scores: Sequence[float] | None = None) -> np.ndarray:
    """The retriever's order as utilities: z-scored ``scores``, or ``k − 1 − i`` (rank) without them."""
    if scores is not None:
        if len(scores) != k:
            raise ValueError(f"{k} passages but {len(scores)} scores")
        z = zscore(scores)
        if np.any(z != 0):
            return z
    return zscore(np.arange(k, 0, -1, dtype=np.float64))


def blend_with_retriever(u: Sequence[float] | np.ndarray, weight: float,
                         scores: Sequence[float] | None = None) -> np.ndarray:
    """``(1 − β) z(u) + β z(prior)``: utilities blended with the retriever order (weight ``β``).

    ``prior`` = :func:`retriever_prior` (the retriever scores, or its ranks). ``β = 0`` returns
    ``u`` unchanged; ``β = 1`` is the retriever order. Ties keep the retriever order in MoI.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the blend weight must be in [0, 1], got {weight}")
    v = np.asarray(u, dtype=np.float64)
    if weight == 0.0:
        return v
    return (1.0 - weight) * zscore(v) + weight * retriever_prior(v.shape[0], scores)
