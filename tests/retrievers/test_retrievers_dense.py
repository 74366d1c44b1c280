"""Dense retrieval with real FAISS indexes and a tiny random sentence-transformer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.retrievers import (
    BM25Retriever,
    DenseRetriever,
    HybridRetriever,
    IndexFormatError,
    load_retriever,
)
from ragkit.types import Passage

TOPICS = ["river", "mountain", "castle", "violin", "comet", "harbor", "forest", "engine"]


@pytest.fixture(scope="module")
def corpus() -> list[Passage]:
    rng = np.random.default_rng(0)
    return [
        Passage(f"p{i}", " ".join(rng.choice(TOPICS, size=6)) + f" number {i}", title=f"T{i % 7}")
        for i in range(120)
    ]


@pytest.fixture(scope="module")
def flat(tiny_encoder_dir: Path, corpus: list[Passage]) -> DenseRetriever:
    return DenseRetriever(str(tiny_encoder_dir), device="cpu", show_progress=False).index(corpus)


QUERIES = ["river castle", "comet engine violin", "forest harbor", "mountain"]


def test_flat_equals_bruteforce_numpy(flat: DenseRetriever, corpus: list[Passage]) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(flat.model_name, device="cpu")
    D = st.encode([p.contents for p in corpus], normalize_embeddings=True)
    Q = st.encode(QUERIES, normalize_embeddings=True)
    S = Q @ D.T
    got = flat.search(QUERIES, k=10)
    for row, rl in zip(S, got):
        top = np.lexsort((np.arange(len(row)), -row))[:10]
        np.testing.assert_allclose(rl.scores(), row[top], rtol=1e-4, atol=1e-5)
        got_idx = [int(pid[1:]) for pid in rl.ids()]
        np.testing.assert_allclose(row[got_idx], rl.scores(), rtol=1e-4, atol=1e-5)
        # ids agree wherever the brute-force score is not (nearly) tied
        for pos, i in enumerate(top):
            if np.sum(np.isclose(row, row[i], atol=1e-5)) == 1:
                assert got_idx[pos] == i


@pytest.mark.parametrize("index_type,extra", [("hnsw", {"ef_search": 200}),
                                               ("ivf", {"nlist": 4, "nprobe": 4})])
def test_hnsw_and_exhaustive_ivf_match_flat(tiny_encoder_dir: Path, corpus: list[Passage],
                                            flat: DenseRetriever, index_type: str,
                                            extra: dict) -> None:
    r = DenseRetriever(str(tiny_encoder_dir), index_type=index_type, device="cpu",
                       show_progress=False, **extra).index(corpus)
    for a, b in zip(r.search(QUERIES, k=5), flat.search(QUERIES, k=5)):
        np.testing.assert_allclose(a.scores(), b.scores(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_dense_save_load_round_trip_and_add(tiny_encoder_dir: Path, corpus: list[Passage],
                                            tmp_path: Path, index_type: str) -> None:
    r = DenseRetriever(str(tiny_encoder_dir), index_type=index_type, device="cpu", nlist=4,
                       show_progress=False).index(corpus[:100])
    r.add(corpus[100:])
    assert len(r) == 120 and r._index.ntotal == 120
    r.save(tmp_path / "d")
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["embedder"]["dimension"] == 32 and m["faiss"]["ntotal"] == 120
    back = load_retriever(tmp_path / "d", model=str(tiny_encoder_dir))
    assert isinstance(back, DenseRetriever)
    a, b = r.search(QUERIES, k=7), back.search(QUERIES, k=7)
    assert [x.ids() for x in a] == [x.ids() for x in b]
    np.testing.assert_allclose([x.scores() for x in a], [x.scores() for x in b], rtol=1e-6)


def test_foreign_embedder_and_damage(flat: DenseRetriever, tmp_path: Path) -> None:
    d = flat.save(tmp_path / "dense")
    with pytest.raises(IndexFormatError, match="was built with embedder"):
        load_retriever(d, model="sentence-transformers/all-mpnet-base-v2")
    with pytest.raises(IndexFormatError, match="was built with embedder"):
        DenseRetriever.load(d, model="default")  # the embedded MiniLM is not the tiny encoder
    (d / "index.faiss").write_bytes(b"\x00" * 64)
    with pytest.raises(IndexFormatError, match="checksum"):
        load_retriever(d)
    with pytest.raises(TypeError, match="cannot be switched off"):
        load_retriever(d, verify=False)


def test_dense_validation(tiny_encoder_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown index_type"):
        DenseRetriever(index_type="lsh")
    r = DenseRetriever(str(tiny_encoder_dir), device="cpu", show_progress=False)
    with pytest.raises(ValueError, match="call .index"):
        r.search(["x"])
    with pytest.raises(ValueError, match="empty corpus"):
        r.index([])
    r.index([Passage("x", "river"), Passage("y", "comet")])
    (res,) = r.search(["river"], k=50)
    assert sorted(res.ids()) == ["x", "y"]
    with pytest.raises(ValueError, match="k must be"):
        r.search(["river"], k=0)


def test_use_gpu_true_without_gpu_names_the_fix(tiny_encoder_dir: Path) -> None:
    import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("this FAISS build has a GPU")
    with pytest.raises(ValueError, match="use_gpu"):
        DenseRetriever(str(tiny_encoder_dir), use_gpu="yes")
    r = DenseRetriever(str(tiny_encoder_dir), device="cpu", use_gpu=True, show_progress=False)
    with pytest.raises(RuntimeError, match=r"ragkit\[gpu\]"):
        r.index([Passage("x", "river"), Passage("y", "comet")])
    # "auto" falls back to the CPU index
    auto = DenseRetriever(str(tiny_encoder_dir), device="cpu", show_progress=False)
    assert auto.index([Passage("x", "river"), Passage("y", "comet")]).search(["river"], k=1)[0].ids() == ["x"]


def test_hybrid_bm25_dense_round_trip(tiny_encoder_dir: Path, corpus: list[Passage],
                                      tmp_path: Path) -> None:
    hy = HybridRetriever([BM25Retriever(show_progress=False),
                          DenseRetriever(str(tiny_encoder_dir), device="cpu",
                                         show_progress=False)]).index(corpus)
    got = hy.search(QUERIES, k=5)
    hy.save(tmp_path / "h")
    back = load_retriever(tmp_path / "h", model=str(tiny_encoder_dir), device="cpu")
    again = back.search(QUERIES, k=5)
    assert [x.ids() for x in got] == [x.ids() for x in again]
    for x, y in zip(got, again):
        assert x.scores() == pytest.approx(y.scores())


@pytest.mark.parametrize("index_type", ["flat", "ivf"])
def test_corpus_encoded_in_chunks_gives_the_same_index(tiny_encoder_dir: Path,
                                                       corpus: list[Passage],
                                                       index_type: str) -> None:
    # batch_size 1 -> chunks of 64 passages: 120 passages arrive in two chunks
    one = DenseRetriever(str(tiny_encoder_dir), index_type=index_type, nlist=4, nprobe=4,
                         device="cpu", show_progress=False).index(corpus)
    chunked = DenseRetriever(str(tiny_encoder_dir), index_type=index_type, nlist=4, nprobe=4,
                             batch_size=1, device="cpu", show_progress=False)
    seen = []
    orig = chunked.encode_passages
    chunked.encode_passages = lambda ps, show_progress=None: seen.append(len(ps)) or orig(ps)
    chunked.index(iter(corpus))  # a generator is fine
    assert seen == [64, 56]
    a, b = one.search(QUERIES, k=10), chunked.search(QUERIES, k=10)
    assert [x.ids() for x in a] == [x.ids() for x in b]
    np.testing.assert_allclose([x.scores() for x in a], [x.scores() for x in b], rtol=1e-5)
