"""``PairBatchScorer``: a merged micro-batch scored pair by pair gives the reranker's own rankings."""

from __future__ import annotations

from typing import Any

import pytest

from ragkit.reranking import Reranker
from ragkit.serve import PairBatchScorer, ServeSettings, create_app
from ragkit.serve.scoring import is_pointwise
from ragkit.types import Passage

QUERIES = ["which river flows through the zebra castle?", "who painted the striped horse?", "capital of France"]
DOCS = [
    "The castle stands on a hill above the town.",
    "A zebra river flows past the old castle walls, where the water is slow and brown in the summer "
    "and fast and grey in the long wet winter months of the northern valley.",
    "Paris is the capital of France.",
    "Rivers carry water to the sea.",
    "The zebra is a striped animal of Africa; painters have shown it in many styles over the centuries, "
    "from cave walls to modern canvases, and it remains a favourite subject.",
    "x",
]


def _passages(texts: list[str]) -> list[Passage]:
    return [Passage(id=str(i), text=t) for i, t in enumerate(texts)]


def test_merged_batch_equals_per_request_rank_many(tiny_reranker: Any) -> None:
    # requests of different sizes and lengths, one exact duplicate request, one duplicated document
    queries = [QUERIES[0], QUERIES[1], QUERIES[2], QUERIES[0], QUERIES[1]]
    lists = [_passages(DOCS), _passages(DOCS[:2]), _passages(DOCS[2:5]), _passages(DOCS),
             _passages([DOCS[3], DOCS[1], DOCS[3]])]
    scorer = PairBatchScorer(tiny_reranker, max_batch_tokens=96, forward_cost_tokens=8)
    merged = scorer(queries, lists)
    for q, ps, got in zip(queries, lists, merged):
        expected = tiny_reranker.rank(q, ps)
        by_id = {h.passage.id: h.score for h in expected}
        assert {h.passage.id: h.score for h in got} == pytest.approx(by_id, abs=1e-6)
        if len({p.text for p in ps}) == len(ps):  # no tie by construction: the same order
            assert [h.passage.id for h in got] == [h.passage.id for h in expected]
        assert got.query is not None and got.query.text == q
    # the same text scores the same (one pair), so the tie keeps the input order
    dup = merged[4]
    assert [h.passage.id for h in dup if h.passage.text == DOCS[3]] == ["0", "2"]
    assert len({h.score for h in dup if h.passage.text == DOCS[3]}) == 1
    requested = sum(len(ps) for ps in lists)
    assert scorer.pairs_requested == requested
    # scored once: the repeated request (6 pairs), the repeated document (1 pair) and
    # (QUERIES[1], DOCS[1]), asked by the second and the last request (1 pair)
    assert scorer.pairs_scored == requested - 6 - 1 - 1
    assert scorer.real_tokens <= scorer.padded_tokens


def _partitions(n: int) -> list[list[tuple[int, int]]]:
    """Every cut of positions 0..n-1 into contiguous (start, end) runs."""
    out = []
    for mask in range(1 << max(0, n - 1)):
        runs, start = [], 0
        for k in range(1, n):
            if mask >> (k - 1) & 1:
                runs.append((start, k))
                start = k
        out.append([*runs, (start, n)])
    return out


@pytest.mark.parametrize("c0", [0, 20, 1000])
def test_buckets_are_the_cheapest_cut(tiny_reranker: Any, c0: int) -> None:
    import random

    rng = random.Random(c0)
    scorer = PairBatchScorer(tiny_reranker, max_batch_tokens=150, forward_cost_tokens=c0)
    for _ in range(20):
        lengths = [rng.randint(5, 60) for _ in range(rng.randint(1, 9))]
        buckets = scorer.buckets(lengths)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
        for b in buckets:
            longest = max(lengths[i] for i in b)
            assert lengths[b[0]] == longest and len(b) * longest <= 150
        got = sum(c0 + len(b) * lengths[b[0]] for b in buckets)
        srt = sorted(lengths, reverse=True)
        feasible = [sum(c0 + (e - s) * srt[s] for s, e in p) for p in _partitions(len(srt))
                    if all((e - s) * srt[s] <= 150 for s, e in p)]
        assert got == min(feasible), (lengths, buckets)
    assert scorer.buckets([50, 50, 10]) == ([[0, 1], [2]] if c0 < 40 else [[0, 1, 2]])


def test_only_pointwise_rerankers_get_pair_scoring(tiny_reranker: Any) -> None:
    class Listwise(Reranker):
        def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
            return tiny_reranker.rank_many(queries, passages, scores)

    assert is_pointwise(tiny_reranker)
    assert not is_pointwise(Listwise())
    with pytest.raises(TypeError, match="pointwise"):
        PairBatchScorer(Listwise())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="forward_cost_tokens"):
        PairBatchScorer(tiny_reranker, forward_cost_tokens=-1)
    assert isinstance(create_app(tiny_reranker).state.batcher.fn, PairBatchScorer)
    assert not isinstance(create_app(Listwise()).state.batcher.fn, PairBatchScorer)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        ServeSettings(max_batch_tokens=0)
    with pytest.raises(ValueError, match="forward_cost_tokens"):
        ServeSettings(forward_cost_tokens=-1)



def test_fixed_mmap_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from ragkit.serve import fixed_mmap_threshold

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert fixed_mmap_threshold() is False  # the environment's own setting wins
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert fixed_mmap_threshold() is True
