"""Rankings carry their own cost and diagnostics (``RankedList.info``); concurrent calls never mix."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
import pytest

from ragkit.debias.moi import MoI
from ragkit.debias.outcomes import OutcomeResult, question_outcomes
from ragkit.debias.presets import Method
from ragkit.debias.profile import PositionProfile
from ragkit.debias.reranker import MoIReranker
from ragkit.eval.runner import _row, aggregate
from ragkit.types import Passage, QARecord, RankedList, RankInfo


def _ps(k: int, tag: str = "") -> list[Passage]:
    return [Passage(id=f"{tag}d{i}", text=f"word number {i} is {tag or 'plain'}", title=f"T{i}") for i in range(k)]


class _Gate:
    """A question-likelihood outcome that, when armed, waits until two calls are inside MoI at once."""

    def __init__(self) -> None:
        self.barrier: threading.Barrier | None = None
        self.__name__ = "gated_question"

    def __call__(self, generator: Any, questions: Any, passages: Any, orderings: Any, answers: Any) -> Any:
        if self.barrier is not None:
            self.barrier.wait()
        return question_outcomes(generator, questions, passages, orderings, answers)


def _key(rk: RankedList) -> tuple[Any, ...]:
    i = rk.info
    return (rk.ids(), [round(s, 9) for s in rk.scores()], i.generator_calls, i.forward_passes, i.tokens_prefilled,
            i.tokens_generated, i.batch_queries, i.fallback, i.details["orderings"])


def test_concurrent_arank_many_of_different_sizes_keep_their_answers_and_costs(gen) -> None:
    gate = _Gate()
    rr = MoIReranker(gen, design="cyclic", outcome=gate, profile=PositionProfile.flat(5), fallback=False)
    big = (["q one?", "q two?", "q three?"], [_ps(5, "a"), _ps(4, "b"), _ps(3, "c")])
    small = (["a lone question about words?"], [_ps(2, "z")])
    alone_big, alone_small = rr.rank_many(*big), rr.rank_many(*small)

    gate.barrier = threading.Barrier(2, timeout=120)  # both calls must be inside MoI together

    async def both() -> tuple[list[RankedList], list[RankedList]]:
        return await asyncio.gather(rr.arank_many(*big), rr.arank_many(*small))

    got_big, got_small = asyncio.run(both())
    assert [_key(r) for r in got_big] == [_key(r) for r in alone_big]
    assert [_key(r) for r in got_small] == [_key(r) for r in alone_small]
    assert [r.info.batch_queries for r in got_big] == [3, 3, 3] and got_small[0].info.batch_queries == 1
    assert got_big[0].info.tokens_prefilled > got_small[0].info.tokens_prefilled > 0

    # one level up: two methods sharing the reranker, run at once, keep their own answers and calls
    method = Method(rr, "ranked")
    gate.barrier = None
    alone = [method.run_many(*big, generate_answer=False), method.run_many(*small, generate_answer=False)]
    gate.barrier = threading.Barrier(2, timeout=120)
    outs: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda i=i, a=a: outs.__setitem__(i, method.run_many(*a, generate_answer=False)))
               for i, a in enumerate((big, small))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for i in (0, 1):
        assert [(o.ranking.ids(), o.generator_calls, o.order) for o in outs[i]] == \
            [(o.ranking.ids(), o.generator_calls, o.order) for o in alone[i]]


def test_fallback_is_reported_with_its_reason(gen) -> None:
    def flat(generator: Any, questions: Any, passages: Any, orderings: Any, answers: Any) -> list[OutcomeResult]:
        return [OutcomeResult(values=np.zeros(len(o)), generator_calls=len(o)) for o in orderings]

    ps = _ps(4)
    rr = MoIReranker(None, design="loo", outcome=flat)
    (rk,) = rr.rank_many(["q?"], [ps])
    assert rk.ids() == [p.id for p in ps]  # the input order
    assert rk.info.fallback and "same outcome" in rk.info.fallback_reason
    assert rk.info.generator_calls == 5 and rk.info.forward_passes == 0  # no model behind the callable
    # a query that separates does not fall back, and says nothing
    res = MoI.from_settings(None, design="loo", outcome=lambda *a: [OutcomeResult(values=np.array([0.0, -3.0, 0.1,
                            0.0, 0.2]))],
              blend=0.0).run("q?", ps, generate_answer=False)
    assert not res.fallback and res.fallback_reason == ""

    # evaluation rows carry the flag and the summary counts it
    out = Method(rr, "ranked").run_many(["q?"], [ps], generate_answer=False)[0]
    assert out.fallback
    rec = QARecord(id="q1", question="q?", answers=("x",), passages=tuple(ps), gold_ids=("d1",))
    row = _row("moi", rec, RankedList.from_scores(ps, [4, 3, 2, 1]), out, "hotpotqa", {"seconds": 0.1})
    assert row["fallback"] is True
    rows = [row, {**row, "qid": "q2", "fallback": False}, {**row, "qid": "q3"}]
    assert aggregate(rows, "hotpotqa", ["moi"], 10, 0)["moi"]["fallbacks"] == 2


def test_rank_info_is_frozen_and_json_ready() -> None:
    info = RankInfo(generator_calls=3, fallback=True, fallback_reason="why", details={"a": [1]})
    with pytest.raises(AttributeError):
        info.fallback = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        info.details["b"] = 2  # type: ignore[index]
    assert info.to_dict()["details"] == {"a": [1]} and "details" not in info.to_dict(details=False)
    rk = RankedList.from_scores(_ps(3), [1.0, 3.0, 2.0], info=info)
    assert rk.top_k(2).info is info and rk == RankedList.from_scores(_ps(3), [1.0, 3.0, 2.0])  # info not compared
    assert hash(rk) == hash(RankedList.from_scores(_ps(3), [1.0, 3.0, 2.0]))
