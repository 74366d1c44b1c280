"""Scoring a merged micro-batch pair by pair: identical pairs once, length-bucketed encoder batches.

A cross-encoder scores every (query, passage) pair on its own, ``s = f(q, p)`` (Nogueira & Cho,
"Passage Re-ranking with BERT", arXiv 1901.04085), so the pairs of several requests can be
regrouped freely without changing any score. Run as one ``rank_many`` call, the pairs of a merged
batch go through the encoder in ``batch_size`` chunks, each padded to its longest pair: with
paragraphs of 100-380 tokens, a chunk of 64 pairs carries ~1.6x the real tokens (the attention
cost grows with the square of the padded length). :class:`PairBatchScorer` instead

1. scores each distinct ``(query, passage text)`` pair once (retries, popular queries and
   duplicated documents inside a request cost nothing extra);
2. sorts the distinct pairs by their token length ``l_1 >= l_2 >= ... >= l_n`` (the model's own
   tokenizer, truncated at its ``max_length``) and cuts the sorted list into contiguous
   sub-batches ``B`` minimising the modelled encoder cost
   ``sum_B (c_0 + |B| * max(l in B))``, where ``c_0`` (``forward_cost_tokens``) is the fixed cost
   of one forward in token-equivalents, subject to ``|B| * max(l in B) <= max_batch_tokens`` and
   ``|B| <=`` the reranker's ``batch_size``; the optimum comes from the dynamic programme
   ``f(j) = min_i f(i) + c_0 + (j - i) * l_{i+1}`` over the sorted list (sequence bucketing,
   cf. the length-sorted batching of Sutskever et al., "Sequence to Sequence Learning with
   Neural Networks", arXiv 1409.3215, made optimal for a linear cost model);
3. rebuilds every request's ranking from its pairs' scores exactly as the reranker does
   (``RankedList.from_scores``: descending score, ties in input order).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ragkit.debias.cross_encoder import CrossEncoderReranker, pair_text
from ragkit.types import Passage, RankedList, as_query

__all__ = ["PairBatchScorer", "is_pointwise"]

logger = logging.getLogger(__name__)


def is_pointwise(reranker: Any) -> bool:
    """Whether ``reranker`` ranks by independent per-pair scores (a plain cross-encoder / student).

    True for :class:`~ragkit.debias.cross_encoder.CrossEncoderReranker` and subclasses that keep
    its ranking rule (``_rank_many`` not overridden); False for MoI and any listwise reranker,
    whose scores depend on the other passages of the list.
    """
    return isinstance(reranker, CrossEncoderReranker) and \
        type(reranker)._rank_many is CrossEncoderReranker._rank_many


class PairBatchScorer:
    """``rank_many`` for a pointwise cross-encoder that deduplicates pairs and buckets them by length.

    Parameters
    ----------
    reranker
        A pointwise :class:`~ragkit.debias.cross_encoder.CrossEncoderReranker` (see
        :func:`is_pointwise`); its ``score_pairs`` runs once per sub-batch.
    max_batch_tokens
        Most padded tokens (rows x longest row) in one encoder forward.
    forward_cost_tokens
        ``c_0``: the fixed cost of one encoder forward, in tokens (``0``: minimise padding only;
        larger: fewer, fuller forwards). Per-forward overhead is small on one CPU thread and on a
        GPU's launch queue, larger where intra-op threads must meet at every operator.

    Attributes
    ----------
    pairs_requested, pairs_scored, padded_tokens, real_tokens
        Running totals: pairs asked for, distinct pairs run through the encoder, and their
        padded / real token counts (``padded_tokens / real_tokens`` is the padding overhead).
    """

    def __init__(self, reranker: CrossEncoderReranker, max_batch_tokens: int = 4096,
                 forward_cost_tokens: int = 128) -> None:
        if not is_pointwise(reranker):
            raise TypeError(f"{type(reranker).__name__} is not a pointwise cross-encoder reranker; "
                            "serve it through its own rank_many")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if forward_cost_tokens < 0:
            raise ValueError(f"forward_cost_tokens must be >= 0, got {forward_cost_tokens}")
        self.reranker = reranker
        self.max_batch_tokens = int(max_batch_tokens)
        self.forward_cost_tokens = int(forward_cost_tokens)
        self.pairs_requested = 0
        self.pairs_scored = 0
        self.padded_tokens = 0
        self.real_tokens = 0

    def token_lengths(self, queries: Sequence[str], texts: Sequence[str]) -> list[int]:
        """Tokens of each (query, text) pair as the encoder sees it (truncated at ``max_length``).

        Falls back to ``len(query + text) // 4`` (about 4 characters per English token) for a
        model without a tokenizer.
        """
        model = self.reranker.model
        tok = getattr(model, "tokenizer", None)
        if tok is None or not callable(tok):
            return [max(1, (len(q) + len(t)) // 4) for q, t in zip(queries, texts)]
        max_length = getattr(model, "max_length", None)
        enc = tok(list(queries), list(texts), truncation=max_length is not None, max_length=max_length,
                  padding=False, return_attention_mask=False, return_token_type_ids=False)
        return [len(ids) for ids in enc["input_ids"]]

    def buckets(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of ``lengths`` cut into the cheapest sub-batches (longest first; see the module doc)."""
        order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
        n = len(order)
        max_rows = max(1, int(getattr(self.reranker, "batch_size", n) or n))
        inf = float("inf")
        best = [0.0] + [inf] * n  # best[j]: cheapest cost of the first j sorted pairs
        cut = [0] * (n + 1)
        for i in range(n):  # a sub-batch starting at sorted position i (its longest pair)
            if best[i] == inf:
                continue
            longest = lengths[order[i]]
            rows_cap = min(max_rows, n - i, max(1, self.max_batch_tokens // max(1, longest)))
            for rows in range(1, rows_cap + 1):
                c = best[i] + self.forward_cost_tokens + rows * longest
                if c < best[i + rows]:
                    best[i + rows], cut[i + rows] = c, i
        out: list[list[int]] = []
        j = n
        while j > 0:
            out.append(order[cut[j]:j])
            j = cut[j]
        return out[::-1]

    def __call__(self, queries: Sequence[Any], passages: Sequence[Sequence[Passage]]) -> list[RankedList]:
        """Rank each query's passages; the same rankings as ``reranker.rank_many(queries, passages)``."""
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        qs = [as_query(q) for q in queries]
        for q, ps in zip(qs, passages):
            if not ps:
                raise ValueError(f"no passages to rerank for query {q.text!r}; pass at least one")
        index: dict[tuple[str, str], int] = {}
        uq: list[str] = []
        up: list[Passage] = []
        keys: list[list[int]] = []
        for q, ps in zip(qs, passages):
            row = []
            for p in ps:
                key = (q.text, pair_text(p))
                if key not in index:
                    index[key] = len(uq)
                    uq.append(q.text)
                    up.append(p)
                row.append(index[key])
            keys.append(row)
        lengths = self.token_lengths(uq, [pair_text(p) for p in up])
        scores = [0.0] * len(uq)
        for b in self.buckets(lengths):
            flat = self.reranker.score_pairs([uq[i] for i in b], [[up[i]] for i in b])
            for i, s in zip(b, flat):
                scores[i] = float(s[0])
            self.padded_tokens += len(b) * lengths[b[0]]
        self.pairs_requested += sum(len(r) for r in keys)
        self.pairs_scored += len(uq)
        self.real_tokens += sum(lengths)
        return [RankedList.from_scores(list(ps), [scores[k] for k in row], q)
                for q, ps, row in zip(qs, passages, keys)]
