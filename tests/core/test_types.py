"""ragkit.types: value types shared by every module."""

from __future__ import annotations

import pytest

from ragkit.types import Hit, Passage, QARecord, Query, RankedList, as_passages, as_query


def _ps(n: int) -> list[Passage]:
    return [Passage(f"p{i}", f"text {i}", title=f"T{i}") for i in range(n)]


def test_from_scores_sorts_descending_and_keeps_input_order_on_ties() -> None:
    ps = _ps(5)
    rl = RankedList.from_scores(ps, [0.5, 2.0, 0.5, 3.0, 2.0], query=Query("q"))
    assert rl.ids() == ["p3", "p1", "p4", "p0", "p2"]
    assert rl.scores() == [3.0, 2.0, 2.0, 0.5, 0.5]
    assert [h.rank for h in rl] == [0, 1, 2, 3, 4]
    assert rl.query == Query("q")
    assert len(rl) == 5 and rl[0].id == "p3"
    with pytest.raises(ValueError, match="5 passages but 4 scores"):
        RankedList.from_scores(ps, [1, 2, 3, 4])


def test_top_k() -> None:
    rl = RankedList.from_scores(_ps(4), [4, 3, 2, 1])
    top = rl.top_k(2)
    assert top.ids() == ["p0", "p1"] and isinstance(top, RankedList)
    assert rl.top_k(10).ids() == rl.ids()
    with pytest.raises(ValueError, match="k must be >= 1"):
        rl.top_k(0)


def test_to_run_dict_is_strictly_decreasing_in_rank_order() -> None:
    rl = RankedList.from_scores(_ps(4), [1.0, 1.0, 1.0, 5.0])
    run = rl.to_run_dict()
    assert list(run) == rl.ids() == ["p3", "p0", "p1", "p2"]
    vals = list(run.values())
    assert all(a > b for a, b in zip(vals, vals[1:]))
    # sorting the run by score reproduces the ranked order, even with tied input scores
    assert sorted(run, key=lambda d: -run[d]) == rl.ids()


def test_to_trec_lines() -> None:
    rl = RankedList.from_scores(_ps(2), [0.25, 0.75])
    assert rl.to_trec("q1", run_name="bm25") == [
        "q1 Q0 p1 1 0.750000 bm25",
        "q1 Q0 p0 2 0.250000 bm25",
    ]


def test_passage_dict_round_trip_and_errors() -> None:
    p = Passage("x", "body", title="Title", metadata={"gold": True})
    assert p.contents == "Title\nbody"
    assert Passage("y", "only").contents == "only"
    assert Passage.from_dict(p.to_dict()) == p
    assert Passage.from_dict(p.to_dict()).metadata == {"gold": True}
    assert Passage.from_dict({"id": 3, "text": "t"}).id == "3"
    with pytest.raises(ValueError, match="needs 'id' and 'text'"):
        Passage.from_dict({"text": "no id"})
    with pytest.raises(ValueError, match="needs 'id' and 'text'"):
        Passage.from_dict({"id": "a"})
    with pytest.raises(ValueError, match="non-empty string"):
        Passage("", "t")
    with pytest.raises(TypeError, match="must be a string"):
        Passage("a", None)  # type: ignore[arg-type]
    # metadata is not part of equality / hashing
    assert Passage("a", "t", metadata={"x": 1}) == Passage("a", "t")
    assert len({Passage("a", "t", metadata={"x": 1}), Passage("a", "t")}) == 1


def test_query_record_and_coercion() -> None:
    with pytest.raises(ValueError, match="empty query"):
        Query("   ")
    q = Query("who?", id="1", answers=["a", "b"])  # type: ignore[arg-type]
    assert q.answers == ("a", "b")
    assert as_query("hi") == Query("hi") and as_query(q) is q
    rec = QARecord("r1", "who?", answers=["x"], passages=_ps(2), gold_ids=["p1"])  # type: ignore[arg-type]
    assert isinstance(rec.passages, tuple) and rec.query == Query("who?", id="r1", answers=("x",))
    ps = as_passages(["alpha", {"id": "d", "text": "delta"}, Passage("z", "zeta")])
    assert [p.id for p in ps] == ["0", "d", "z"]
    with pytest.raises(TypeError, match="cannot make a Passage"):
        as_passages([3.14])  # type: ignore[list-item]
    h = Hit(Passage("a", "t"), 1.5, 0)
    assert h.id == "a"
