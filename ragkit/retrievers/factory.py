"""One way to build a retriever from its kind: ``make_retriever("bm25" | "dense" | "hybrid", ...)``.

The CLI (``ragkit index``), the evaluation runner and the studies build their retrievers here, so a
kind means the same retriever everywhere: BM25 (Lucene variant, English stemming and stopwords by
default; Robertson & Zaragoza, 2009), dense (a sentence-transformers encoder with a FAISS index), or
hybrid (both, fused by reciprocal rank fusion, Cormack et al., SIGIR 2009, or min-max score fusion).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RETRIEVER_KINDS", "make_retriever"]

RETRIEVER_KINDS: tuple[str, ...] = ("bm25", "dense", "hybrid")


def make_retriever(
    kind: str,
    *,
    embedder: str | None = None,
    device: str = "auto",
    index_type: str = "flat",
    batch_size: int = 64,
    bm25_method: str | None = "lucene",
    stemmer: str | None = "english",
    stopwords: str | Sequence[str] | None = "en",
    fusion: str = "rrf",
) -> Any:
    """An un-indexed retriever of ``kind``; call ``.index(passages)`` on it.

    Parameters
    ----------
    kind : str
        ``"bm25"``, ``"dense"`` or ``"hybrid"`` (BM25 and dense fused).
    embedder : str, optional
        Dense encoder (hub id or folder); ``None``: the embedded all-MiniLM-L6-v2.
    device : str
        Encoder device (``"auto"``, ``"cpu"``, ``"cuda"``).
    index_type : str
        FAISS index of the dense retriever: ``"flat"`` (exact), ``"hnsw"`` or ``"ivf"``.
    batch_size : int
        Encoder batch size.
    bm25_method : str or None
        bm25s scoring variant (``"lucene"``, ``"robertson"``, ``"atire"``, ``"bm25l"``, ``"bm25+"``).
    stemmer, stopwords
        BM25 tokenisation: a Snowball stemmer language and a stopword list (``None``: none).
    fusion : str
        Hybrid fusion: ``"rrf"`` or ``"minmax"``.

    Raises
    ------
    ValueError
        An unknown ``kind`` (the message lists the kinds).
    """
    if kind not in RETRIEVER_KINDS:
        raise ValueError(f"unknown retriever kind {kind!r}; choose one of {', '.join(RETRIEVER_KINDS)}")
    from ragkit.retrievers.bm25 import BM25Retriever

    def bm25() -> Any:
        return BM25Retriever(method=bm25_method, stemmer=stemmer, stopwords=stopwords)

    def dense() -> Any:
        from ragkit.retrievers.dense import DenseRetriever

        return DenseRetriever(embedder, index_type=index_type, device=device, batch_size=batch_size)

    if kind == "bm25":
        return bm25()
    if kind == "dense":
        return dense()
    from ragkit.retrievers.hybrid import HybridRetriever

    return HybridRetriever([bm25(), dense()], method=fusion)
