"""Length-bucketed batching: cut sequences into the forward passes of least padded cost.

Shared by every batched model call that pads rows to the longest one: the cross-encoder's pairs
(:class:`ragkit.debias.CrossEncoderReranker`) and the generator's interventions
(:mod:`ragkit.generation.scoring`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["length_buckets"]


def length_buckets(
    lengths: Sequence[int],
    max_rows: int,
    max_batch_tokens: int | None = None,
    forward_cost_tokens: int = 128,
) -> list[list[int]]:
    """Cut sequences into the forward batches of least modelled cost (exact dynamic programme).

    Sort the sequences by length, ``l_1 >= l_2 >= ... >= l_n``, and cut the sorted list into
    contiguous batches ``B`` minimising

    ``cost = sum_B (c_0 + |B| * max(l in B))``

    subject to ``|B| <= max_rows`` and ``|B| * max(l in B) <= max_batch_tokens``: a forward pads
    every row to its longest one (``|B| * max l`` padded tokens) and costs ``c_0`` token-equivalents
    on top (``forward_cost_tokens``: launch, weight reads, thread synchronisation). In sorted
    order a batch's longest sequence is its first, so the optimum is the dynamic programme

    ``f(0) = 0,  f(j) = min_{i < j feasible} f(i) + c_0 + (j - i) * l_{i+1}``

    in ``O(n * max_rows)``. This is sequence bucketing (the length-sorted batches of Sutskever et
    al., "Sequence to Sequence Learning with Neural Networks", NeurIPS 2014, arXiv 1409.3215),
    made optimal for a linear cost model. A sequence longer than ``max_batch_tokens`` goes alone.

    Parameters
    ----------
    lengths
        Token length of each sequence.
    max_rows
        Most sequences per batch (the encoder's batch size).
    max_batch_tokens
        Most padded tokens per batch; ``None``: no cap beyond ``max_rows``.
    forward_cost_tokens
        ``c_0`` (``0``: minimise padding only; larger: fewer, fuller batches).

    Returns
    -------
    list[list[int]]
        Indices into ``lengths``, one list per batch, longest batch first; within a batch the
        longest sequence first (ties in input order).

    Examples
    --------
    >>> length_buckets([50, 50, 10], max_rows=8, forward_cost_tokens=20)   # 20 + 100 + 20 + 10 < 20 + 150
    [[0, 1], [2]]
    >>> length_buckets([50, 50, 10], max_rows=8, forward_cost_tokens=100)  # 100 + 150 < 100 + 100 + 100 + 10
    [[0, 1, 2]]
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1 or None, got {max_batch_tokens}")
    if forward_cost_tokens < 0:
        raise ValueError(f"forward_cost_tokens must be >= 0, got {forward_cost_tokens}")
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    inf = float("inf")
    best = [0.0] + [inf] * n  # best[j]: least cost of the first j sorted sequences
    cut = [0] * (n + 1)  # cut[j]: where the last batch of that optimum starts
    for i in range(n):  # a batch starting at sorted position i, whose longest sequence is l_{i+1}
        longest = max(1, int(lengths[order[i]]))
        rows_cap = min(max_rows, n - i)
        if max_batch_tokens is not None:
            rows_cap = min(rows_cap, max(1, max_batch_tokens // longest))
        for rows in range(1, rows_cap + 1):
            c = best[i] + forward_cost_tokens + rows * longest
            if c < best[i + rows]:
                best[i + rows], cut[i + rows] = c, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]
