"""Retrievers: BM25 (bm25s / rank_bm25), dense (sentence-transformers + FAISS) and hybrid fusion.

>>> from ragkit.retrievers import BM25Retriever
>>> r = BM25Retriever().index(passages)            # doctest: +SKIP
>>> r.search(["who wrote Hamlet?"], k=5)            # doctest: +SKIP
"""

from __future__ import annotations

from ragkit.retrievers.base import IndexFormatError, Retriever, load_retriever, read_manifest
from ragkit.retrievers.bm25 import BM25Retriever
from ragkit.retrievers.factory import RETRIEVER_KINDS, make_retriever

__all__ = [
    "Retriever",
    "BM25Retriever",
    "DenseRetriever",
    "HybridRetriever",
    "IndexFormatError",
    "load_retriever",
    "read_manifest",
    "make_retriever",
    "RETRIEVER_KINDS",
]


def __getattr__(name: str):  # lazy: dense/hybrid pull in FAISS and torch only when used
    if name == "DenseRetriever":
        from ragkit.retrievers.dense import DenseRetriever

        return DenseRetriever
    if name == "HybridRetriever":
        from ragkit.retrievers.hybrid import HybridRetriever

        return HybridRetriever
    raise AttributeError(f"module 'ragkit.retrievers' has no attribute {name!r}")
