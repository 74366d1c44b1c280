"""Retrieval speed: bm25s vs rank_bm25 on one generated corpus, dense encoding and FAISS search.

All numbers come from one run on one machine, so ratios are comparable; absolute numbers depend
on the machine's load.

* ``bm25s_qps``: batched ``BM25Retriever.search`` (bm25s, numpy scorer, one thread) over all
  queries; ``bm25s_numba_qps`` the same with bm25s's numba scorer (JIT warm-up excluded).
* ``rank_bm25_qps``: ``BM25Retriever(backend="rank_bm25")`` on the first ``--rank-bm25-queries``
  queries only (it scores every document in Python-level numpy per query term: slow).
* ``bm25_speedup`` = ``bm25s_qps / rank_bm25_qps`` (same corpus, tokenizer, k).
* ``dense_encode_per_s``: the embedded all-MiniLM-L6-v2 encoding ``--n-encode`` generated
  passages (batch 64).
* ``dense_search_qps_flat`` / ``_hnsw``: FAISS search of ``--n-docs`` random unit vectors of the
  encoder's dimension (search cost depends on n and d, not on content), batched queries, k=10.

Usage::

    python benchmarks/retrieval.py --out benchmarks/results/retrieval-cpu.json [--n-docs 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np

from ragkit.io import atomic_write_text
from ragkit.types import Passage

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "da", "fo", "gu", "ha", "ji",
             "pe", "qu", "ri", "zo", "ta", "mo"]


def make_vocab(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct pseudo-words of 2-4 syllables."""
    words: dict[str, None] = {}
    while len(words) < n:
        k = int(rng.integers(2, 5))
        words["".join(rng.choice(SYLLABLES, size=k))] = None
    return list(words)


def make_corpus(n_docs: int, seed: int = 0, vocab_size: int = 30000,
                zipf_s: float = 1.0) -> tuple[list[Passage], list[str], np.ndarray]:
    """Documents of 40-120 Zipf-distributed pseudo-words; returns (passages, vocab, probs)."""
    rng = np.random.default_rng(seed)
    vocab = make_vocab(vocab_size, rng)
    p = 1.0 / np.arange(1, vocab_size + 1) ** zipf_s
    p /= p.sum()
    lengths = rng.integers(40, 121, size=n_docs)
    tokens = rng.choice(vocab_size, size=int(lengths.sum()), p=p)
    docs, start = [], 0
    for i, n in enumerate(lengths):
        docs.append(Passage(id=f"doc{i}", text=" ".join(vocab[t] for t in tokens[start:start + n])))
        start += n
    return docs, vocab, p


def make_queries(n: int, vocab: list[str], seed: int = 1) -> list[str]:
    """Queries of 3-6 words drawn from the 50..5000 most frequent words (they all match)."""
    rng = np.random.default_rng(seed)
    return [" ".join(vocab[i] for i in rng.integers(50, 5000, size=int(rng.integers(3, 7))))
            for _ in range(n)]


def timed(fn: Any, *a: Any, **kw: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--n-docs", type=int, default=50000)
    ap.add_argument("--n-queries", type=int, default=1000)
    ap.add_argument("--rank-bm25-queries", type=int, default=20)
    ap.add_argument("--n-encode", type=int, default=2000, help="passages for the encoding speed")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--no-numba", action="store_true", help="skip the bm25s numba scorer")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense measurements")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")

    from ragkit.retrievers import BM25Retriever

    corpus, vocab, _ = make_corpus(args.n_docs, seed=args.seed)
    queries = make_queries(args.n_queries, vocab, seed=args.seed + 1)
    res: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                    "cpu_count": os.cpu_count(), "processor": platform.processor()},
        "n_docs": args.n_docs, "n_queries": args.n_queries, "k": args.k,
        "rank_bm25_queries": args.rank_bm25_queries,
        "notes": ("rank_bm25 is timed on the first rank_bm25_queries queries only (it is slow); "
                  "bm25s on all n_queries in one batched call. Same corpus, tokenizer "
                  "(lower-case, English stopwords, Snowball stemming), method okapi on both "
                  "backends, k."),
    }

    # ---------------------------------------------------------------- BM25
    fast = BM25Retriever(method="okapi", show_progress=False)
    _, res["bm25s_index_s"] = timed(fast.index, corpus)
    fast.search(queries[:5], k=args.k)  # warm-up
    fast_out, t = timed(fast.search, queries, k=args.k)
    res["bm25s_qps"] = len(queries) / t
    if not args.no_numba:
        nb = BM25Retriever(method="okapi", scoring_backend="numba", show_progress=False)
        nb.index(corpus)
        _, res["bm25s_numba_warmup_s"] = timed(nb.search, queries[:5], k=args.k)
        nb_out, t = timed(nb.search, queries, k=args.k)
        res["bm25s_numba_qps"] = len(queries) / t
        res["numba_top10_equal_numpy"] = float(np.mean(
            [a.ids() == b.ids() for a, b in zip(nb_out, fast_out)]))

    slow = BM25Retriever(method="okapi", backend="rank_bm25", show_progress=False)
    _, res["rank_bm25_index_s"] = timed(slow.index, corpus)
    sub = queries[: args.rank_bm25_queries]
    slow_out, t = timed(slow.search, sub, k=args.k)
    res["rank_bm25_qps"] = len(sub) / t
    res["bm25_speedup"] = res["bm25s_qps"] / res["rank_bm25_qps"]
    if "bm25s_numba_qps" in res:
        res["bm25_numba_speedup"] = res["bm25s_numba_qps"] / res["rank_bm25_qps"]
    res["bm25_top10_overlap_vs_rank_bm25"] = float(np.mean(
        [len(set(a.ids()) & set(b.ids())) / args.k for a, b in zip(fast_out, slow_out)]))

    # ---------------------------------------------------------------- dense
    if not args.no_dense:
        import faiss
        import torch

        from ragkit.models import DEFAULT_EMBEDDER
        from ragkit.retrievers import DenseRetriever

        res["torch_threads"] = torch.get_num_threads()
        enc = DenseRetriever(None, device="cpu", show_progress=False)
        enc.encode_passages(corpus[:64])  # load + warm-up
        n_enc = min(args.n_encode, len(corpus))
        vecs, t = timed(enc.encode_passages, corpus[:n_enc])
        res["dense_encoder"] = DEFAULT_EMBEDDER
        res["dense_encode_n"] = n_enc
        res["dense_encode_per_s"] = n_enc / t
        d = int(vecs.shape[1])
        rng = np.random.default_rng(args.seed)
        doc_vecs = rng.standard_normal((args.n_docs, d)).astype(np.float32)
        q_vecs = rng.standard_normal((args.n_queries, d)).astype(np.float32)
        q_vecs /= np.linalg.norm(q_vecs, axis=1, keepdims=True)
        res["faiss_threads"] = faiss.omp_get_max_threads()
        flat_hits = None
        for index_type in ("flat", "hnsw"):
            r = DenseRetriever(None, index_type=index_type, device="cpu", show_progress=False)
            _, res[f"dense_build_s_{index_type}"] = timed(r.index_vectors, corpus, doc_vecs)
            r.search_vectors(q_vecs[:5], args.k)
            out, t = timed(r.search_vectors, q_vecs, args.k)
            res[f"dense_search_qps_{index_type}"] = len(q_vecs) / t
            ids = [set(i.tolist()) for i, _ in out]
            if flat_hits is None:
                flat_hits = ids
            else:
                res[f"dense_recall10_{index_type}_vs_flat"] = float(np.mean(
                    [len(a & b) / args.k for a, b in zip(ids, flat_hits)]))
        res["dense_search_qps"] = res["dense_search_qps_flat"]

    # ---------------------------------------------------------------- report
    rows = [(k, v) for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    print(f"{'metric':<36} {'value':>14}")
    for k, v in rows:
        print(f"{k:<36} {v:>14.3f}" if isinstance(v, float) else f"{k:<36} {v:>14d}")
    atomic_write_text(args.out, json.dumps(res, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
