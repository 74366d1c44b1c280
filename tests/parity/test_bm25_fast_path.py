"""BM25's numba fast path returns exactly the NumPy path's ranking, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.retrievers import BM25Retriever
from ragkit.types import Passage

pytest.importorskip("numba")

WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "olive", "peach", "plum", "melon"]


def _corpus(n: int = 400, seed: int = 0) -> list[Passage]:
    """Short documents drawn from a small vocabulary: many exact score ties (identical texts)."""
    rng = np.random.default_rng(seed)
    return [Passage(f"d{i}", " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4)))))
            for i in range(n)]


def _reference(r: BM25Retriever, query: str, k: int) -> list[str]:
    """Brute force: full float32 score vector over the passages holding a query word, stable sort
    by (-score, position)."""
    m = r._model
    words = r.tokenizer([query])[0]
    ids = [m.vocab_dict[t] for t in words if t in m.vocab_dict]
    s = m.get_scores_from_ids(ids).astype(np.float64)
    matching = [i for i, p in enumerate(r.passages) if set(words) & set(r.tokenizer([p.text])[0])]
    order = sorted(matching, key=lambda i: (-s[i], i))[:k]
    return [r.passages[i].id for i in order]


@pytest.mark.parametrize("method", ["lucene", "okapi", "bm25+", "bm25l"])
def test_numba_equals_numpy_equals_brute_force(method):
    corpus = _corpus()
    fast = BM25Retriever(method=method, stopwords=None, stemmer=None, scoring_backend="numba",
                         show_progress=False).index(corpus)
    slow = BM25Retriever(method=method, stopwords=None, stemmer=None, scoring_backend="numpy",
                         show_progress=False).index(corpus)
    rng = np.random.default_rng(1)
    queries = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 4)))) for _ in range(60)]
    for k in (1, 5, 10, 37):
        a, b = fast.search(queries, k=k), slow.search(queries, k=k)
        for q, x, y in zip(queries, a, b):
            ref = _reference(slow, q, k)
            assert x.ids() == ref, (method, q, k)
            assert y.ids() == ref, (method, q, k)
            assert x.scores() == y.scores()


def test_a_tie_across_the_kth_place_is_cut_by_position():
    # 30 identical passages tie for every query term: the top 10 are the first 10 by position
    corpus = [Passage(f"p{i:02d}", "apple banana") for i in range(30)]
    corpus += [Passage("other", "cherry")]
    for backend in ("numba", "numpy"):
        r = BM25Retriever(scoring_backend=backend, stopwords=None, stemmer=None,
                          show_progress=False).index(corpus)
        assert r.search("apple", k=10)[0].ids() == [f"p{i:02d}" for i in range(10)], backend


def test_threads_give_the_same_ranking():
    corpus = _corpus(300, seed=3)
    queries = [f"{a} {b}" for a in WORDS for b in WORDS[:3]]
    one = BM25Retriever(stopwords=None, stemmer=None, show_progress=False).index(corpus)
    two = BM25Retriever(stopwords=None, stemmer=None, n_threads=2, show_progress=False).index(corpus)
    assert [x.ids() for x in one.search(queries, k=7)] == [x.ids() for x in two.search(queries, k=7)]


def test_auto_picks_numba_and_saved_indexes_keep_the_ranking(tmp_path):
    corpus = _corpus(200, seed=5)
    r = BM25Retriever(show_progress=False).index(corpus)
    assert r.scorer == "numba"
    r.save(tmp_path / "idx")
    loaded = BM25Retriever.load(tmp_path / "idx", scoring_backend="numpy")
    assert loaded.scorer == "numpy"
    qs = ["apple plum", "melon", "grape cherry lemon"]
    assert [x.ids() for x in r.search(qs, k=9)] == [x.ids() for x in loaded.search(qs, k=9)]
