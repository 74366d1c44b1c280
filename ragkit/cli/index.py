"""``ragkit index`` and ``ragkit search``: build and query BM25 / dense / hybrid indexes.

Examples
--------
::

    ragkit index --corpus corpus.jsonl --out idx/bm25 --kind bm25
    ragkit index --out idx/dense --kind dense --embedder all-MiniLM-L6-v2   # bundled sample corpus
    ragkit search --index idx/bm25 --query "Who founded Arthur's Magazine?" -k 5
    ragkit search --query "capital of France" --json                         # in-memory BM25 of the sample
"""

from __future__ import annotations

import argparse
import logging
import textwrap
import time
from pathlib import Path
from typing import Any

from ragkit.cli._common import add_k_arg, add_output_args, emit, positive_int

logger = logging.getLogger(__name__)

__all__ = ["register", "cmd_index", "cmd_search"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``index`` and ``search`` sub-commands."""
    p = subparsers.add_parser(
        "index", help="build a BM25 / dense / hybrid index of a JSONL corpus",
        description="Index a corpus (JSONL lines {\"id\", \"text\", \"title\"?}); without --corpus "
                    "the bundled HotpotQA sample corpus is indexed.")
    p.add_argument("--corpus", help="corpus JSONL file (.gz ok); default: bundled sample")
    p.add_argument("--kind", choices=("bm25", "dense", "hybrid"), default="bm25")
    p.add_argument("--embedder", default=None,
                   help="sentence-transformers name or path (default: embedded all-MiniLM-L6-v2)")
    p.add_argument("--index-type", choices=("flat", "hnsw", "ivf"), default="flat",
                   help="FAISS index for dense/hybrid (default flat)")
    p.add_argument("--method", default=None,
                   help="BM25 variant: lucene (default), robertson, atire, okapi, bm25l, bm25+")
    p.add_argument("--no-stemming", action="store_true", help="BM25 without Snowball stemming")
    p.add_argument("--no-stopwords", action="store_true", help="BM25 keeps stopwords")
    p.add_argument("--fusion", choices=("rrf", "minmax"), default="rrf", help="hybrid fusion")
    p.add_argument("--device", default="auto", help="encoder device (auto, cpu, cuda, ...)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="encoder batch size (default 64)")
    add_output_args(p, folder=True, required=True,
                    out_help="index folder to write: new, empty or a previous ragkit index (replaced atomically)")
    p.set_defaults(func=cmd_index)

    s = subparsers.add_parser(
        "search", help="search an index with one or more queries",
        description="Search a saved index; without --index, an in-memory BM25 index of the "
                    "bundled HotpotQA sample corpus is used.")
    s.add_argument("--index", default=None, help="index folder written by `ragkit index`")
    s.add_argument("--query", "-q", action="append", required=True,
                   help="query text (repeat for several queries; they are searched in one batch)")
    add_k_arg(s, default=10, help="hits per query")
    s.add_argument("--embedder", default=None,
                   help="expected embedder of a dense index (error if it was built with another)")
    s.add_argument("--device", default="auto", help="encoder device for dense indexes")
    add_output_args(s, out_help="also write the JSON results to this file")
    s.set_defaults(func=cmd_search)


def _retriever_of(args: argparse.Namespace) -> Any:
    from ragkit.retrievers import make_retriever

    return make_retriever(args.kind, embedder=args.embedder, device=args.device, index_type=args.index_type,
                          batch_size=args.batch_size, bm25_method=args.method or "lucene",
                          stemmer=None if args.no_stemming else "english",
                          stopwords=None if args.no_stopwords else "en", fusion=args.fusion)


def cmd_index(args: argparse.Namespace) -> int:
    """Handler of ``ragkit index``."""
    from ragkit.io import check_writable_dir
    from ragkit.retrievers.base import iter_passages

    check_writable_dir(args.out, "index", args.overwrite)  # before any work
    if args.corpus:
        if not Path(args.corpus).is_file():
            raise FileNotFoundError(f"no such corpus file: {args.corpus}")
        passages = iter_passages(args.corpus)  # streamed: the corpus is never held whole
        source = args.corpus
    else:
        from ragkit.datasets import sample_corpus

        passages = sample_corpus()
        source = "bundled HotpotQA sample"
    retriever = _retriever_of(args)
    t0 = time.perf_counter()
    retriever.index(passages)
    t_index = time.perf_counter() - t0
    retriever.save(args.out, overwrite=args.overwrite)
    summary = {"out": str(args.out), "kind": retriever.kind, "n_docs": len(retriever),
               "corpus": source, "index_seconds": round(t_index, 3), "params": retriever.params}
    emit(summary, args, f"indexed {len(retriever)} passages from {source} ({retriever.kind}) "
                        f"in {t_index:.1f} s -> {args.out}")
    return 0


def _hit_row(h: Any) -> dict[str, Any]:
    return {"rank": h.rank + 1, "id": h.passage.id, "score": h.score,
            "title": h.passage.title, "text": h.passage.text}


def format_table(results: list[dict[str, Any]], width: int = 72) -> str:
    """Readable plain-text table: one block per query, one line per hit."""
    lines: list[str] = []
    for r in results:
        lines.append(f"query: {r['query']}")
        lines.append(f"{'rank':>4}  {'score':>9}  {'id':<28}  text")
        for h in r["hits"]:
            snippet = textwrap.shorten(h["text"], width=width, placeholder="...")
            lines.append(f"{h['rank']:>4}  {h['score']:>9.4f}  {str(h['id'])[:28]:<28}  {snippet}")
        lines.append("")
    return "\n".join(lines)


def cmd_search(args: argparse.Namespace) -> int:
    """Handler of ``ragkit search``."""
    from ragkit.retrievers import BM25Retriever, load_retriever

    if args.index:
        kw: dict[str, Any] = {"device": args.device} if args.device != "auto" else {}
        if args.embedder:
            kw["model"] = args.embedder
        retriever = load_retriever(args.index, **kw)
        source = str(args.index)
        if args.embedder and retriever.kind == "bm25":
            raise ValueError(f"--embedder {args.embedder}: {args.index} is a BM25 index, which uses no embedder; "
                             "drop --embedder (it checks the encoder of a dense or hybrid index)")
    else:
        from ragkit.datasets import sample_corpus

        retriever = BM25Retriever(show_progress=False).index(sample_corpus())
        source = "in-memory BM25 of the bundled HotpotQA sample"
    t0 = time.perf_counter()
    lists = retriever.search(args.query, k=args.k)
    elapsed = time.perf_counter() - t0
    results = [{"query": q, "hits": [_hit_row(h) for h in rl]} for q, rl in zip(args.query, lists)]
    out = {"index": source, "kind": retriever.kind, "k": args.k,
           "search_seconds": round(elapsed, 4), "results": results}
    emit(out, args, f"# {source} ({retriever.kind}, {len(retriever)} passages)\n\n{format_table(results)}")
    return 0
