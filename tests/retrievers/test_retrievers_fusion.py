"""Rank fusion against ranx, the hybrid retriever, and ranx vs ir-measures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.retrievers import BM25Retriever, HybridRetriever, load_retriever
from ragkit.retrievers.fusion import fuse, min_max_normalize, minmax_fusion, rank_docs, rrf
from ragkit.types import Passage


def random_runs(n_runs: int, n_queries: int = 6, n_docs: int = 40, depth: int = 15,
                seed: int = 0) -> list[dict[str, dict[str, float]]]:
    """Runs with distinct scores per query (so every tool agrees on the ranks)."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(n_runs):
        run = {}
        for q in range(n_queries):
            docs = rng.choice(n_docs, size=depth, replace=False)
            scores = rng.permutation(depth) + rng.random()  # distinct
            run[f"q{q}"] = {f"d{d}": float(s) for d, s in zip(docs, scores)}
        runs.append(run)
    return runs


def test_rrf_equals_ranx_exactly() -> None:
    from ranx import Run
    from ranx import fuse as ranx_fuse

    runs = random_runs(3)
    ours = rrf(runs, k=60)
    theirs = ranx_fuse([Run(r) for r in runs], method="rrf").to_dict()
    assert set(ours) == set(theirs)
    for q in ours:
        assert ours[q] == pytest.approx(theirs[q], rel=1e-12, abs=0)
        assert set(ours[q]) == set(theirs[q])


def test_rrf_formula_by_hand() -> None:
    runs = [{"q": {"a": 3.0, "b": 2.0, "c": 1.0}}, {"q": {"c": 0.9, "a": 0.1}}]
    out = rrf(runs, k=60)["q"]
    assert out["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert out["b"] == pytest.approx(1 / 62)
    assert out["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert rank_docs(out) == ["a", "c", "b"]
    with pytest.raises(ValueError, match="same queries"):
        rrf([{"q": {"a": 1.0}}, {"other": {"a": 1.0}}])


@pytest.mark.slow  # ranx JIT-compiles its min-max and wsum kernels (~20-40 s on a loaded CPU)
def test_minmax_fusion_equals_ranx_wsum() -> None:
    from ranx import Run
    from ranx import fuse as ranx_fuse

    runs = random_runs(2, seed=3)
    w = [0.7, 0.3]
    ours = minmax_fusion(runs, w)
    theirs = ranx_fuse([Run(r) for r in runs], norm="min-max", method="wsum",
                       params={"weights": w}).to_dict()
    for q in ours:
        assert ours[q] == pytest.approx(theirs[q], rel=1e-9)
    norm = min_max_normalize(runs[0])
    for res in norm.values():
        assert min(res.values()) == 0.0 and max(res.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown fusion method"):
        fuse(runs, method="borda")


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [
        Passage("a", "The Eiffel Tower is a wrought-iron lattice tower in Paris", "Eiffel Tower"),
        Passage("b", "Paris is the capital and largest city of France", "Paris"),
        Passage("c", "Berlin is the capital of Germany", "Berlin"),
        Passage("d", "The Brandenburg Gate is an 18th-century monument in Berlin", "Gate"),
        Passage("e", "Rome is the capital city of Italy", "Rome"),
    ]


def test_hybrid_rrf_matches_fusion_of_its_parts(passages: list[Passage], tmp_path: Path) -> None:
    r1 = BM25Retriever(show_progress=False)
    r2 = BM25Retriever(method="bm25+", stopwords=None, stemmer=None, show_progress=False)
    hy = HybridRetriever([r1, r2], method="rrf", depth=5).index(passages)
    queries = ["capital of France", "monument in Berlin"]
    got = hy.search(queries, k=3)
    l1, l2 = r1.search(queries, k=5), r2.search(queries, k=5)
    for i, g in enumerate(got):
        runs = [{"q": l1[i].to_run_dict()}, {"q": l2[i].to_run_dict()}]
        want = rrf(runs)["q"]
        assert g.ids() == rank_docs(want)[:3]
        assert g.scores() == pytest.approx([want[d] for d in g.ids()])
    assert got[0].ids()[0] == "b"

    hy.save(tmp_path / "hy")
    manifest = json.loads((tmp_path / "hy" / "manifest.json").read_text())
    assert [e["kind"] for e in manifest["retrievers"]] == ["bm25", "bm25"]
    assert (tmp_path / "hy" / "retriever_1" / "manifest.json").exists()
    back = load_retriever(tmp_path / "hy")
    assert isinstance(back, HybridRetriever)
    again = back.search(queries, k=3)
    assert [x.ids() for x in again] == [x.ids() for x in got]
    assert [x.scores() for x in again] == [x.scores() for x in got]


def test_hybrid_minmax_and_errors(passages: list[Passage]) -> None:
    hy = HybridRetriever([BM25Retriever(show_progress=False),
                          BM25Retriever(method="atire", show_progress=False)],
                         method="minmax", weights=[0.5, 0.5]).index(passages)
    (res,) = hy.search(["capital of Italy"], k=2)
    assert res.ids()[0] == "e"
    assert res.scores()[0] == pytest.approx(1.0)  # top of both normalised runs
    with pytest.raises(ValueError, match="weights"):
        HybridRetriever([BM25Retriever()], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="unknown fusion method"):
        HybridRetriever([BM25Retriever()], method="condorcet")
    with pytest.raises(ValueError, match="call .index"):
        HybridRetriever([BM25Retriever()]).search(["x"])


def test_ranx_agrees_with_ir_measures() -> None:
    """The IR metrics used by the retrieval benchmarks (ranx) equal ir-measures' on one run."""
    import ir_measures
    from ir_measures import MRR, R, nDCG
    from ranx import Qrels, Run, evaluate

    run = random_runs(1, n_queries=8, n_docs=30, depth=12, seed=7)[0]
    rng = np.random.default_rng(1)
    qrels = {q: {f"d{d}": 1 for d in rng.choice(30, size=3, replace=False)} for q in run}
    ours = evaluate(Qrels(qrels), Run(run), ["recall@2", "recall@10", "mrr@10", "ndcg@10"])
    theirs = ir_measures.calc_aggregate([R @ 2, R @ 10, MRR @ 10, nDCG @ 10], qrels, run)
    assert ours["recall@2"] == pytest.approx(theirs[R @ 2])
    assert ours["recall@10"] == pytest.approx(theirs[R @ 10])
    assert ours["mrr@10"] == pytest.approx(theirs[MRR @ 10])
    assert ours["ndcg@10"] == pytest.approx(theirs[nDCG @ 10])
