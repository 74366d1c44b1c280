"""The server's merged batches go through the cross-encoder's pair deduplication and length buckets."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ragkit.serve import ServeSettings, create_app

QUERY = "which river flows through the zebra castle?"
DOCS = ["The castle stands on a hill above the town.", "A zebra river flows past the old castle walls.",
        "Paris is the capital of France.", "Rivers carry water to the sea."]


def test_server_scores_a_repeated_pair_once(tiny_reranker: Any, live_server: Any) -> None:
    from ragkit.debias.student import DistilledReranker

    rr = DistilledReranker(tiny_reranker.model, batch_size=64)  # counters of its own
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=8, max_wait_ms=300, max_batch_tokens=200,
                                                   forward_cost_tokens=16)))
    assert (rr.max_batch_tokens, rr.forward_cost_tokens) == (200, 16)  # the settings reach the reranker
    expected = tiny_reranker.rank(QUERY, DOCS)

    async def go() -> list[httpx.Response]:  # 8 identical requests, distinct documents in each
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True})
                                          for _ in range(8)))

    responses = asyncio.run(go())
    for r in responses:
        assert r.status_code == 200
        assert [x["index"] for x in r.json()] == [int(h.passage.id) for h in expected]
        assert [x["score"] for x in r.json()] == pytest.approx(expected.scores(), abs=1e-5)
    assert rr.pairs_requested == 8 * len(DOCS)
    assert rr.pairs_scored < rr.pairs_requested  # merged requests shared their pairs
    pairs = httpx.get(srv.url + "/health?detail=1").json()["pairs"]
    assert pairs == {"requested": rr.pairs_requested, "scored": rr.pairs_scored, "real_tokens": rr.real_tokens,
                     "padded_tokens": rr.padded_tokens}


def test_settings_of_the_buckets() -> None:
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
