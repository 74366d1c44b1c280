"""ragkit.debias: Mixture-of-Intervention (MoI) debiased reranking and its baselines.

Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation" (NAACL Findings
2025, arXiv 2412.10684).

>>> from ragkit.debias import MoI, MoIReranker       # doctest: +SKIP
>>> from ragkit.generation import Generator          # doctest: +SKIP
>>> MoIReranker(Generator()).rank("Who wrote Hamlet?", passages).ids()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from ragkit.debias.designs import cyclic, is_latin_square, make_design, prior, random_design
from ragkit.debias.estimators import design_matrix, ridge_utilities
from ragkit.debias.moi import MoI, MoIResult
from ragkit.debias.outcomes import OutcomeResult
from ragkit.debias.profile import PositionProfile

__all__ = [
    "MoI",
    "MoIResult",
    "MoIReranker",
    "PositionProfile",
    "OutcomeResult",
    "METHOD_NAMES",
    "MethodOutput",
    "get_method",
    "cyclic",
    "prior",
    "random_design",
    "make_design",
    "is_latin_square",
    "design_matrix",
    "ridge_utilities",
]


def __getattr__(name: str) -> Any:  # lazy: methods/reranker import more of ragkit
    if name in ("METHOD_NAMES", "MethodOutput", "get_method"):
        from ragkit.debias import methods

        return getattr(methods, name)
    if name == "MoIReranker":
        from ragkit.debias.reranker import MoIReranker

        return MoIReranker
    raise AttributeError(f"module 'ragkit.debias' has no attribute {name!r}")
