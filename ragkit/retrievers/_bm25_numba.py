"""Numba kernel of :class:`~ragkit.retrievers.bm25.BM25Retriever`'s fast scorer (imported only
when numba is installed).

It reads bm25s's eager score matrix (Lù, "BM25S", 2024): a CSC matrix whose column ``t`` holds
the pre-computed ``idf(t) * tfc(t, d)`` of every document ``d`` containing term ``t``. Per query::

    score(d) = sum_{t in q} S[d, t]  (+ sum_{t in q} nonocc(t) for BM25L / BM25+)

Only documents with ``sum_{t in q} S[d, t] > 0`` (a query term weighs on them; ``S >= 0``) are
candidates: a query with fewer matches than ``k`` fills fewer than ``k`` slots (the rest ``-1``).

accumulated in float32 term by term, in the order bm25s's NumPy scorer uses, so both scorers give
bit-identical scores. The top ``k`` are selected exactly in the order (score descending, document
position ascending): ties at the k-th score are resolved by position, never arbitrarily
(bm25s's own selections -- ``argpartition`` for NumPy, a heap for numba -- each keep an
arbitrary subset of a tie that straddles the k-th place, which made their top-10s differ).

Compiled with ``cache=True``: the first use on a machine compiles (a few seconds) and writes the
machine code to numba's cache (``__pycache__`` beside this file, or numba's user cache folder
when that is read-only, or ``NUMBA_CACHE_DIR``); later processes load it in well under a second.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["topk_batch"]


@njit(cache=True, nogil=True)
def _below(s_a: float, i_a: int, s_b: float, i_b: int) -> bool:
    """True when (s_a, i_a) ranks below (s_b, i_b): lower score, or same score, later position."""
    return s_a < s_b or (s_a == s_b and i_a > i_b)


@njit(cache=True, nogil=True)
def _sift_to_root(hs: np.ndarray, hi: np.ndarray, pos: int) -> None:
    s, i = hs[pos], hi[pos]
    while pos > 0:
        parent = (pos - 1) >> 1
        if _below(s, i, hs[parent], hi[parent]):
            hs[pos], hi[pos] = hs[parent], hi[parent]
            pos = parent
        else:
            break
    hs[pos], hi[pos] = s, i


@njit(cache=True, nogil=True)
def _sift_to_leaf(hs: np.ndarray, hi: np.ndarray, n: int) -> None:
    pos = 0
    s, i = hs[0], hi[0]
    while True:
        child = 2 * pos + 1
        if child >= n:
            break
        right = child + 1
        if right < n and _below(hs[right], hi[right], hs[child], hi[child]):
            child = right
        if _below(hs[child], hi[child], s, i):
            hs[pos], hi[pos] = hs[child], hi[child]
            pos = child
        else:
            break
    hs[pos], hi[pos] = s, i


@njit(cache=True, nogil=True)
def topk_batch(data: np.ndarray, indptr: np.ndarray, indices: np.ndarray, num_docs: int,
               q_ids: np.ndarray, q_ptr: np.ndarray, q_offset: np.ndarray,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` (positions, float32 scores) of every query's matching documents, unsorted
    within a row; a row with fewer than ``k`` matches ends in position ``-1`` (score 0).

    ``q_ids[q_ptr[q]:q_ptr[q + 1]]`` are query ``q``'s term ids (columns of the CSC matrix
    ``data, indptr, indices``), ``q_offset[q]`` the float32 constant added to every document
    (BM25L / BM25+ non-occurrence credit, else 0).
    """
    nq = len(q_ptr) - 1
    out_i = np.full((nq, k), -1, dtype=np.int64)
    out_s = np.zeros((nq, k), dtype=np.float32)
    scores = np.zeros(num_docs, dtype=np.float32)
    hs = np.empty(k, dtype=np.float32)
    hi = np.empty(k, dtype=np.int64)
    for q in range(nq):
        scores[:] = 0
        for t in range(q_ptr[q], q_ptr[q + 1]):
            tok = q_ids[t]
            for j in range(indptr[tok], indptr[tok + 1]):
                scores[indices[j]] += data[j]
        off = q_offset[q]
        n = 0
        for d in range(num_docs):
            if scores[d] <= 0:  # no query term weighs on d: not a hit (S >= 0, so a sum > 0 means one does)
                continue
            s = np.float32(scores[d] + off)
            if n < k:
                hs[n], hi[n] = s, d
                _sift_to_root(hs, hi, n)
                n += 1
            elif s > hs[0]:  # positions ascend: an equal score never outranks the root
                hs[0], hi[0] = s, d
                _sift_to_leaf(hs, hi, n)
        for j in range(n):
            out_s[q, j] = hs[j]
            out_i[q, j] = hi[j]
    return out_i, out_s
