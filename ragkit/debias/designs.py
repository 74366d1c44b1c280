"""Intervention designs for Mixture-of-Intervention: which passage orderings to run.

An ordering is a list ``order`` with ``order[j]`` = index (into the retriever-ordered passage
list) of the passage placed at prompt slot ``j`` (slot 0 = first in the prompt). A design is a
list of ``M`` orderings of the same ``k`` passages.

Designs (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation",
NAACL Findings 2025, arXiv 2412.10684):

- :func:`cyclic`: the ``k`` rotations of the retriever order, ``π_m(j) = (j + m) mod k``. It is a
  Latin square: each passage visits each slot exactly once, so slot effects and passage
  utilities separate exactly.
- :func:`prior`: ``M < k`` orderings chosen with the retriever order as prior: the retriever
  order, its reversal, a half rotation, then further rotations (quarter, three-quarter, ...)
  and reversed rotations; or, with ``head=m``, rotations of only the top-``m`` head with the
  tail kept in place.
- :func:`random_design`: ``M`` uniformly random permutations (a baseline).

Presence designs (every permutation keeps every passage in the prompt, so the outcome
moves only through the slot weights; whether a passage is there at all is the strongest signal).
Here an *intervention* is an index list of any length ``0..k``: a subset of the passages in the
order they take in the prompt.

- :func:`loo`: the full prompt plus the ``k`` prompts that each leave one passage out
  (leave-one-out context attribution; Liu et al., "AttriBoT: A Bag of Tricks for Efficiently
  Approximating Leave-One-Out Context Attribution", arXiv 2411.15102).
- :func:`ablate`: ``N`` random keep-masks, each passage kept with probability ``p`` (default
  ``p = 0.5``, ``N = 2k``), kept passages in retriever order (ContextCite, Cohen-Wang et al.,
  "ContextCite: Attributing Model Generation to Context", NeurIPS 2024, arXiv 2409.00729).
- :func:`mixed`: random keep-masks whose kept passages appear in a uniformly random order, so one
  regression identifies both presence utilities ``u`` and slot weights ``a``
  (:func:`ragkit.debias.estimators.mixed_utilities`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

__all__ = [
    "DESIGNS",
    "cyclic",
    "prior",
    "random_design",
    "loo",
    "ablate",
    "mixed",
    "make_design",
    "check_interventions",
    "keep_masks",
    "is_latin_square",
    "check_orderings",
    "slots_of",
]

logger = logging.getLogger(__name__)

PERMUTATION_DESIGNS = ("cyclic", "prior", "random")
"""Designs whose interventions are permutations of all ``k`` passages."""
PRESENCE_DESIGNS = ("loo", "ablate", "mixed")
"""Designs whose interventions drop passages (subsets of any length)."""
DESIGNS = PERMUTATION_DESIGNS + PRESENCE_DESIGNS


def _check_k(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (the number of passages) must be an integer >= 1, got {k!r}")
    return int(k)


def _check_budget(budget: int) -> int:
    if not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget (the number of orderings M) must be an integer >= 1, got {budget!r}")
    return int(budget)


def cyclic(k: int) -> list[list[int]]:
    """The ``k`` rotations of the retriever order: ``order_m[j] = (j + m) mod k``.

    Rotation 0 is the retriever order itself. The ``k x k`` array is a Latin square.
    """
    k = _check_k(k)
    return [[(j + m) % k for j in range(k)] for m in range(k)]


def _shift_sequence(k: int) -> list[int]:
    """Rotation shifts in coarse-to-fine order: k/2, k/4, 3k/4, k/8, 3k/8, ... then the rest."""
    out: list[int] = []
    den = 2
    while den <= 2 * k:
        for num in range(1, den, 2):
            s = (num * k) // den
            if 0 < s < k and s not in out:
                out.append(s)
        den *= 2
    out += [s for s in range(1, k) if s not in out]
    return out


def prior(k: int, budget: int, head: int | None = None) -> list[list[int]]:
    """``budget`` orderings that keep the retriever order as the prior.

    Without ``head``: the retriever order, its reversal, the half rotation, then rotations by
    ``k/4, 3k/4, k/8, ...`` and finally the reversed rotations (at most ``2k`` distinct
    orderings). With ``head=m``: the ``m`` rotations of the top-``m`` passages, the tail
    ``m..k-1`` left in retriever order (at most ``m`` orderings). Duplicates are dropped; a
    ``budget`` larger than the number of distinct orderings is reduced (with a warning).
    """
    k = _check_k(k)
    budget = _check_budget(budget)
    cands: list[list[int]] = []
    if head is not None:
        if not 1 <= head <= k:
            raise ValueError(f"head must be in 1..k={k}, got {head}; it is the number of top passages to rotate")
        tail = list(range(head, k))
        cands = [[(j + m) % head for j in range(head)] + tail for m in range(head)]
    else:
        ident = list(range(k))
        cands = [ident, ident[::-1]]
        rots = [[(j + s) % k for j in range(k)] for s in _shift_sequence(k)]
        cands += rots + [r[::-1] for r in rots]
    seen: set[tuple[int, ...]] = set()
    out: list[list[int]] = []
    for c in cands:
        t = tuple(c)
        if t not in seen:
            seen.add(t)
            out.append(c)
    if budget > len(out):
        logger.warning("prior design: only %d distinct orderings for k=%d (head=%s); using %d, not budget=%d",
                       len(out), k, head, len(out), budget)
    return out[:budget]


def random_design(k: int, M: int, rng: np.random.Generator | int | None = 0) -> list[list[int]]:
    """``M`` uniformly random permutations of ``k`` passages (``rng``: a Generator or a seed)."""
    k = _check_k(k)
    M = _check_budget(M)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return [gen.permutation(k).tolist() for _ in range(M)]


def loo(k: int) -> list[list[int]]:
    """Leave-one-out: the full prompt, then the ``k`` prompts without passage ``p`` (``p = 0..k-1``).

    Intervention 0 is ``[0, 1, ..., k-1]``; intervention ``1 + p`` is the retriever order with
    ``p`` removed. The utility of ``p`` is the drop ``o(full) − o(full \\ p)``
    (:func:`ragkit.debias.estimators.loo_utilities`; AttriBoT, arXiv 2411.15102). ``M = k + 1``.
    """
    k = _check_k(k)
    full = list(range(k))
    return [full] + [[j for j in full if j != p] for p in full]


def _check_keep(p_keep: float) -> float:
    if not 0.0 < float(p_keep) < 1.0:
        raise ValueError(f"p_keep (the probability of keeping a passage) must be in (0, 1), got {p_keep}")
    return float(p_keep)


def _gen(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def ablate(k: int, n: int | None = None, p_keep: float = 0.5,
           rng: np.random.Generator | int | None = 0) -> list[list[int]]:
    """``n`` random ablations (default ``2k``): keep each passage independently with prob. ``p_keep``.

    The kept passages stay in retriever order; an intervention may be empty (the closed-book
    prompt), which anchors the intercept. The masks ``z_m ∈ {0, 1}^k`` are the regressors of the
    ContextCite linear surrogate ``logit P(answer | z) ≈ b + Σ_p w_p z_p``
    (:func:`ragkit.debias.estimators.surrogate_utilities`; arXiv 2409.00729).
    """
    k = _check_k(k)
    n = _check_budget(2 * k if n is None else n)
    p_keep = _check_keep(p_keep)
    gen = _gen(rng)
    keep = gen.random((n, k)) < p_keep
    return [np.flatnonzero(row).tolist() for row in keep]


def mixed(k: int, n: int | None = None, p_keep: float = 0.5,
          rng: np.random.Generator | int | None = 0) -> list[list[int]]:
    """``n`` random keep-masks (default ``3k``), the kept passages in a uniformly random order.

    Presence and slot vary independently, so the bilinear model
    ``o = b + Σ_j a_j u_{π(j)}`` over the kept passages identifies both ``u`` and ``a``
    (:func:`ragkit.debias.estimators.mixed_utilities`). The default ``3k`` leaves residual degrees
    of freedom for the ``2k − 1`` free parameters (``k`` utilities, ``k − 1`` slot weights).
    """
    k = _check_k(k)
    n = _check_budget(3 * k if n is None else n)
    p_keep = _check_keep(p_keep)
    gen = _gen(rng)
    keep = gen.random((n, k)) < p_keep
    return [gen.permutation(np.flatnonzero(row)).tolist() for row in keep]


def make_design(
    name: str,
    k: int,
    budget: int | None = None,
    rng: np.random.Generator | int | None = 0,
    head: int | None = None,
) -> list[list[int]]:
    """Build a design by name (one of :data:`DESIGNS`).

    ``budget`` defaults to ``k`` for ``cyclic``/``random``, 3 for ``prior``, ``2k`` for
    ``ablate`` and ``3k`` for ``mixed``; for ``cyclic`` a budget below ``k`` keeps the first
    ``budget`` rotations (no longer a Latin square). ``loo`` always has ``k + 1`` interventions
    (a different ``budget`` is an error).
    """
    k = _check_k(k)
    if name == "loo":
        if budget is not None and budget != k + 1:
            raise ValueError(f"the loo design has exactly k + 1 = {k + 1} interventions; leave budget unset "
                             f"(got budget={budget}) or use design='ablate' for another number")
        return loo(k)
    if name == "ablate":
        return ablate(k, budget, rng=rng)
    if name == "mixed":
        return mixed(k, budget, rng=rng)
    if name == "cyclic":
        design = cyclic(k)
        if budget is not None:
            design = design[: _check_budget(budget)]
        return design
    if name == "prior":
        return prior(k, 3 if budget is None else budget, head=head)
    if name == "random":
        return random_design(k, k if budget is None else budget, rng)
    raise ValueError(f"unknown design {name!r}; choose one of {DESIGNS}")


def check_orderings(orderings: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """Validate that every ordering is a permutation of ``range(k)``; return an ``(M, k)`` array."""
    arr = np.asarray(orderings, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != k:
        raise ValueError(f"orderings must be M >= 1 permutations of length k={k}, got shape {arr.shape}")
    ref = np.arange(k)
    for m, row in enumerate(arr):
        if not np.array_equal(np.sort(row), ref):
            raise ValueError(f"ordering {m} {row.tolist()} is not a permutation of 0..{k - 1}")
    return arr


def check_interventions(interventions: Sequence[Sequence[int]], k: int) -> list[list[int]]:
    """Validate index lists of distinct passages in ``0..k-1`` (any length, empty allowed)."""
    out: list[list[int]] = []
    if len(interventions) < 1:
        raise ValueError("a design needs at least one intervention")
    for m, row in enumerate(interventions):
        r = [int(i) for i in row]
        if len(set(r)) != len(r) or any(i < 0 or i >= k for i in r):
            raise ValueError(f"intervention {m} {r} must list distinct passage indices in 0..{k - 1}")
        out.append(r)
    return out


def keep_masks(interventions: Sequence[Sequence[int]], k: int) -> np.ndarray:
    """``(M, k)`` 0/1 matrix: ``Z[m, p] = 1`` when passage ``p`` is in intervention ``m``."""
    rows = check_interventions(interventions, k)
    z = np.zeros((len(rows), k))
    for m, r in enumerate(rows):
        z[m, r] = 1.0
    return z


def slots_of(orderings: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
    """Inverse permutations: ``slots[m, p]`` = slot of passage ``p`` in ordering ``m``."""
    arr = np.asarray(orderings, dtype=np.int64)
    slots = np.empty_like(arr)
    rows = np.arange(arr.shape[0])[:, None]
    slots[rows, arr] = np.arange(arr.shape[1])[None, :]
    return slots


def is_latin_square(orderings: Sequence[Sequence[int]]) -> bool:
    """True when the ``k`` orderings put every passage in every slot exactly once."""
    arr = np.asarray(orderings)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        return False
    k = arr.shape[1]
    ref = np.arange(k)
    rows_ok = all(np.array_equal(np.sort(r), ref) for r in arr)
    cols_ok = all(np.array_equal(np.sort(c), ref) for c in arr.T)
    return rows_ok and cols_ok
