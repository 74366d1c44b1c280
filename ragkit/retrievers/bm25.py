"""Lexical retrieval with BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework:
BM25 and Beyond", Foundations and Trends in IR 2009).

Two backends share one tokeniser so that they rank identically for matching variants:

* ``bm25s`` (default): eager sparse scoring (Lù, "BM25S: Orders of magnitude faster lexical
  search via eager sparse scoring", 2024). Scores are pre-computed per (term, document) into a
  sparse matrix, so a query is a sum of a few sparse rows. Batched retrieval over threads.
* ``rank_bm25``: the reference pure-Python implementation (``BM25Okapi``, ``BM25L``,
  ``BM25Plus``), kept for parity checks and benchmarks.

Scoring of the ``bm25s`` index (``scoring_backend``): ``"numba"`` runs ragkit's compiled kernel
(:mod:`ragkit.retrievers._bm25_numba`, cached on disk after the first compilation), ``"numpy"``
bm25s's NumPy scorer; ``"auto"`` (default) = numba when it is installed. Both accumulate the same
float32 scores in the same order and select the top ``k`` exactly by (score descending, index
position ascending), so they return identical rankings (tested). bm25s's own top-k selections
keep an arbitrary part of a tie that straddles the k-th place; that, not float precision, is why
its numba and NumPy top-10s used to differ on about 9% of queries.

Hits are the passages a query term weighs on (a term of the query with a positive weight in the
passage, ``idf(t) * tfc(t, d) > 0``); the others all share the score of a passage without any
query term (0, or the constant ``delta`` credit of BM25L / BM25+) and are never returned, so a
list is shorter than ``k`` when fewer passages match (bm25s's own ``retrieve`` pads with them).
A query none of whose terms is in the index (only stop words, unknown words, or a text without
word breaks such as Chinese or Japanese, which the regex keeps as one long token) has no hits:
``search`` returns an empty list for it and logs why. A term in every passage weighs nothing
under ``robertson`` (idf floored at 0) and ``atire`` (``log(N / N) = 0``) and matches nothing.

Score of document ``d`` for query ``q`` (``tf`` = term frequency in ``d``, ``|d|`` its length,
``avgdl`` the mean length, ``N`` the corpus size, ``df`` the document frequency)::

    score(q, d) = sum_{t in q} idf(t) * tfc(t, d)

    lucene:     idf = log(1 + (N - df + 0.5) / (df + 0.5)),  tfc = tf / (tf + k1 (1 - b + b |d|/avgdl))
    robertson:  idf = log((N - df + 0.5) / (df + 0.5)) (>= 0),  tfc as lucene
    atire:      idf = log(N / df),                             tfc = tf (k1+1) / (tf + k1 (1 - b + b |d|/avgdl))
    okapi:      idf as robertson, tfc as atire  (= rank_bm25.BM25Okapi while every df < N/2;
                BM25Okapi floors negative idfs at epsilon * mean idf instead of 0)
    bm25l:      idf = log((N + 1) / (df + 0.5)),  c = tf / (1 - b + b |d|/avgdl),
                tfc = (k1+1)(c + delta) / (k1 + c + delta)          (Lv & Zhai, CIKM 2011)
    bm25+:      idf = log((N + 1) / df),  tfc = tf (k1+1) / (tf + k1 (1 - b + b |d|/avgdl)) + delta
                                                                     (Lv & Zhai, CIKM 2011)

Parity: with the same tokens, ``method="okapi"`` and ``"bm25+"`` rank identically on both
backends (tested). ``rank_bm25.BM25L`` multiplies each term's score by an extra ``tf`` factor
(so absent terms get no ``delta`` credit), hence its BM25L differs from Lv & Zhai's and bm25s's.

Tokenisation: lower-case, the regex ``(?u)\\b\\w\\w+\\b`` (tokens of two or more word characters),
optional stopword removal, optional Snowball stemming through PyStemmer.

``add()`` on either backend re-indexes the union of the old and new passages (BM25's idf and
average length depend on the whole corpus, so an incremental update is not exact).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.io import progress, progress_enabled
from ragkit.retrievers.base import IndexFormatError, Retriever, register_retriever
from ragkit.types import Passage, Query

logger = logging.getLogger(__name__)

__all__ = ["BM25Retriever", "Tokenizer", "BM25S_METHODS", "RANK_BM25_METHODS"]

TOKEN_PATTERN = r"(?u)\b\w\w+\b"

# ragkit method name -> (bm25s method, bm25s idf_method)
BM25S_METHODS: dict[str, tuple[str, str]] = {
    "lucene": ("lucene", "lucene"),
    "robertson": ("robertson", "robertson"),
    "atire": ("atire", "atire"),
    "okapi": ("atire", "robertson"),
    "bm25l": ("bm25l", "bm25l"),
    "bm25+": ("bm25+", "bm25+"),
}
# ragkit method name -> rank_bm25 class name
RANK_BM25_METHODS: dict[str, str] = {"okapi": "BM25Okapi", "bm25l": "BM25L", "bm25+": "BM25Plus"}

_STOPWORD_LANGS = {
    "en": "STOPWORDS_EN", "english": "STOPWORDS_EN", "en_plus": "STOPWORDS_EN_PLUS",
    "de": "STOPWORDS_GERMAN", "german": "STOPWORDS_GERMAN",
    "nl": "STOPWORDS_DUTCH", "dutch": "STOPWORDS_DUTCH",
    "fr": "STOPWORDS_FRENCH", "french": "STOPWORDS_FRENCH",
    "es": "STOPWORDS_SPANISH", "spanish": "STOPWORDS_SPANISH",
    "pt": "STOPWORDS_PORTUGUESE", "portuguese": "STOPWORDS_PORTUGUESE",
    "it": "STOPWORDS_ITALIAN", "italian": "STOPWORDS_ITALIAN",
    "ru": "STOPWORDS_RUSSIAN", "russian": "STOPWORDS_RUSSIAN",
    "sv": "STOPWORDS_SWEDISH", "swedish": "STOPWORDS_SWEDISH",
}


def _import_bm25s() -> Any:
    """Import bm25s; it forces its logger to DEBUG at import, so hand that logger back to the
    application's logging configuration."""
    import bm25s

    lg = logging.getLogger("bm25s")
    if lg.level == logging.DEBUG:
        lg.setLevel(logging.NOTSET)
    return bm25s


def _resolve_stopwords(stopwords: str | Sequence[str] | None) -> frozenset[str]:
    if stopwords is None or stopwords == "":
        return frozenset()
    if isinstance(stopwords, str):
        key = stopwords.lower()
        if key not in _STOPWORD_LANGS:
            raise ValueError(
                f"unknown stopword list {stopwords!r}; use one of {sorted(_STOPWORD_LANGS)}, "
                "a list of words, or None"
            )
        _import_bm25s()
        import bm25s.stopwords as sw

        return frozenset(getattr(sw, _STOPWORD_LANGS[key]))
    return frozenset(w.lower() for w in stopwords)


_NUMBA: Any = None


def _numba_kernel() -> Any:
    """The compiled kernel module, or ``None`` when numba is not installed."""
    global _NUMBA
    if _NUMBA is None:
        try:
            import numba

            from ragkit.retrievers import _bm25_numba
        except ImportError:
            _NUMBA = False
        else:
            # with NUMBA_DISABLE_JIT the kernel would run as plain Python: far slower than NumPy
            _NUMBA = False if numba.config.DISABLE_JIT else _bm25_numba
    return _NUMBA or None


def _exact_topk(scores: np.ndarray, k: int, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions and scores of the top ``k`` of the candidate positions ``cand`` (ascending) by
    (score descending, position ascending): every candidate tied with the k-th score is kept
    until the sort, so a tie is never cut arbitrarily."""
    if k < len(cand):
        s = scores[cand]
        kth = np.partition(s, len(cand) - k)[len(cand) - k]
        cand = cand[s >= kth]
    top = cand[np.lexsort((cand, -scores[cand]))][:k]
    return top, scores[top]


def _log_no_terms(q: Query) -> None:
    logger.warning(
        "BM25: no term of the query %r is in the index (after lower-casing, stop-word removal "
        "and stemming; a text without spaces, e.g. Chinese or Japanese, is one token): no hits",
        q.text[:80])


class _FlatDocs(Sequence[list[int]]):
    """Token ids of every document as one int32 array plus offsets; reads as a list of lists
    (document ``i`` is ``flat[offsets[i]:offsets[i + 1]]``), built on the fly."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        self.flat, self.offsets = flat, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            raise TypeError("_FlatDocs does not slice")
        return self.flat[self.offsets[i]:self.offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        flat, off = self.flat, self.offsets.tolist()
        for a, b in zip(off[:-1], off[1:]):
            yield flat[a:b].tolist()


class Tokenizer:
    """Lower-case regex tokeniser with optional stopwords and Snowball stemming.

    Parameters
    ----------
    stopwords
        ``"en"`` (bm25s's English list), another language code, a list of words, or ``None``.
    stemmer
        A Snowball language for PyStemmer (``"english"``) or ``None`` for no stemming.
    """

    def __init__(self, stopwords: str | Sequence[str] | None = "en",
                 stemmer: str | None = "english") -> None:
        self.stopwords = _resolve_stopwords(stopwords)
        self._stem_cache: dict[str, str] = {}
        self._stemmer: Any = None
        if stemmer is not None:
            try:
                import Stemmer  # PyStemmer
            except ImportError as e:
                raise ValueError(
                    "stemming needs PyStemmer: pip install PyStemmer (or pass stemmer=None)"
                ) from e
            try:
                self._stemmer = Stemmer.Stemmer(stemmer)
            except KeyError as e:
                raise ValueError(
                    f"unknown stemmer language {stemmer!r}; use one of "
                    f"{Stemmer.algorithms()} or None"
                ) from e
        self._split = re.compile(TOKEN_PATTERN).findall

    def __call__(self, texts: Iterable[str], show_progress: bool = False) -> list[list[str]]:
        """Tokenise many texts; stemming runs once per distinct word (batched through PyStemmer)."""
        sw = self.stopwords
        raw = [
            [w for w in self._split(t.lower()) if w not in sw]
            for t in progress(texts, show=show_progress, desc="tokenize", leave=False)
        ]
        if self._stemmer is None:
            return raw
        cache = self._stem_cache
        new = list({w for doc in raw for w in doc if w not in cache})
        if new:
            cache.update(zip(new, self._stemmer.stemWords(new)))
        return [[cache[w] for w in doc] for doc in raw]


@register_retriever
class BM25Retriever(Retriever):
    """BM25 retriever on ``bm25s`` (default) or ``rank_bm25``.

    The formula of each ``method`` is in the module docstring.

    Parameters
    ----------
    k1, b
        Term-frequency saturation and length normalisation.
    method
        ``"lucene"`` (default), ``"robertson"``, ``"atire"``, ``"okapi"``, ``"bm25l"``, ``"bm25+"``
        for ``bm25s``; ``"okapi"``, ``"bm25l"``, ``"bm25+"`` for ``rank_bm25`` (``None`` picks
        ``"lucene"`` / ``"okapi"``).
    delta
        The lower bound of BM25L / BM25+.
    stopwords
        Stopword list (``"en"``, a language, a list of words) or ``None``.
    stemmer
        PyStemmer language (``"english"``) or ``None``.
    backend
        ``"bm25s"`` or ``"rank_bm25"``.
    n_threads
        Threads for batched ``bm25s`` retrieval (0 = in the calling thread, -1 = all cores).
    scoring_backend
        Scorer of the ``bm25s`` index: ``"auto"`` (default: ``"numba"`` when numba is installed,
        else ``"numpy"``), ``"numba"`` (compiled once per machine and cached, ~10x faster) or
        ``"numpy"``. Both give identical rankings.
    show_progress
        Progress bars while indexing (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).
    chunk_size
        Passages tokenised at a time while indexing (bounds the memory of the token lists).
    """

    kind = "bm25"

    def __init__(
        self,
        k1: float = 1.5,
        b: float = 0.75,
        method: str | None = "lucene",
        delta: float = 0.5,
        stopwords: str | Sequence[str] | None = "en",
        stemmer: str | None = "english",
        backend: str = "bm25s",
        n_threads: int = 0,
        scoring_backend: str = "auto",
        show_progress: bool | None = None,
        chunk_size: int = 10_000,
    ) -> None:
        super().__init__()
        if backend not in ("bm25s", "rank_bm25"):
            raise ValueError(f"unknown BM25 backend {backend!r}; use 'bm25s' or 'rank_bm25'")
        if method is None:
            method = "lucene" if backend == "bm25s" else "okapi"
        if backend == "bm25s" and method not in BM25S_METHODS:
            raise ValueError(f"unknown bm25s method {method!r}; use one of {list(BM25S_METHODS)}")
        if backend == "rank_bm25" and method not in RANK_BM25_METHODS:
            raise ValueError(
                f"rank_bm25 has no method {method!r}; use one of {list(RANK_BM25_METHODS)} "
                "(or backend='bm25s' for lucene/robertson/atire)"
            )
        if scoring_backend not in ("numpy", "numba", "auto"):
            raise ValueError("scoring_backend must be 'numpy', 'numba' or 'auto'")
        if scoring_backend == "numba" and _numba_kernel() is None:
            raise ValueError("scoring_backend='numba' needs numba: pip install numba "
                             "(or pass scoring_backend='auto' or 'numpy')")
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b, self.delta = float(k1), float(b), float(delta)
        self.method, self.backend = method, backend
        self.stopwords = list(stopwords) if isinstance(stopwords, (list, tuple)) else stopwords
        self.stemmer = stemmer
        self.n_threads = int(n_threads)
        self.scoring_backend = scoring_backend
        self.show_progress = show_progress
        self.chunk_size = chunk_size
        self.tokenizer = Tokenizer(stopwords, stemmer)
        self._model: Any = None

    @property
    def params(self) -> dict[str, Any]:
        return {
            "k1": self.k1, "b": self.b, "method": self.method, "delta": self.delta,
            "stopwords": self.stopwords, "stemmer": self.stemmer, "backend": self.backend,
            "n_threads": self.n_threads, "scoring_backend": self.scoring_backend,
            "chunk_size": self.chunk_size,
        }

    # ------------------------------------------------------------------ indexing
    @property
    def scorer(self) -> str:
        """The scorer in use: ``"numba"`` or ``"numpy"`` (``scoring_backend`` resolved)."""
        if self.scoring_backend == "auto":
            return "numba" if _numba_kernel() is not None else "numpy"
        return self.scoring_backend

    def _new_bm25s(self) -> Any:
        bm25s = _import_bm25s()

        method, idf_method = BM25S_METHODS[self.method]
        # bm25s only builds and stores the score matrix; ragkit scores it (see ``_search``)
        return bm25s.BM25(k1=self.k1, b=self.b, delta=self.delta, method=method,
                          idf_method=idf_method, backend="numpy")

    def _token_chunks(self, passages: list[Passage], show: bool) -> Iterator[list[list[str]]]:
        """Tokens of ``chunk_size`` passages at a time (the whole corpus is never tokenised at
        once, nor copied into one list of strings)."""
        # one chunk is quick: no bar (a 5-passage corpus showed "tokenize 0/10000")
        bar = progress(range(0, len(passages), self.chunk_size), show=show and len(passages) > self.chunk_size,
                       desc="tokenize", leave=False, unit="chunk")
        for start in bar:
            yield self.tokenizer([p.contents for p in passages[start:start + self.chunk_size]])

    def _build(self, passages: list[Passage]) -> None:
        show = progress_enabled(self.show_progress)
        if self.backend == "bm25s":
            vocab: dict[str, int] = {}
            parts: list[np.ndarray] = []
            lengths: list[np.ndarray] = []
            for chunk in self._token_chunks(passages, show):
                lengths.append(np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk)))
                parts.append(np.fromiter((vocab.setdefault(w, len(vocab))
                                          for doc in chunk for w in doc),
                                         dtype=np.int32, count=int(lengths[-1].sum())))
            if not vocab:
                raise ValueError(
                    "no passage has an indexable term (every word is a stop word or a single "
                    "character); index real text or pass stopwords=None"
                )
            offsets = np.zeros(len(passages) + 1, dtype=np.int64)
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
            docs = _FlatDocs(np.concatenate(parts), offsets)
            del parts, lengths
            model = self._new_bm25s()
            # what bm25s's ``index()`` does for (ids, vocab), fed one flat int32 array instead of
            # a Python list per document (a few bytes per token instead of ~100 per document)
            model.scores = model.build_index_from_ids(
                unique_token_ids=list(range(len(vocab))), corpus_token_ids=docs,
                show_progress=show and len(passages) > self.chunk_size)  # bm25s's own two bars: big corpora only
            vocab[""] = len(vocab)  # bm25s's empty-query token (ragkit never produces it)
            model.vocab_dict = vocab
            model.unique_token_ids_set = set(vocab.values())
        else:
            import rank_bm25

            tokens = [t for chunk in self._token_chunks(passages, show) for t in chunk]
            cls = getattr(rank_bm25, RANK_BM25_METHODS[self.method])
            kw: dict[str, Any] = {"k1": self.k1, "b": self.b}
            if self.method != "okapi":
                kw["delta"] = self.delta
            model = cls(tokens, **kw)
        self._model = model

    def _add(self, passages: list[Passage]) -> None:
        # BM25 statistics (idf, avgdl) depend on the whole corpus: re-index the union.
        self._build(self._passages + passages)

    # ------------------------------------------------------------------ search
    def _search(self, queries: list[Query], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        tokens = self.tokenizer([q.text for q in queries])
        if self.backend == "rank_bm25":
            known = self._model.idf
            out = []
            for q, toks in zip(queries, tokens):  # rank_bm25 has no batch API
                if not any(t in known for t in toks):
                    _log_no_terms(q)
                    out.append((np.empty(0, np.int64), np.empty(0)))
                    continue
                s = np.asarray(self._model.get_scores(toks), dtype=np.float64)
                out.append(_exact_topk(s, k, self._matched_rank_bm25(toks)))
            return out
        m = self._model
        vocab = m.vocab_dict
        n_terms = len(m.scores["indptr"]) - 1
        ids = [[vocab[t] for t in toks if t in vocab and vocab[t] < n_terms] for toks in tokens]
        out = [(np.empty(0, np.int64), np.empty(0)) for _ in ids]
        live = []
        for i, (q, qi) in enumerate(zip(queries, ids)):
            if qi:
                live.append(i)
            else:
                _log_no_terms(q)
        if not live:
            return out
        n_threads = self.n_threads if self.n_threads >= 0 else (os.cpu_count() or 1)
        parts = [live[j::max(1, n_threads)] for j in range(max(1, n_threads))] if n_threads > 1 \
            else [live]
        score = self._score_numba if self.scorer == "numba" else self._score_numpy
        if len(parts) > 1:
            with ThreadPoolExecutor(max_workers=len(parts)) as ex:
                results = list(ex.map(lambda p: score([ids[i] for i in p], k), parts))
        else:
            results = [score([ids[i] for i in live], k)]
        for part, res in zip(parts, results):
            for i, r in zip(part, res):
                out[i] = r
        return out

    def _offset(self, qi: list[int]) -> np.float32:
        """The constant BM25L / BM25+ add to every document (as bm25s computes it)."""
        nonocc = self._model.nonoccurrence_array
        if nonocc is None:
            return np.float32(0.0)
        return np.float32(nonocc[np.asarray(qi, dtype=np.int64)].sum())

    def _matched(self, qi: list[int]) -> np.ndarray:
        """Positions (ascending) of the documents a query term weighs on: a positive entry in its
        column of the score matrix (``S >= 0``; the numba kernel's ``sum_t S[d, t] > 0``)."""
        sc = self._model.scores
        data, indptr, indices = sc["data"], sc["indptr"], sc["indices"]
        cols = [indices[indptr[t]:indptr[t + 1]][data[indptr[t]:indptr[t + 1]] > 0] for t in set(qi)]
        return np.unique(np.concatenate(cols)).astype(np.int64)

    def _matched_rank_bm25(self, toks: list[str]) -> np.ndarray:
        """Positions (ascending) of the documents holding a query term with a positive idf."""
        m = self._model
        hit = np.zeros(len(m.doc_freqs), dtype=bool)
        for t in {t for t in toks if m.idf.get(t, 0) > 0}:
            hit |= np.fromiter((t in d for d in m.doc_freqs), dtype=bool, count=len(m.doc_freqs))
        return np.flatnonzero(hit)

    def _score_numpy(self, ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        m = self._model
        return [_exact_topk(m.get_scores_from_ids(qi), k, self._matched(qi)) for qi in ids]

    def _score_numba(self, ids: list[list[int]], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        sc = self._model.scores
        ptr = np.zeros(len(ids) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(q) for q in ids])
        flat = np.fromiter((t for q in ids for t in q), dtype=np.int64, count=int(ptr[-1]))
        offsets = np.array([self._offset(q) for q in ids], dtype=np.float32)
        idx, scores = _numba_kernel().topk_batch(
            sc["data"], sc["indptr"], sc["indices"], int(sc["num_docs"]), flat, ptr, offsets, k)
        return list(zip(idx, scores))

    # ------------------------------------------------------------------ persistence
    @classmethod
    def _required_files(cls, manifest: Mapping[str, Any]) -> set[str]:
        params = manifest.get("params") or {}
        if params.get("backend", "bm25s") != "bm25s":
            return set()  # rank_bm25 is rebuilt from passages.jsonl
        names = {"data.csc", "indices.csc", "indptr.csc", "params", "vocab"}
        if params.get("method") in ("bm25l", "bm25+"):
            names.add("nonoccurrence_array")
        return {f"bm25s/{n}.index.{'json' if n in ('params', 'vocab') else 'npy'}" for n in names}

    def _save_files(self, folder: Path) -> None:
        if self.backend == "bm25s":
            # bm25s writes its sparse score matrix as .npy (allow_pickle=False) and JSON.
            self._model.save(str(folder / "bm25s"), show_progress=False)
        # rank_bm25 has no serialisation: its index is rebuilt from passages.jsonl on load.

    @classmethod
    def _from_saved(cls, folder: Path, manifest: dict[str, Any], passages: list[Passage],
                    **kwargs: Any) -> BM25Retriever:
        params = dict(manifest.get("params") or {})
        kwargs.pop("model", None)  # an embedder choice is irrelevant to a lexical index
        params.update(kwargs)
        try:
            obj = cls(**params)
        except TypeError as e:
            raise IndexFormatError(f"{folder}: bad BM25 parameters in the manifest ({e})") from e
        if obj.backend == "bm25s":
            bm25s = _import_bm25s()

            try:
                model = bm25s.BM25.load(str(folder / "bm25s"), allow_pickle=False,
                                        show_progress=False, backend="numpy")
            except (OSError, ValueError, json.JSONDecodeError) as e:
                raise IndexFormatError(f"index {folder} is damaged ({e}); rebuild it") from e
            if model.scores.get("num_docs") != len(passages):
                raise IndexFormatError(
                    f"index {folder} is damaged: the BM25 matrix has "
                    f"{model.scores.get('num_docs')} "
                    f"documents but there are {len(passages)} passages; rebuild it"
                )
            obj._model = model
        else:
            obj._build(passages)
        return obj
