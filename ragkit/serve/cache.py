"""A bounded LRU cache of (query, document) scores for the pointwise rerankers of ``ragkit serve``.

The same (query, document) pairs recur in production traffic (a popular query, a client's
retry, a page of results fetched twice). A pointwise reranker scores each pair on its own
(cross-encoders, the distilled student, ``llm:``), so a pair's score can be reused; MoI's are
not pointwise (a passage's utility depends on the other passages of the request) and are never
cached. The key is ``(model key, hash(query), hash(document))``, the model key naming the model,
its weights' revision, its backend and its long-document rule, so that a score is never served
for another model or another reading of the text. Entries hold the score and how the document
was read (truncated, chunks), so a cached answer reports the same ``meta`` as a fresh one.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["ScoreCache", "cached_rank_many", "model_key"]


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class ScoreCache:
    """An LRU map of pair keys to ``(score, truncated, chunks)``, at most ``size`` entries.

    Used from the server's single reranker thread only (no lock). ``hits`` and ``misses`` count
    lookups; ``on_lookup(hit)`` is called for each (the server's Prometheus counters).
    """

    def __init__(self, size: int, on_lookup: Callable[[bool], None] | None = None) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"a score cache holds at least 1 entry, got size={size!r}; use no cache for 0")
        self.size = size
        self._data: OrderedDict[tuple[str, bytes, bytes], tuple[float, bool, int]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.on_lookup = on_lookup

    def __len__(self) -> int:
        return len(self._data)

    @staticmethod
    def key(model: str, query: str, document: str) -> tuple[str, bytes, bytes]:
        """The cache key of one pair."""
        return model, _digest(query), _digest(document)

    def get(self, key: tuple[str, bytes, bytes]) -> tuple[float, bool, int] | None:
        """The cached entry (and mark it recently used), or ``None``."""
        v = self._data.get(key)
        if v is None:
            self.misses += 1
        else:
            self._data.move_to_end(key)
            self.hits += 1
        if self.on_lookup is not None:
            self.on_lookup(v is not None)
        return v

    def put(self, key: tuple[str, bytes, bytes], value: tuple[float, bool, int]) -> None:
        """Store ``value``; the least recently used entry goes when the cache is full."""
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)


def model_key(reranker: Any, name: str) -> str:
    """``name`` plus the reranker's class, weights revision, backend and long-document rule.

    The revision is the model's hub commit when it has one, else a hash of its weights (computed
    once, at start-up), else of the exported ONNX file's size and time.
    """
    model = getattr(reranker, "model", None)
    hf = getattr(model, "transformers_model", None) or model
    rev = getattr(getattr(hf, "config", None), "_commit_hash", None)
    if rev is None and hasattr(hf, "state_dict"):
        from ragkit.debias.onnx_encoder import weights_hash

        rev = weights_hash(hf)
    if rev is None and getattr(model, "path", None) is not None:
        st = model.path.stat()
        rev = f"{model.path}:{st.st_size}:{st.st_mtime_ns}"
    long_docs = getattr(reranker, "long_docs", None)
    rule = json.dumps(long_docs.to_dict(), sort_keys=True) if long_docs is not None else ""
    return f"{name}|{type(reranker).__name__}|{rev}|{getattr(reranker, 'backend', 'torch')}|{rule}"


def cached_rank_many(reranker: Any, cache: ScoreCache, key: str, queries: list[str],
                     passages: list[list[Passage]]) -> list[RankedList]:
    """``reranker.rank_many(queries, passages)`` with each pair's score read from ``cache`` when
    there, the missing pairs scored in one call and stored.

    Each ranking's ``info.details`` holds ``long_docs`` (counts over all its documents, cached or
    not) and ``cache`` (``hits``, ``misses``).
    """
    entries: list[list[tuple[float, bool, int] | None]] = []
    keys: list[list[tuple[str, bytes, bytes]]] = []
    miss_q: list[str] = []
    miss_p: list[list[Passage]] = []
    miss_of: list[int] = []
    for qi, (q, ps) in enumerate(zip(queries, passages)):
        ks = [cache.key(key, q, p.contents) for p in ps]
        es = [cache.get(k) for k in ks]
        keys.append(ks)
        entries.append(es)
        missing = [p for p, e in zip(ps, es) if e is None]
        if missing:
            miss_q.append(q)
            miss_p.append(missing)
            miss_of.append(qi)
    fresh = reranker.rank_many(miss_q, miss_p) if miss_q else []
    for qi, ps, ranked in zip(miss_of, miss_p, fresh):
        per = dict(ranked.info.details.get("long_docs", {}).get("per_document", {}))
        trunc = per.get("truncated", [False] * len(ps))
        chunks = per.get("chunks", [1] * len(ps))
        score = {h.passage.id: h.score for h in ranked}
        where = {id(p): j for j, p in enumerate(ps)}
        for i, p in enumerate(passages[qi]):
            if entries[qi][i] is None:
                j = where[id(p)]
                v = (float(score[p.id]), bool(trunc[j]), int(chunks[j]))
                entries[qi][i] = v
                cache.put(keys[qi][i], v)
    out = []
    for qi, (q, ps) in enumerate(zip(queries, passages)):
        es = [e for e in entries[qi] if e is not None]
        n_miss = sum(qi == m for m in miss_of) and len(miss_p[miss_of.index(qi)])
        details = {"long_docs": {"documents": len(ps), "truncated": sum(e[1] for e in es),
                                 "chunked": sum(e[2] > 1 for e in es), "sequences": sum(e[2] for e in es)},
                   "cache": {"hits": len(ps) - n_miss, "misses": n_miss}}
        out.append(RankedList.from_scores(ps, [e[0] for e in es], Query(q), RankInfo(details=details)))
    return out
