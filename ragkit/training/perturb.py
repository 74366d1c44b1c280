"""Order perturbations for CORD: an interpolation space between the retriever order and a shuffle.

CORD (Lee et al., "CORD: Balancing COnsistency and Rank Distillation for Robust
Retrieval-Augmented Generation", NAACL 2025, arXiv 2412.14581) trains a generator on pairs of
orderings of the same passages. The perturbed ordering ``c'_α`` comes from an interpolation
space (the paper's exact construction is not public; this is the project's documented choice):

    key_i = (1 − α) · z(s)_i + α · ξ_i,     ξ_i ~ U(0, 1) i.i.d.,
    z(s)_i = (s_i − min s) / (max s − min s)          (min-max scaling; 0 when all s are equal)
    c'_α = passages sorted by key, descending (ties by retriever rank)

α = 0 keeps the retriever order, α = 1 is a uniform random permutation, and for intermediate α
passages whose scores are close swap first (a swap of ``i`` and ``j`` needs
``α (ξ_j − ξ_i) > (1 − α)(z_i − z_j)``).

Score-aware α (choice): ``α ~ U(0, α_max)`` with

    α_max = 1 − tanh(γ · (s_(1) − s_(2)) / std(s))

where ``s_(1) ≥ s_(2)`` are the two largest scores: a dominant top passage (large margin in units
of the score spread) keeps the order almost intact, flat scores (an uninformative order) allow a
full shuffle. ``std(s) = 0`` (all scores equal) gives ``α_max = 1``.

Orderings follow the project convention: ``order[j]`` is the index (into the retriever-ordered
passage list) of the passage placed at prompt slot ``j``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "OrderPerturbation",
    "alpha_max",
    "as_rng",
    "default_scores",
    "interpolate_order",
    "kendall_distance",
    "kendall_tau",
    "minmax",
    "sample_alpha",
]

logger = logging.getLogger(__name__)


def as_rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A ``numpy.random.Generator`` from a generator, an integer seed or ``None`` (seed 0)."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(0 if rng is None else int(rng))


def _scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(s)):
        raise ValueError("retriever scores contain NaN or infinity; pass finite scores")
    return s


def default_scores(k: int) -> np.ndarray:
    """Scores ``k, k−1, …, 1`` (linear in rank) for passages given in order without scores."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return np.arange(k, 0, -1, dtype=np.float64)


def minmax(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """``z_i = (s_i − min s) / (max s − min s)``; all zeros when the scores are constant."""
    s = _scores(scores)
    if s.size == 0:
        return s
    lo, hi = float(s.min()), float(s.max())
    if hi - lo <= 0.0:
        return np.zeros_like(s)
    return (s - lo) / (hi - lo)


def interpolate_order(
    scores: Sequence[float] | np.ndarray, alpha: float, rng: np.random.Generator | int | None = None
) -> np.ndarray:
    """One ordering ``c'_α`` from the interpolation space.

    ``order = argsort_desc((1 − α) · z(s) + α · ξ)``, ``ξ ~ U(0, 1)`` per passage, ties broken by
    retriever rank (stable sort). The passages are assumed to be given in retriever order
    (``scores`` non-increasing is typical but not required: α = 0 returns the score order).

    Parameters
    ----------
    scores
        Retriever scores of the ``k`` passages, aligned with the passage list.
    alpha
        Interpolation weight in ``[0, 1]``: 0 keeps the score order, 1 is a uniform shuffle.
    rng
        ``numpy.random.Generator`` or seed.

    Returns
    -------
    np.ndarray
        ``(k,)`` int64 ordering; ``order[j]`` = passage index at slot ``j``.
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    gen = as_rng(rng)
    z = minmax(scores)
    xi = gen.random(z.size)
    key = (1.0 - float(alpha)) * z + float(alpha) * xi
    return np.argsort(-key, kind="stable").astype(np.int64)


def alpha_max(scores: Sequence[float] | np.ndarray, gamma: float = 1.0) -> float:
    """``α_max = 1 − tanh(γ · (s_(1) − s_(2)) / std(s))``; 1 for flat scores, 0 for < 2 passages."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    s = _scores(scores)
    if s.size < 2:
        return 0.0
    top = np.sort(s)[::-1]
    sd = float(s.std())
    if sd <= 0.0:
        return 1.0
    return float(1.0 - np.tanh(gamma * (top[0] - top[1]) / sd))


def sample_alpha(
    scores: Sequence[float] | np.ndarray, gamma: float = 1.0, rng: np.random.Generator | int | None = None
) -> float:
    """Score-aware ``α ~ U(0, α_max(s, γ))``."""
    return float(as_rng(rng).uniform(0.0, alpha_max(scores, gamma)))


def _check_order(order: Sequence[int] | np.ndarray) -> np.ndarray:
    o = np.asarray(order, dtype=np.int64).reshape(-1)
    if o.size and not np.array_equal(np.sort(o), np.arange(o.size)):
        raise ValueError(f"order must be a permutation of 0..{o.size - 1}, got {o.tolist()}")
    return o


def _discordant(order: np.ndarray) -> int:
    """Number of pairs ``j < l`` with ``order[j] > order[l]`` (inversions), O(k²) vectorised."""
    if order.size < 2:
        return 0
    return int(np.triu(order[:, None] > order[None, :], k=1).sum())


def kendall_tau(order: Sequence[int] | np.ndarray) -> float:
    """Kendall's τ between ``order`` and the identity: ``1 − 4·D / (k(k−1))``, ``D`` = inversions.

    1 for the retriever order, −1 for its reversal, about 0 for a uniform shuffle (1.0 for k < 2).
    """
    o = _check_order(order)
    k = o.size
    if k < 2:
        return 1.0
    return 1.0 - 4.0 * _discordant(o) / (k * (k - 1))


def kendall_distance(order: Sequence[int] | np.ndarray) -> float:
    """Normalised Kendall distance to the identity: the fraction of discordant pairs, in ``[0, 1]``."""
    return (1.0 - kendall_tau(order)) / 2.0


@dataclass(frozen=True)
class OrderPerturbation:
    """Sampler of perturbed orderings ``c'_α`` (fixed α or score-aware α).

    Parameters
    ----------
    gamma
        γ of the score-aware bound ``α_max = 1 − tanh(γ · margin / std)``.
    alpha
        A fixed α in ``[0, 1]`` instead of the score-aware draw (``None``: score-aware).
    alpha_cap
        Upper bound applied to every α (``1.0``: none).
    """

    gamma: float = 1.0
    alpha: float | None = None
    alpha_cap: float = 1.0

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if self.alpha is not None and not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1] or be None (score-aware), got {self.alpha}")
        if not 0.0 <= self.alpha_cap <= 1.0:
            raise ValueError(f"alpha_cap must lie in [0, 1], got {self.alpha_cap}")

    def sample(
        self, scores: Sequence[float] | np.ndarray | None, k: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> tuple[np.ndarray, float]:
        """Draw ``(order, α)`` for one example.

        Parameters
        ----------
        scores
            Retriever scores aligned with the passages, or ``None`` (then ``k`` is required and the
            scores ``k, k−1, …, 1`` stand in for the rank order).
        k
            Number of passages when ``scores`` is ``None``.
        rng
            ``numpy.random.Generator`` or seed.
        """
        gen = as_rng(rng)
        if scores is None:
            if k is None:
                raise ValueError("pass the retriever scores or the number of passages k")
            s = default_scores(k)
        else:
            s = _scores(scores)
        a = self.alpha if self.alpha is not None else sample_alpha(s, self.gamma, gen)
        a = min(float(a), self.alpha_cap)
        return interpolate_order(s, a, gen), a
