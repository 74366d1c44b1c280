"""``CrossEncoderReranker.rank_many``: distinct pairs scored once, in length buckets, with the old rankings."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragkit.batching import length_buckets
from ragkit.debias.cross_encoder import CrossEncoderReranker, pair_text
from ragkit.types import Passage, RankedList

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
    " ".join(["a very long paragraph about rivers and castles"] * 30),  # beyond max_length: truncated
]


class Recording(CrossEncoderReranker):
    """The real reranker, recording the pairs of every encoder call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[tuple[str, str]]] = []

    def _predict(self, pairs: list[tuple[str, str]], show: bool) -> np.ndarray:
        self.calls.append(list(pairs))
        return super()._predict(pairs, show)


@pytest.fixture(scope="module")
def model(tiny_encoder_dir: Path) -> Any:
    """A tiny random one-output cross-encoder (2-layer BERT, hidden 32, pairs truncated at 64 tokens)."""
    from ragkit.debias.student import DistilledReranker

    return DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0).model


def _passages(texts: list[str]) -> list[Passage]:
    return [Passage(id=str(i), text=t) for i, t in enumerate(texts)]


def _old_rank_many(rr: CrossEncoderReranker, queries: list[str], lists: list[list[Passage]]) -> list[RankedList]:
    """The ranking rule before bucketing: every pair in one ``predict``, ``RankedList.from_scores``."""
    per_query = rr.score_pairs(queries, lists)
    return [RankedList.from_scores(ps, s.tolist()) for ps, s in zip(lists, per_query)]


def test_merged_rank_many_equals_per_query_rank(model: Any) -> None:
    # lists of different sizes and lengths, one exact repeated list, one document listed twice
    queries = [QUERIES[0], QUERIES[1], QUERIES[2], QUERIES[0], QUERIES[1]]
    lists = [_passages(DOCS), _passages(DOCS[:2]), _passages(DOCS[2:5]), _passages(DOCS),
             _passages([DOCS[3], DOCS[1], DOCS[3]])]
    rr = Recording(model, batch_size=4, max_batch_tokens=96, forward_cost_tokens=8)
    plain = CrossEncoderReranker(model, batch_size=64)
    merged = rr.rank_many(queries, lists)
    old = _old_rank_many(plain, queries, lists)
    for q, ps, got, want in zip(queries, lists, merged, old):
        single = rr.rank(q, ps)
        for ref in (single, want):
            assert got.ids() == ref.ids()
            assert got.scores() == pytest.approx(ref.scores(), abs=1e-5)
        assert got.query is not None and got.query.text == q
    # the same text is one pair: one score, and the tie keeps the input order
    dup = merged[4]
    assert [h.passage.id for h in dup if h.passage.text == DOCS[3]] == ["0", "2"]
    assert len({h.score for h in dup if h.passage.text == DOCS[3]}) == 1

    # the first call (before the per-query rank() calls above): every distinct pair once
    requested = sum(len(ps) for ps in lists)
    distinct = {(q, pair_text(p)) for q, ps in zip(queries, lists) for p in ps}
    # once: the repeated list (7 pairs), the repeated document (1) and (QUERIES[1], DOCS[1]),
    # asked by the second and the last list (1)
    assert len(distinct) == requested - 7 - 1 - 1
    n_first = next(i for i in range(1, len(rr.calls) + 1) if sum(map(len, rr.calls[:i])) == len(distinct))
    first = [p for c in rr.calls[:n_first] for p in c]
    # each distinct pair exactly once, the long document cut on text to the encoder's budget
    assert sorted(first) == sorted(rr.cut(sorted(distinct)).units)
    assert set(first) - distinct == {(QUERIES[0], rr.cut([(QUERIES[0], DOCS[6])]).units[0][1])}  # DOCS[6] only
    lengths = dict(zip(first, rr.pair_lengths(first)))
    for c in rr.calls[:n_first]:  # every encoder batch within the caps
        longest = max(lengths[p] for p in c)
        assert len(c) <= 4 and len(c) * longest <= 96 or len(c) == 1
    assert n_first > 1 and max(lengths.values()) == 64  # several buckets; the long pair is truncated


def test_counters(model: Any) -> None:
    rr = CrossEncoderReranker(model, batch_size=8, max_batch_tokens=128, forward_cost_tokens=0)
    lists = [_passages(DOCS[:4]), _passages(DOCS[:4]), _passages([DOCS[5], DOCS[5]])]
    rr.rank_many([QUERIES[0], QUERIES[0], QUERIES[1]], lists)
    assert (rr.pairs_requested, rr.pairs_scored, rr.forward_passes) == (10, 5, 5)
    lengths = rr.pair_lengths([(QUERIES[0], d) for d in DOCS[:4]] + [(QUERIES[1], DOCS[5])])
    assert rr.real_tokens == sum(lengths)
    assert rr.real_tokens <= rr.padded_tokens <= 5 * max(lengths)
    rr.rank(QUERIES[2], DOCS[:2])
    assert (rr.pairs_requested, rr.pairs_scored, rr.forward_passes) == (12, 7, 7)
    rr.score_pairs([QUERIES[2]], [_passages(DOCS[:2])])  # the plain path: no deduplication, no pair counters
    assert (rr.pairs_requested, rr.pairs_scored, rr.forward_passes) == (12, 7, 9)


def test_lengths_are_the_encoders_own(model: Any) -> None:
    rr = CrossEncoderReranker(model)
    pairs = [(QUERIES[0], d) for d in DOCS]
    got = rr.pair_lengths(pairs)
    enc = model.tokenizer([q for q, _ in pairs], [t for _, t in pairs], truncation=True, max_length=64,
                          padding=True, return_tensors="np")
    assert got == enc["attention_mask"].sum(axis=1).tolist()
    assert got[-1] == 64 and got[5] < got[1]


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
@pytest.mark.parametrize(("max_rows", "cap"), [(3, 150), (9, 150), (4, None)])
def test_buckets_are_the_cheapest_cut(c0: int, max_rows: int, cap: int | None) -> None:
    rng = random.Random(c0 * 31 + max_rows)
    for _ in range(25):
        lengths = [rng.randint(5, 60) for _ in range(rng.randint(1, 9))]
        buckets = length_buckets(lengths, max_rows, cap, c0)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
        for b in buckets:
            longest = max(lengths[i] for i in b)
            assert lengths[b[0]] == longest and len(b) <= max_rows
            assert cap is None or len(b) * longest <= cap
        got = sum(c0 + len(b) * lengths[b[0]] for b in buckets)
        srt = sorted(lengths, reverse=True)
        feasible = [sum(c0 + (e - s) * srt[s] for s, e in p) for p in _partitions(len(srt))
                    if all(e - s <= max_rows and (cap is None or (e - s) * srt[s] <= cap) for s, e in p)]
        assert got == min(feasible), (lengths, buckets)


def test_buckets_by_hand() -> None:
    # [50, 50, 10]: one batch costs c0 + 150, [50, 50] + [10] costs 2 c0 + 110: two when c0 < 40
    assert length_buckets([50, 50, 10], 8, None, 20) == [[0, 1], [2]]
    assert length_buckets([50, 50, 10], 8, None, 40) == [[0, 1, 2]]  # a tie keeps the fewer batches
    assert length_buckets([10, 50, 50], 8, None, 100) == [[1, 2, 0]]  # longest first, ties in input order
    assert length_buckets([50, 50, 10], 8, 120, 100) == [[0, 1], [2]]  # 3 x 50 > 120; 100 + 100 + 10 < 50 + 2 x 50
    assert length_buckets([50, 50, 10], 8, 99, 100) == [[0], [1], [2]]  # any 2 rows with a 50 exceed 99 tokens
    assert length_buckets([500, 3], 8, 100, 0) == [[0], [1]]  # longer than the cap: alone
    assert sorted(map(len, length_buckets([5] * 5, 2, None, 1))) == [1, 2, 2]  # batch_size 2: 3 forwards
    assert length_buckets([], 8) == []
    with pytest.raises(ValueError, match="max_batch_tokens"):
        length_buckets([1], 8, 0)
    with pytest.raises(ValueError, match="forward_cost_tokens"):
        length_buckets([1], 8, None, -1)


def test_settings_are_checked_and_passed_through(model: Any, tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    with pytest.raises(ValueError, match="max_batch_tokens"):
        CrossEncoderReranker(model, max_batch_tokens=0)
    with pytest.raises(ValueError, match="forward_cost_tokens"):
        CrossEncoderReranker(model, forward_cost_tokens=-1)
    rr = CrossEncoderReranker(model)
    assert rr.max_batch_tokens is None and rr.forward_cost_tokens == 128
    with pytest.raises(ValueError, match="max_batch_tokens"):
        rr.max_batch_tokens = -5
    student = DistilledReranker(model, {"seed": 0})
    folder = student.save_pretrained(tmp_path / "student")
    loaded = CrossEncoderReranker.from_pretrained(str(folder), device="cpu", max_batch_tokens=512,
                                                  forward_cost_tokens=7)
    assert (loaded.max_batch_tokens, loaded.forward_cost_tokens) == (512, 7)
    # the student inherits the bucketed ranking rule
    assert type(student)._rank_many is CrossEncoderReranker._rank_many
    student.max_batch_tokens = 96
    got = student.rank_many([QUERIES[0], QUERIES[0]], [_passages(DOCS), _passages(DOCS)])
    assert student.pairs_scored == len(DOCS) and student.pairs_requested == 2 * len(DOCS)
    assert got[0].ids() == got[1].ids() == loaded.rank(QUERIES[0], DOCS).ids()


def test_student_takes_the_bucket_settings(model: Any, tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    student = DistilledReranker(model, {"seed": 0}, max_batch_tokens=256, forward_cost_tokens=5)
    assert (student.max_batch_tokens, student.forward_cost_tokens) == (256, 5)
    folder = student.save_pretrained(tmp_path / "s")
    for loaded in (DistilledReranker.load(folder, device="cpu", max_batch_tokens=300, forward_cost_tokens=9),
                   DistilledReranker.from_pretrained(folder, device="cpu", max_batch_tokens=300,
                                                     forward_cost_tokens=9)):
        assert (loaded.max_batch_tokens, loaded.forward_cost_tokens) == (300, 9)
