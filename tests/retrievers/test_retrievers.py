"""BM25 retrieval, the base-class contract and the on-disk index format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.retrievers import BM25Retriever, IndexFormatError, load_retriever
from ragkit.retrievers.bm25 import Tokenizer
from ragkit.types import Passage, Query


def generated_corpus(n_docs: int, vocab: int = 3000, seed: int = 0) -> list[Passage]:
    """Random documents over a Zipf-like vocabulary ``w0 .. w{vocab-1}`` (no stopwords)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 0.5
    p /= p.sum()
    lengths = rng.integers(8, 60, size=n_docs)
    words = rng.choice(vocab, size=int(lengths.sum()), p=p)
    out, start = [], 0
    for i, n in enumerate(lengths):
        out.append(Passage(id=f"d{i}", text=" ".join(f"w{w}" for w in words[start:start + n])))
        start += n
    return out


def generated_queries(n: int, vocab: int = 3000, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{w}" for w in rng.integers(0, vocab // 3, size=rng.integers(2, 6)))
            for _ in range(n)]


@pytest.fixture(scope="module")
def corpus() -> list[Passage]:
    return generated_corpus(3000)


@pytest.fixture(scope="module")
def small() -> list[Passage]:
    return [
        Passage("a", "The quick brown fox jumps over the lazy dog", title="Fox"),
        Passage("b", "Paris is the capital and largest city of France", title="Paris"),
        Passage("c", "Berlin is the capital of Germany", title="Berlin"),
        Passage("d", "Foxes are small omnivorous mammals", title="Fox (animal)"),
    ]


def _reference_topk(scores: np.ndarray, k: int) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("method", ["okapi", "bm25+"])
def test_bm25s_matches_rank_bm25(corpus: list[Passage], method: str) -> None:
    """bm25s ("okapi" = atire tf part + robertson idf) equals rank_bm25.BM25Okapi exactly while
    no term is in more than half of the documents (BM25Okapi floors negative idfs at
    eps * mean idf, bm25s at 0); BM25+ shares its formula outright. (rank_bm25's BM25L
    multiplies each term by an extra tf factor, so it is not comparable.)"""
    import rank_bm25

    queries = generated_queries(25)
    tok = Tokenizer(stopwords=None, stemmer=None)
    docs_tok = tok([p.text for p in corpus])
    df: dict[str, int] = {}
    for d in docs_tok:
        for w in set(d):
            df[w] = df.get(w, 0) + 1
    assert max(df.values()) < len(corpus) / 2  # the premise of exact Okapi parity
    cls = {"okapi": rank_bm25.BM25Okapi, "bm25+": rank_bm25.BM25Plus}
    kw = {} if method == "okapi" else {"delta": 0.5}
    ref = cls[method](docs_tok, k1=1.2, b=0.75, **kw)

    fast = BM25Retriever(k1=1.2, b=0.75, method=method, delta=0.5, stopwords=None, stemmer=None,
                         show_progress=False).index(corpus)
    slow = BM25Retriever(k1=1.2, b=0.75, method=method, delta=0.5, stopwords=None, stemmer=None,
                         backend="rank_bm25", show_progress=False).index(corpus)
    got_fast = fast.search(queries, k=10)
    got_slow = slow.search(queries, k=10)
    for q, rf, rs in zip(queries, got_fast, got_slow):
        s = np.asarray(ref.get_scores(tok([q])[0]))
        top = _reference_topk(s, 10)
        # rank_bm25 behind our wrapper: identical, ties broken by position like the reference
        assert rs.ids() == [f"d{i}" for i in top]
        np.testing.assert_array_equal(rs.scores(), s[top])
        # bm25s (float32): the same scores, every returned doc has the reference score, and the
        # same ids wherever the reference score is not tied (within float32 precision)
        np.testing.assert_allclose(rf.scores(), s[top], rtol=2e-5)
        got = [int(pid[1:]) for pid in rf.ids()]
        np.testing.assert_allclose(s[got], rf.scores(), rtol=2e-5)
        for pos, i in enumerate(top):
            if np.sum(np.isclose(s, s[i], rtol=1e-5, atol=0)) == 1:
                assert got[pos] == i


def test_rank_bm25_rejects_lucene() -> None:
    with pytest.raises(ValueError, match="rank_bm25 has no method 'lucene'"):
        BM25Retriever(backend="rank_bm25", method="lucene")
    assert BM25Retriever(backend="rank_bm25", method=None).method == "okapi"


# ----------------------------------------------------------------------------- behaviour
def test_tokenizer_stems_and_drops_stopwords() -> None:
    tok = Tokenizer(stopwords="en", stemmer="english")
    assert tok(["The foxes are running quickly"]) == [["fox", "run", "quick"]]
    assert Tokenizer(stopwords=None, stemmer=None)(["The A foxes"]) == [["the", "foxes"]]
    with pytest.raises(ValueError, match="unknown stemmer"):
        Tokenizer(stemmer="klingon")


def test_bm25_search_is_batched_and_ranked(small: list[Passage]) -> None:
    r = BM25Retriever(show_progress=False).index(small)
    res = r.search(["capital of France", Query("foxes", id="q2"), "Germany"], k=2)
    assert len(res) == 3
    assert res[0].ids()[0] == "b"
    assert set(res[1].ids()) == {"a", "d"}
    assert res[1].query is not None and res[1].query.id == "q2"
    assert res[2].ids()[0] == "c"
    assert [h.rank for h in res[0]] == [0, 1]
    assert res[0].scores()[0] >= res[0].scores()[1]


def test_k_larger_than_corpus_returns_all(small: list[Passage]) -> None:
    r = BM25Retriever(show_progress=False).index(small)
    (res,) = r.search(["fox capital"], k=100)  # every passage has one of the words (foxes -> fox)
    assert sorted(res.ids()) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_query_without_indexed_terms_has_no_hits(small: list[Passage], backend: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    # unknown words, only stop words, CJK without word breaks: no hits (and said why), never
    # k arbitrary passages scored 0.0 -- other queries of the batch are unaffected
    r = BM25Retriever(backend=backend, method=None, show_progress=False).index(small)
    with caplog.at_level("WARNING", logger="ragkit.retrievers.bm25"):
        res = r.search(["zzzz qqqq", "what is the of and", "東京タワーはどこですか", "France"], k=3)
    assert [len(x) for x in res[:3]] == [0, 0, 0]
    assert len(res[3]) > 0
    assert caplog.text.count("no hits") == 3


def test_add_reindexes_union(small: list[Passage]) -> None:
    r = BM25Retriever(show_progress=False).index(small[:2])
    r.add(small[2:])
    full = BM25Retriever(show_progress=False).index(small)
    q = ["capital of Germany", "fox"]
    assert [x.ids() for x in r.search(q, k=4)] == [x.ids() for x in full.search(q, k=4)]
    np.testing.assert_allclose(r.search(q, k=4)[0].scores(), full.search(q, k=4)[0].scores())
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        r.add([Passage("a", "again")])


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_bad_input_raises_clear_errors(small: list[Passage], backend: str) -> None:
    r = BM25Retriever(backend=backend, method=None, show_progress=False)
    with pytest.raises(ValueError, match="call .index"):
        r.search(["x"])
    with pytest.raises(ValueError, match="empty corpus"):
        r.index([])
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        r.index([Passage("a", "one"), Passage("a", "two")])
    r.index(small)
    with pytest.raises(ValueError, match="query 1 is empty"):
        r.search(["fox", "  "])
    with pytest.raises(ValueError, match="no queries"):
        r.search([])
    for k in (0, -3):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            r.search(["fox"], k=k)


# ----------------------------------------------------------------------------- persistence
@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_save_load_round_trip(small: list[Passage], tmp_path: Path, backend: str) -> None:
    r = BM25Retriever(backend=backend, method=None, show_progress=False).index(small)
    r.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["kind"] == "bm25" and manifest["n_docs"] == 4
    assert manifest["params"]["backend"] == backend
    r2 = load_retriever(tmp_path / "idx")
    assert isinstance(r2, BM25Retriever)
    q = ["capital of France", "fox"]
    a, b = r.search(q, k=4), r2.search(q, k=4)
    assert [x.ids() for x in a] == [x.ids() for x in b]
    assert [x.scores() for x in a] == [x.scores() for x in b]
    assert r2.passage("b").title == "Paris"
    assert not any(p.suffix in (".pkl", ".pickle") for p in (tmp_path / "idx").rglob("*"))


def test_damaged_index_dirs_raise(small: list[Passage], tmp_path: Path) -> None:
    r = BM25Retriever(show_progress=False).index(small)
    with pytest.raises(FileNotFoundError, match="ragkit index"):
        load_retriever(tmp_path / "nope")
    # corrupt array
    d1 = r.save(tmp_path / "corrupt")
    (d1 / "bm25s" / "data.csc.index.npy").write_bytes(b"garbage")
    with pytest.raises(IndexFormatError, match="does not match its checksum"):
        load_retriever(d1)
    # missing passages
    d2 = r.save(tmp_path / "missing")
    (d2 / "passages.jsonl").unlink()
    with pytest.raises(IndexFormatError, match="passages.jsonl is missing"):
        load_retriever(d2)
    # wrong version
    d3 = r.save(tmp_path / "version")
    m = json.loads((d3 / "manifest.json").read_text())
    m["version"] = 99
    (d3 / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="format version 99"):
        load_retriever(d3)
    # not an index
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexFormatError, match="no manifest.json"):
        load_retriever(tmp_path / "empty")
    # broken manifest
    d4 = r.save(tmp_path / "badjson")
    (d4 / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        load_retriever(d4)


def test_save_before_index_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="call .index"):
        BM25Retriever().save(tmp_path / "x")
