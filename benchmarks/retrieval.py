"""Retrieval speed: bm25s vs rank_bm25 on one generated corpus, dense encoding and FAISS search.

All numbers come from one run on one machine, so ratios are comparable; absolute numbers depend
on the machine's load.

* ``bm25s_qps``: batched ``BM25Retriever.search`` (bm25s index, NumPy scorer, one thread) over
  all queries; ``bm25s_numba_qps`` the same with ragkit's numba scorer (the default when numba is
  installed); ``numba_top10_equal_numpy`` the share of queries whose top-k (ids and scores) are
  identical (1.0: both select exactly by score, then position).
* ``numba_cold_compile_s`` / ``numba_cached_first_search_s``: the first search of a fresh process
  with an empty numba cache, then with the cache written by that run (import of numba included).
* ``bm25s_native_numba_top10_equal_numpy``: bm25s's *own* retrieve with its numba backend against
  its NumPy backend on the same index (what ragkit used before); ``..._score_lists_equal`` the
  share whose sorted top-k *scores* agree -- 1.0 shows every difference is which of several
  documents tied at the k-th score were kept, not a score difference.
* ``rank_bm25_qps``: ``BM25Retriever(backend="rank_bm25")`` on the first ``--rank-bm25-queries``
  queries only (it scores every document in Python-level numpy per query term: slow).
* ``bm25_speedup`` = ``bm25s_qps / rank_bm25_qps`` (same corpus, tokenizer, k).
* ``dense_encode_per_s``: the encoder (``--embedder``, default the embedded all-MiniLM-L6-v2) on
  ``--device`` encoding ``--n-encode`` generated passages (batch 64).
* ``dense_search_qps_flat`` / ``_hnsw``: FAISS search of ``--n-docs`` random unit vectors of the
  encoder's dimension (search cost depends on n and d, not on content), batched queries, k=10.

* ``rss``: with ``--rss-docs N`` (e.g. 1000000), N short passages (8-16 words) are written to a
  JSONL corpus and indexed with BM25 in a fresh process, the corpus streamed with
  ``ragkit.retrievers.base.iter_passages`` (``streamed``) and, for comparison, read whole first
  (``read_whole``: ``read_jsonl`` then ``Passage`` objects); peak RSS (``ru_maxrss``) and seconds.

Usage::

    python benchmarks/retrieval.py --out benchmarks/results/retrieval-cpu.json [--n-docs 50000]
    python benchmarks/retrieval.py --out benchmarks/results/retrieval-rss-1m-cpu.json \
        --only rss --rss-docs 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.eval.harness import gpu_epilog, write_result
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


def write_short_corpus(path: Path, n: int, seed: int = 0, vocab_size: int = 50000) -> None:
    """``n`` passages of 8-16 Zipf-distributed pseudo-words as corpus JSONL, written in blocks."""
    rng = np.random.default_rng(seed)
    vocab = make_vocab(vocab_size, rng)
    p = 1.0 / np.arange(1, vocab_size + 1)
    p /= p.sum()
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            m = min(100_000, n - start)
            lengths = rng.integers(8, 17, size=m)
            toks = rng.choice(vocab_size, size=int(lengths.sum()), p=p)
            pos = 0
            lines = []
            for i, ln in enumerate(lengths):
                text = " ".join(vocab[t] for t in toks[pos:pos + ln])
                pos += ln
                lines.append(json.dumps({"id": f"p{start + i}", "text": text}) + "\n")
            f.write("".join(lines))


def rss_child(corpus: str, mode: str) -> dict[str, Any]:
    """Index ``corpus`` with BM25 in this (fresh) process; peak RSS in MiB."""
    from ragkit.retrievers import BM25Retriever
    from ragkit.retrievers.base import iter_passages

    r = BM25Retriever(method="lucene", show_progress=False)
    r.tokenizer(["warm up"])
    _ = r.scorer  # imports bm25s, PyStemmer, numba: the fixed cost, before any data
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if mode == "streamed":
        source: Any = iter_passages(corpus)
    else:
        from ragkit.io import read_jsonl
        from ragkit.types import Passage

        source = [Passage.from_dict(r) for r in read_jsonl(corpus)]
    r.index(source)
    t_index = time.perf_counter() - t0
    hits = r.search(["kalo mine"], k=10)
    return {"mode": mode, "n_docs": len(r), "index_s": t_index,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_imports_mib": base, "data_rss_mib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024 - base,
            "scorer": r.scorer, "hits": len(hits[0])}


def run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True,
                         text=True, env={**os.environ, **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def first_search_child() -> dict[str, Any]:
    """Time a fresh process's first numba search (the JIT compile or the cache load)."""
    from ragkit.retrievers import BM25Retriever

    r = BM25Retriever(scoring_backend="numba", show_progress=False).index(
        [Passage(f"d{i}", f"alpha beta w{i}") for i in range(50)])
    t0 = time.perf_counter()
    r.search(["alpha"], k=5)
    return {"first_search_s": time.perf_counter() - t0}


def timed(fn: Any, *a: Any, **kw: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def bm25_part(args: argparse.Namespace, corpus: list[Passage], queries: list[str],
              res: dict[str, Any]) -> None:
    from ragkit.retrievers import BM25Retriever

    fast = BM25Retriever(method="okapi", scoring_backend="numpy", show_progress=False)
    _, res["bm25s_index_s"] = timed(fast.index, corpus)
    fast.search(queries[:5], k=args.k)  # warm-up
    fast_out, t = timed(fast.search, queries, k=args.k)
    res["bm25s_qps"] = len(queries) / t
    if not args.no_numba:
        nb = BM25Retriever(method="okapi", scoring_backend="numba", show_progress=False)
        nb._set_passages(fast._passages)
        nb._model = fast._model  # the same bm25s index, scored by ragkit's numba kernel
        _, res["bm25s_numba_warmup_s"] = timed(nb.search, queries[:5], k=args.k)
        nb_out, t = timed(nb.search, queries, k=args.k)
        res["bm25s_numba_qps"] = len(queries) / t
        res["numba_top10_equal_numpy"] = float(np.mean(
            [a.ids() == b.ids() and a.scores() == b.scores() for a, b in zip(nb_out, fast_out)]))
        with tempfile.TemporaryDirectory() as cache:
            env = {"NUMBA_CACHE_DIR": cache}
            res["numba_cold_compile_s"] = run_child(["--out", "-", "--_first-search-child"],
                                                    env)["first_search_s"]
            res["numba_cached_first_search_s"] = run_child(
                ["--out", "-", "--_first-search-child"], env)["first_search_s"]
        # bm25s's own selections on the same index (ragkit's path before this version)
        m = fast._model
        ids = [[m.vocab_dict[w] for w in toks if w in m.vocab_dict]
               for toks in fast.tokenizer(queries)]
        live = [i for i, q in enumerate(ids) if q]
        qs = [ids[i] for i in live]
        m.backend = "numpy"
        d_np, s_np = m.retrieve(qs, k=args.k, show_progress=False, sorted=True)
        m.backend = "numba"
        _, res["bm25s_native_numba_warmup_s"] = timed(m.retrieve, qs[:5], k=args.k,
                                                      show_progress=False, sorted=True)
        d_nb, s_nb = m.retrieve(qs, k=args.k, show_progress=False, sorted=True)
        m.backend = "numpy"
        same_ids = [set(a) == set(b) for a, b in zip(d_np, d_nb)]
        same_scores = [np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(s_np, s_nb)]
        res["bm25s_native_numba_top10_equal_numpy"] = float(np.mean(same_ids))
        res["bm25s_native_numba_score_lists_equal"] = float(np.mean(same_scores))
        exact = [fast_out[i].ids() for i in live]
        res["bm25s_native_numpy_top10_equal_exact"] = float(np.mean(
            [set(e) == {fast.passages[j].id for j in d} for e, d in zip(exact, d_np)]))
        res["bm25s_native_numba_top10_equal_exact"] = float(np.mean(
            [set(e) == {fast.passages[j].id for j in d} for e, d in zip(exact, d_nb)]))

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


def rss_part(args: argparse.Namespace, res: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "short.jsonl"
        _, res["rss_corpus_write_s"] = timed(write_short_corpus, corpus, args.rss_docs, args.seed)
        res["rss_corpus_mib"] = corpus.stat().st_size / 2**20
        for mode in ("streamed", "read_whole"):
            r = run_child(["--out", "-", "--_rss-child", str(corpus), mode])
            res[f"rss_{mode}"] = r
            print(f"  {mode}: peak RSS {r['peak_rss_mib']:.0f} MiB, index {r['index_s']:.1f} s",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/retrieval.py", "--device cuda --embedder BAAI/bge-base-en-v1.5 --n-encode 50000 "
                                          "--out benchmarks/results/retrieval-gpu.json", generator=False,
                          note="(No generator here: on a GPU the dense rows change -- the encoder on --device, and "
                               "FAISS flat search on GPU 0\nwhen faiss-gpu is installed, "
                               '`pip install "ragkit[gpu]"`; BM25 runs on the CPU either way.)'))
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--embedder", default=None,
                    help="dense encoder: hub id or folder (default: the embedded all-MiniLM-L6-v2)")
    ap.add_argument("--device", default="cpu", help="encoder device: cpu (default), cuda, auto")
    ap.add_argument("--n-docs", type=int, default=50000)
    ap.add_argument("--n-queries", type=int, default=1000)
    ap.add_argument("--rank-bm25-queries", type=int, default=20)
    ap.add_argument("--n-encode", type=int, default=2000, help="passages for the encoding speed")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--no-numba", action="store_true", help="skip the numba scorer")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense measurements")
    ap.add_argument("--only", choices=("bm25", "dense", "rss"), default=None,
                    help="run one part only")
    ap.add_argument("--rss-docs", type=int, default=0,
                    help="peak RSS of BM25 indexing this many short passages (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--_rss-child", nargs=2, metavar=("CORPUS", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--_first-search-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    if args._rss_child:
        print(json.dumps(rss_child(*args._rss_child)))
        return 0
    if args._first_search_child:
        print(json.dumps(first_search_child()))
        return 0
    do = {part: args.only in (None, part) for part in ("bm25", "dense", "rss")}
    do["dense"] = do["dense"] and not args.no_dense
    do["rss"] = do["rss"] and args.rss_docs > 0

    corpus: list[Passage] = []
    queries: list[str] = []
    if do["bm25"] or do["dense"]:
        corpus, vocab, _ = make_corpus(args.n_docs, seed=args.seed)
        queries = make_queries(args.n_queries, vocab, seed=args.seed + 1)
    res: dict[str, Any] = {
        "n_docs": args.n_docs, "n_queries": args.n_queries, "k": args.k,
        "rank_bm25_queries": args.rank_bm25_queries,
        "notes": ("rank_bm25 is timed on the first rank_bm25_queries queries only (it is slow); "
                  "bm25s on all n_queries in one batched call. Same corpus, tokenizer "
                  "(lower-case, English stopwords, Snowball stemming), method okapi on both "
                  "backends, k."),
    }

    # ---------------------------------------------------------------- BM25
    if do["bm25"]:
        bm25_part(args, corpus, queries, res)

    # ---------------------------------------------------------------- rss
    if do["rss"]:
        res["rss_docs"] = args.rss_docs
        rss_part(args, res)

    # ---------------------------------------------------------------- dense
    if do["dense"]:
        import faiss
        import torch

        from ragkit.models import DEFAULT_EMBEDDER
        from ragkit.retrievers import DenseRetriever

        res["torch_threads"] = torch.get_num_threads()
        enc = DenseRetriever(args.embedder, device=args.device, show_progress=False)
        enc.encode_passages(corpus[:64])  # load + warm-up
        n_enc = min(args.n_encode, len(corpus))
        vecs, t = timed(enc.encode_passages, corpus[:n_enc])
        res["dense_encoder"] = args.embedder or DEFAULT_EMBEDDER
        res["dense_device"] = args.device
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
            r = DenseRetriever(args.embedder, index_type=index_type, device=args.device, show_progress=False)
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
    write_result(args.out, res, device=None if args.device == "auto" else args.device)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
