"""Placement: where each ranked passage goes in the prompt.

A *ranking* lists passage indices best first; a *prompt order* lists the passage index at each
slot (``order[j]`` = passage at slot ``j``). One small function per placement and one entry,
:func:`place`:

- ``none`` (alias ``ranked``): slot ``j`` gets the ``j``-th best passage.
- ``reverse``: the best passage last, next to the question (exploits recency bias).
- ``both_ends``: the "lost in the middle" reorder (Liu et al., "Lost in the Middle: How Language
  Models Use Long Contexts", TACL 2024): best first, second best last, third second, fourth
  second to last, ... so the weakest passages sit in the middle.
- ``bias_aware``: the best passage into the slot with the largest position weight ``a_j`` of a
  :class:`~ragkit.debias.profile.PositionProfile`, the second best into the next largest, ...
  (ties between slots: earlier slot first). This is the placement of Mixture-of-Intervention
  (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
  Findings 2025, arXiv 2412.10684).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PLACEMENTS", "place", "check_placement", "ranked_order", "reverse_order", "both_ends_order",
           "bias_aware_order"]

PLACEMENTS: tuple[str, ...] = ("none", "reverse", "both_ends", "bias_aware")
_ALIASES = {"ranked": "none"}


def ranked_order(ranking: Sequence[int]) -> list[int]:
    """Prompt order = ranking order: slot ``j`` gets the ``j``-th best passage."""
    return [int(i) for i in ranking]


def reverse_order(ranking: Sequence[int]) -> list[int]:
    """The ranking reversed: the best passage last, next to the question."""
    return [int(i) for i in ranking][::-1]


def both_ends_order(ranking: Sequence[int]) -> list[int]:
    """Best first, second best last, third second, fourth second to last, ...

    ``order[r // 2] = ranking[r]`` for even ``r`` and ``order[k - 1 - r // 2] = ranking[r]`` for
    odd ``r`` (Liu et al., TACL 2024).
    """
    k = len(ranking)
    order: list[int] = [0] * k
    lo, hi = 0, k - 1
    for r, p in enumerate(ranking):
        if r % 2 == 0:
            order[lo] = int(p)
            lo += 1
        else:
            order[hi] = int(p)
            hi -= 1
    return order


def bias_aware_order(ranking: Sequence[int], weights: Sequence[float] | np.ndarray) -> list[int]:
    """The ``r``-th best passage into the slot with the ``r``-th largest weight ``a_j``.

    Slots are sorted by ``(-a_j, j)`` (ties: earlier slot first); ``order[slot_r] = ranking[r]``.
    """
    k = len(ranking)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != k:
        raise ValueError(f"the position profile has {w.shape[0]} slots but there are {k} passages; "
                         "resize it with PositionProfile.resized(k)")
    slots = sorted(range(k), key=lambda j: (-float(w[j]), j))
    order = [0] * k
    for r, j in enumerate(slots):
        order[j] = int(ranking[r])
    return order


def _weights(profile: Any, k: int) -> np.ndarray:
    """Slot weights for ``k`` passages from a ``PositionProfile`` (resized) or a weight vector."""
    if hasattr(profile, "weights") and hasattr(profile, "resized"):
        return np.asarray(profile.resized(k).weights if getattr(profile, "k", k) != k else profile.weights)
    return np.asarray(profile, dtype=np.float64)


def check_placement(placement: str) -> str:
    """The canonical name of a placement (``"ranked"`` -> ``"none"``); an unknown name is an error."""
    kind = _ALIASES.get(placement, placement)
    if kind not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
    return kind


def place(ranking: Sequence[int], placement: str = "none", profile: Any = None) -> list[int]:
    """Prompt order from a ranking (passage indices, best first).

    Parameters
    ----------
    ranking
        Passage indices, best first (a permutation of ``0..k-1``).
    placement
        ``"none"`` (ranking order; alias ``"ranked"``), ``"reverse"``, ``"both_ends"`` or
        ``"bias_aware"``.
    profile
        For ``bias_aware``: a :class:`~ragkit.debias.profile.PositionProfile` (resized to ``k`` when
        it was measured for another ``k``) or a weight vector of length ``k``.

    Returns
    -------
    list[int]
        ``order[j]`` = index of the passage at prompt slot ``j``.
    """
    kind = check_placement(placement)
    if kind == "none":
        return ranked_order(ranking)
    if kind == "reverse":
        return reverse_order(ranking)
    if kind == "both_ends":
        return both_ends_order(ranking)
    if profile is None:
        raise ValueError("bias_aware placement needs a position profile; pass profile=PositionProfile "
                         "(e.g. PositionProfile.load(FILE) from `ragkit bias-profile`)")
    return bias_aware_order(ranking, _weights(profile, len(ranking)))
