"""ragkit.debias: rerankers, placements and answerers, with Mixture-of-Intervention (MoI).

One contract (:class:`ragkit.reranking.Reranker`) and three steps, composed by
:class:`Method` (and by :class:`ragkit.RAGPipeline`):

- **reranker** (one backend per file): :class:`MoIReranker` (``reranker.py``),
  :class:`DistilledReranker` (``student.py``), :class:`CrossEncoderReranker` (``cross_encoder.py``),
  :class:`LLMReranker` (``llm_reranker.py``),
  :class:`IdentityReranker` and :class:`RandomReranker` (``baselines.py``); built from a string
  by :func:`get_reranker`;
- **placement** (``placement.py``): ``none``, ``reverse``, ``both_ends``, ``bias_aware``;
- **answerer** (``answerers.py``): ``single``, ``voting``, ``psc_borda`` / ``psc_rrf``.

Named evaluation methods are presets of the three (``presets.py``: :func:`get_method`,
:func:`available_methods`).

MoI's building blocks stay in their modules: design objects in :mod:`ragkit.debias.interventions`
(orderings in :mod:`ragkit.debias.designs`), outcome objects in :mod:`ragkit.debias.outcomes`,
estimators in :mod:`ragkit.debias.estimators`.

MoI: Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation" (NAACL
Findings 2025, arXiv 2412.10684).

>>> from ragkit.debias import get_reranker                    # doctest: +SKIP
>>> from ragkit.generation import Generator                   # doctest: +SKIP
>>> get_reranker("moi", Generator()).rank("Who wrote Hamlet?", passages).ids()  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from ragkit.debias.moi import MoI, MoIResult
from ragkit.debias.profile import PositionProfile

__all__ = [
    "MoI",
    "MoIResult",
    "MoIReranker",
    "DistilledReranker",
    "CrossEncoderReranker",
    "LLMReranker",
    "LongDocs",
    "IdentityReranker",
    "RandomReranker",
    "PositionProfile",
    "place",
    "PLACEMENTS",
    "Answerer",
    "SingleAnswerer",
    "VotingAnswerer",
    "PSCAnswerer",
    "get_answerer",
    "METHOD_NAMES",
    "Method",
    "MethodOutput",
    "available_methods",
    "available_rerankers",
    "get_method",
    "get_reranker",
    "resolve_method",
]

_LAZY = {  # these import sentence-transformers / the generator stack only when used
    "MoIReranker": "ragkit.debias.reranker",
    "DistilledReranker": "ragkit.debias.student",
    "CrossEncoderReranker": "ragkit.debias.cross_encoder",
    "LLMReranker": "ragkit.debias.llm_reranker",
    "LongDocs": "ragkit.debias.long_docs",
    "IdentityReranker": "ragkit.debias.baselines",
    "RandomReranker": "ragkit.debias.baselines",
    "place": "ragkit.debias.placement",
    "PLACEMENTS": "ragkit.debias.placement",
    "Answerer": "ragkit.debias.answerers",
    "SingleAnswerer": "ragkit.debias.answerers",
    "VotingAnswerer": "ragkit.debias.answerers",
    "PSCAnswerer": "ragkit.debias.answerers",
    "get_answerer": "ragkit.debias.answerers",
    "METHOD_NAMES": "ragkit.debias.presets",
    "Method": "ragkit.debias.presets",
    "MethodOutput": "ragkit.debias.presets",
    "available_methods": "ragkit.debias.presets",
    "available_rerankers": "ragkit.debias.presets",
    "get_method": "ragkit.debias.presets",
    "get_reranker": "ragkit.debias.presets",
    "resolve_method": "ragkit.debias.presets",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ragkit.debias' has no attribute {name!r}")
