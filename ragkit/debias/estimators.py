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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ragkit.debias.designs import check_orderings, slots_of

__all__ = ["design_matrix", "zscore", "ridge_utilities"]


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
