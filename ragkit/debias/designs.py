"""Intervention designs for Mixture-of-Intervention: which passage orderings to run.

An ordering is a list ``order`` with ``order[j]`` = index (into the retriever-ordered passage
list) of the passage placed at prompt slot ``j`` (slot 0 = first in the prompt). A design is a
list of ``M`` orderings of the same ``k`` passages.

Designs (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation",
NAACL Findings 2025, arXiv 2412.10684; choices fixed in the project's methods spec, section 1):

- :func:`cyclic`: the ``k`` rotations of the retriever order, ``π_m(j) = (j + m) mod k``. It is a
  Latin square: each passage visits each slot exactly once, so slot effects and passage
  utilities separate exactly.
- :func:`prior`: ``M < k`` orderings chosen with the retriever order as prior: the retriever
  order, its reversal, a half rotation, then further rotations (quarter, three-quarter, ...)
  and reversed rotations; or, with ``head=m``, rotations of only the top-``m`` head with the
  tail kept in place.
- :func:`random_design`: ``M`` uniformly random permutations (a baseline).
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
    "make_design",
    "is_latin_square",
    "check_orderings",
    "slots_of",
]

logger = logging.getLogger(__name__)

DESIGNS = ("cyclic", "prior", "random")


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


def make_design(
    name: str,
    k: int,
    budget: int | None = None,
    rng: np.random.Generator | int | None = 0,
    head: int | None = None,
) -> list[list[int]]:
    """Build a design by name (``"cyclic"``, ``"prior"``, ``"random"``).

    ``budget`` defaults to ``k`` for ``cyclic``/``random`` and 3 for ``prior``; for ``cyclic`` a
    budget below ``k`` keeps the first ``budget`` rotations (no longer a Latin square).
    """
    k = _check_k(k)
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
