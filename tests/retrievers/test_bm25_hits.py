"""BM25 returns only passages that a query term scores: ``k`` above the number of matches is not
padded with passages of the non-matching score (0, or BM25L/BM25+'s constant credit)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.cli import main
from ragkit.io import write_jsonl
from ragkit.retrievers import BM25Retriever
from ragkit.retrievers.bm25 import BM25S_METHODS, RANK_BM25_METHODS, _numba_kernel
from ragkit.types import Passage

SCORERS = ["numpy"] + (["numba"] if _numba_kernel() is not None else [])

CORPUS = [
    Passage("fox", "The quick brown fox jumps over the lazy dog"),
    Passage("paris", "Paris is the capital and largest city of France"),
    Passage("berlin", "Berlin is the capital of Germany"),
    Passage("foxes", "Foxes are small omnivorous mammals"),
    Passage("rome", "Rome hosts the Colosseum"),
]


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("method", list(BM25S_METHODS))
def test_bm25s_returns_only_matching_passages(scorer: str, method: str) -> None:
    r = BM25Retriever(method=method, scoring_backend=scorer, show_progress=False).index(CORPUS)
    capital, fox, germany_or_rome = r.search(["capital", "fox", "Germany Colosseum"], k=5)
    assert sorted(capital.ids()) == ["berlin", "paris"]
    assert sorted(fox.ids()) == ["fox", "foxes"]  # stemmed: fox, foxes
    assert sorted(germany_or_rome.ids()) == ["berlin", "rome"]
    assert [h.rank for h in capital] == [0, 1]


@pytest.mark.parametrize("method", list(RANK_BM25_METHODS))
def test_rank_bm25_returns_only_matching_passages(method: str) -> None:
    r = BM25Retriever(backend="rank_bm25", method=method, show_progress=False).index(CORPUS)
    capital, germany_or_rome = r.search(["capital", "Germany Colosseum"], k=5)
    assert sorted(capital.ids()) == ["berlin", "paris"]
    assert sorted(germany_or_rome.ids()) == ["berlin", "rome"]


@pytest.mark.parametrize("method", ["robertson", "atire"])
@pytest.mark.parametrize("scorer", SCORERS)
def test_a_term_with_zero_weight_matches_nothing(scorer: str, method: str) -> None:
    # "capital" is in every passage: robertson's idf is floored at 0 and atire's log(N/df) is 0,
    # so it scores no passage; "France" still does
    docs = [Passage(str(i), f"capital city number {w}") for i, w in enumerate(["one", "two", "three"])]
    docs.append(Passage("fr", "capital of France"))
    r = BM25Retriever(method=method, scoring_backend=scorer, show_progress=False).index(docs)
    only_capital, with_france = r.search(["capital", "capital France"], k=4)
    assert len(only_capital) == 0
    assert with_france.ids() == ["fr"]


def test_numba_and_numpy_return_the_same_hits_on_a_large_k() -> None:
    if len(SCORERS) < 2:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(200)]
    docs = [Passage(f"d{i}", " ".join(rng.choice(words, size=int(rng.integers(3, 12)))))
            for i in range(500)]
    queries = [" ".join(rng.choice(words, size=int(rng.integers(1, 4)))) for _ in range(40)]
    for method in ("lucene", "bm25+", "bm25l"):
        kw = {"method": method, "stopwords": None, "stemmer": None, "show_progress": False}
        fast = BM25Retriever(scoring_backend="numba", **kw).index(docs)
        slow = BM25Retriever(scoring_backend="numpy", **kw).index(docs)
        for q, a, b in zip(queries, fast.search(queries, k=500), slow.search(queries, k=500)):
            matching = {p.id for p in docs if set(p.text.split()) & set(q.split())}
            assert set(a.ids()) == matching, (method, q)
            assert a.ids() == b.ids() and a.scores() == b.scores(), (method, q)


def test_cli_search_with_k_above_the_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": p.id, "text": p.text} for p in CORPUS])
    assert main(["--quiet", "index", "--corpus", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "idx"),
                 "--kind", "bm25"]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(tmp_path / "idx"), "-q", "capital of Germany", "-k", "5", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert [h["id"] for h in result["hits"]] == ["berlin", "paris"]
    assert all(h["score"] > 0 for h in result["hits"])
