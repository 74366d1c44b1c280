"""ragkit: retrieval-augmented generation that is robust to passage order and query wording.

The public surface is small; everything else lives in the subpackages
(``ragkit.retrievers``, ``ragkit.generation``, ``ragkit.debias``, ``ragkit.training``,
``ragkit.eval``). Heavy modules load on first use.

>>> import ragkit
>>> rag = ragkit.RAGPipeline.default()        # doctest: +SKIP
>>> rag.ask("Which magazine was started first, Arthur's Magazine or First for Women?").answer  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

from ragkit.types import Hit, Passage, Query, RankedList

__version__ = "0.1.0"

_LAZY = {
    "BM25Retriever": "ragkit.retrievers",
    "DenseRetriever": "ragkit.retrievers",
    "HybridRetriever": "ragkit.retrievers",
    "load_retriever": "ragkit.retrievers",
    "Generator": "ragkit.generation",
    "MoI": "ragkit.debias",
    "MoIReranker": "ragkit.debias",
    "PositionProfile": "ragkit.debias",
    "Reranker": "ragkit.reranking",
    "RAGPipeline": "ragkit.pipeline",
    "load_dataset": "ragkit.datasets",
    "run_eval": "ragkit.eval",
}

__all__ = ["Hit", "Passage", "Query", "RankedList", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:  # torch, FAISS and transformers load only when used
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ragkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
