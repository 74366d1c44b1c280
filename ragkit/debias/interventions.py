"""MoI's designs as small objects: each owns its budget, its adaptive rounds and its estimator.

A design object answers three questions for ``k`` passages: which interventions to run
(:meth:`Design.interventions`, a fixed budget), in which order to add them when the budget is
``"auto"`` (:meth:`Design.rounds`: candidates, the first round's size and each later round's),
and how to turn their outcomes into utilities (:meth:`Design.fit`). The per-design settings live
on the design that reads them (``head`` on :class:`Prior`; the surrogate's ``surrogate``,
``alpha``, ``lam`` and ``transform`` on :class:`Ablate`; the ridge strength ``lam`` on the
permutation designs), so :class:`~ragkit.debias.moi.MoI` holds no per-design branch.

The orderings and estimators themselves are in :mod:`ragkit.debias.designs` and
:mod:`ragkit.debias.estimators` (formulas and papers there): Lee et al., "Inference Scaling for
Bridging Retrieval and Augmented Generation", NAACL Findings 2025, arXiv 2412.10684 (permutation
designs, ridge utilities); AttriBoT (Liu et al., arXiv 2411.15102; leave-one-out); ContextCite
(Cohen-Wang et al., NeurIPS 2024, arXiv 2409.00729; random ablations and the Lasso surrogate).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ragkit.debias.designs import _shift_sequence, ablate, make_design, mixed, prior, random_design
from ragkit.debias.designs import loo as loo_design
from ragkit.debias.estimators import (
    UtilityFit,
    loo_utilities,
    mixed_utilities,
    permutation_fit,
    surrogate_utilities,
)
from ragkit.debias.profile import PositionProfile

__all__ = ["Design", "LeaveOneOut", "Ablate", "Mixed", "Cyclic", "Prior", "RandomOrders", "DESIGN_TYPES",
           "design_from_name"]


@dataclass(frozen=True)
class Design(ABC):
    """One MoI design (see the module docstring).

    Parameters
    ----------
    budget
        Number of interventions ``M`` (``None``: the design's default), or ``"auto"``: add them in
        rounds (:meth:`rounds`) until the top-``stable_top`` passages of the ranking are unchanged
        for one round.
    stable_top
        ``budget="auto"``: the number of top passages that must be stable.
    """

    name: ClassVar[str] = ""
    budget: int | str | None = None
    stable_top: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.budget, str):
            if self.budget != "auto":
                raise ValueError(f"budget must be an integer >= 1, None or 'auto', got {self.budget!r}")
        elif self.budget is not None and (isinstance(self.budget, bool) or int(self.budget) < 1):
            raise ValueError(f"budget (number of orderings) must be >= 1, got {self.budget}")
        if self.stable_top < 1:
            raise ValueError(f"stable_top must be >= 1, got {self.stable_top}")

    @property
    def adaptive(self) -> bool:
        """Whether interventions are added in rounds (``budget="auto"``)."""
        return self.budget == "auto"

    @property
    def fixed_budget(self) -> int | None:
        """The budget as :func:`~ragkit.debias.designs.make_design` takes it (``None``: default or ``"auto"``)."""
        return None if self.budget is None or self.adaptive else int(self.budget)  # type: ignore[arg-type]

    @abstractmethod
    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        """The interventions for ``k`` passages (fixed budget)."""

    @abstractmethod
    def rounds(self, k: int, rng: np.random.Generator) -> tuple[list[list[int]], int, int]:
        """``budget="auto"``: (candidate interventions in the order they are added, first round's size, step)."""

    @abstractmethod
    def fit(self, interventions: list[list[int]], outcomes: np.ndarray, profile: PositionProfile,
            scores: Sequence[float] | None) -> UtilityFit:
        """Utilities (and the fit the separation test reads) from the outcomes of ``interventions``."""


@dataclass(frozen=True)
class LeaveOneOut(Design):
    """``loo``: the full prompt and the ``k`` prompts that each leave one passage out (``k + 1``;
    complete after one round); ``u_p = o(full) − o(full \\ p)``."""

    name: ClassVar[str] = "loo"

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("loo", k, self.fixed_budget)

    def rounds(self, k: int, rng: np.random.Generator) -> tuple[list[list[int]], int, int]:
        cands = loo_design(k)
        return cands, len(cands), len(cands)

    def fit(self, interventions: list[list[int]], outcomes: np.ndarray, profile: PositionProfile,
            scores: Sequence[float] | None) -> UtilityFit:
        return loo_utilities(interventions, outcomes, profile.k)


@dataclass(frozen=True)
class Ablate(Design):
    """``ablate``: random keep-masks (default ``2k``; rounds: ``k`` then ``k/2`` more, at most ``4k``)
    and ContextCite's linear surrogate (``surrogate="lasso"`` with strength ``alpha``, or ``"ridge"``
    with ``lam``) on the logit of the outcome probability (``transform="logit"``) or the raw
    outcome (``"none"``)."""

    name: ClassVar[str] = "ablate"
    surrogate: str = "lasso"
    alpha: float = 0.01
    lam: float = 0.1
    transform: str = "logit"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.surrogate not in ("lasso", "ridge"):
            raise ValueError(f"unknown surrogate {self.surrogate!r}; choose 'lasso' or 'ridge'")
        if self.transform not in ("logit", "none"):
            raise ValueError(f"unknown transform {self.transform!r}; choose 'logit' or 'none'")
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("ablate", k, self.fixed_budget, rng=rng)

    def rounds(self, k: int, rng: np.random.Generator) -> tuple[list[list[int]], int, int]:
        return ablate(k, 4 * k, rng=rng), k, max(1, k // 2)

    def fit(self, interventions: list[list[int]], outcomes: np.ndarray, profile: PositionProfile,
            scores: Sequence[float] | None) -> UtilityFit:
        return surrogate_utilities(interventions, outcomes, profile.k, method=self.surrogate, alpha=float(self.alpha),
                                   lam=float(self.lam), transform=self.transform)


@dataclass(frozen=True)
class Mixed(Design):
    """``mixed``: random keep-masks in random orders (default ``3k``; rounds: ``2k`` then ``k`` more,
    at most ``6k``); ``u`` and the slot weights from one alternating-least-squares regression."""

    name: ClassVar[str] = "mixed"

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("mixed", k, self.fixed_budget, rng=rng)

    def rounds(self, k: int, rng: np.random.Generator) -> tuple[list[list[int]], int, int]:
        return mixed(k, 6 * k, rng=rng), 2 * k, k

    def fit(self, interventions: list[list[int]], outcomes: np.ndarray, profile: PositionProfile,
            scores: Sequence[float] | None) -> UtilityFit:
        return mixed_utilities(interventions, outcomes, profile.k, weights=profile.weights)


@dataclass(frozen=True)
class _Permutations(Design):
    """Permutation designs: ridge utilities toward the retriever prior with strength ``lam``;
    rounds start with 3 orderings and add 2."""

    lam: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lam < 0:
            raise ValueError(f"lam must be >= 0, got {self.lam}")

    def _candidates(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        raise NotImplementedError

    def rounds(self, k: int, rng: np.random.Generator) -> tuple[list[list[int]], int, int]:
        cands = self._candidates(k, rng)
        return cands, min(3, len(cands)), 2

    def fit(self, interventions: list[list[int]], outcomes: np.ndarray, profile: PositionProfile,
            scores: Sequence[float] | None) -> UtilityFit:
        return permutation_fit(interventions, outcomes, profile.weights, lam=float(self.lam), scores=scores)


@dataclass(frozen=True)
class Cyclic(_Permutations):
    """``cyclic``: the ``k`` rotations of the retriever order, a Latin square (a smaller budget keeps
    the first rotations; rounds add further rotations, at most ``k``)."""

    name: ClassVar[str] = "cyclic"

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("cyclic", k, self.fixed_budget, rng=rng)

    def _candidates(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return [[(j + s) % k for j in range(k)] for s in [0, *_shift_sequence(k)]]


@dataclass(frozen=True)
class Prior(_Permutations):
    """``prior``: ``M < k`` orderings around the retriever order (default 3; ``head``: rotate only
    the top-``head`` passages; rounds: at most ``2k``)."""

    name: ClassVar[str] = "prior"
    head: int | None = None

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("prior", k, self.fixed_budget, rng=rng, head=self.head)

    def _candidates(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return prior(k, 2 * k, head=self.head)


@dataclass(frozen=True)
class RandomOrders(_Permutations):
    """``random``: uniformly random permutations (default ``k``; rounds: at most ``2k``); a baseline."""

    name: ClassVar[str] = "random"

    def interventions(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return make_design("random", k, self.fixed_budget, rng=rng)

    def _candidates(self, k: int, rng: np.random.Generator) -> list[list[int]]:
        return random_design(k, 2 * k, rng)


DESIGN_TYPES: dict[str, type[Design]] = {d.name: d for d in (LeaveOneOut, Ablate, Mixed, Cyclic, Prior, RandomOrders)}
"""Design classes by name (the names of :data:`ragkit.debias.designs.DESIGNS`)."""


def design_from_name(name: str | Design, **settings: Any) -> Design:
    """The design object of a name (``"loo"``, ``"ablate"``, ``"mixed"``, ``"cyclic"``, ``"prior"``,
    ``"random"``) with the ``settings`` it takes; settings it does not take are ignored only when
    ``None`` (a flat settings dict names knobs of every design), else an error naming them."""
    if isinstance(name, Design):
        if any(v is not None for v in settings.values()):
            raise TypeError(f"pass the settings of a design object on the object, not beside it: {sorted(settings)}")
        return name
    if name not in DESIGN_TYPES:
        raise ValueError(f"unknown design {name!r}; choose one of {tuple(DESIGN_TYPES)}")
    cls = DESIGN_TYPES[name]
    own = {f.name for f in fields(cls)}
    bad = sorted(k for k, v in settings.items() if k not in own and v is not None)
    if bad:
        raise TypeError(f"the {name} design takes no {', '.join(bad)}; it takes {', '.join(sorted(own))}")
    return cls(**{k: v for k, v in settings.items() if k in own and v is not None})
