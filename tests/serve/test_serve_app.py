"""``ragkit serve`` on a real uvicorn server, called with the real Cohere SDK and plain HTTP (httpx)."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import httpx
import pytest

from ragkit.reranking import Reranker
from ragkit.serve import ServeSettings, create_app
from ragkit.types import RankedList

QUERY = "which river flows through the zebra castle?"
DOCS = [
    "The castle stands on a hill above the town.",
    "A zebra river flows past the old castle walls.",
    "Paris is the capital of France.",
    "Rivers carry water to the sea.",
    "The zebra is a striped animal of Africa.",
]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Wrapped(Reranker):
    """A real reranker around the tiny student that can be slowed down, fail on a marker query,
    and records the size of every ``rank_many`` call."""

    def __init__(self, inner: Reranker, delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.calls: list[int] = []
        self.lock = threading.Lock()

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls.append(len(queries))
        if self.delay:
            time.sleep(self.delay)
        if any("BOOM" in q.text for q in queries):
            raise RuntimeError("the model blew up on a BOOM query")
        return self.inner.rank_many(queries, passages, scores)


def test_cohere_sdk_and_tei_match_in_process(tiny_reranker: Any, live_server: Any) -> None:
    import cohere

    expected: RankedList = tiny_reranker.rank(QUERY, DOCS)
    exp_idx = [int(h.passage.id) for h in expected]
    srv = live_server(create_app(tiny_reranker, ServeSettings(model_name="tiny-student")))

    co = cohere.ClientV2(base_url=srv.url, api_key="unused")
    res = co.rerank(model="tiny-student", query=QUERY, documents=DOCS, top_n=3)
    assert [r.index for r in res.results] == exp_idx[:3]
    for r, h in zip(res.results, expected):
        assert r.relevance_score == pytest.approx(_sigmoid(h.score), abs=1e-6)
        assert 0.0 <= r.relevance_score <= 1.0
    res_all = co.rerank(model="tiny-student", query=QUERY, documents=DOCS)
    assert [r.index for r in res_all.results] == exp_idx

    v1 = cohere.Client(base_url=srv.url, api_key="unused")  # the v1 client speaks /v1/rerank
    res1 = v1.rerank(model="tiny-student", query=QUERY, documents=DOCS, top_n=2, return_documents=True)
    assert [r.index for r in res1.results] == exp_idx[:2]
    assert res1.results[0].document.text == DOCS[exp_idx[0]]

    tei = httpx.post(f"{srv.url}/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True,
                                                "return_text": True}).json()
    assert [r["index"] for r in tei] == exp_idx
    assert [r["score"] for r in tei] == pytest.approx(expected.scores(), abs=1e-5)
    assert tei[0]["text"] == DOCS[exp_idx[0]]
    tei_sig = httpx.post(f"{srv.url}/rerank", json={"query": QUERY, "texts": DOCS}).json()
    assert [r["score"] for r in tei_sig] == pytest.approx([_sigmoid(s) for s in expected.scores()], abs=1e-6)
    # Cohere's {"text": ...} documents are accepted too
    obj = httpx.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": [{"text": d} for d in DOCS]})
    assert [r["index"] for r in obj.json()["results"]] == exp_idx

    assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{srv.url}/metrics").text
    assert 'ragkit_requests_total{endpoint="cohere",status="200"} 4.0' in metrics
    assert 'ragkit_requests_total{endpoint="tei",status="200"} 2.0' in metrics
    assert "ragkit_batch_size_bucket" in metrics


def test_concurrent_requests_are_micro_batched(tiny_reranker: Any, live_server: Any) -> None:
    rr = Wrapped(tiny_reranker)
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=8, max_wait_ms=200)))
    queries = [f"{QUERY} variant {i}" for i in range(16)]
    expected = tiny_reranker.rank_many(queries, [DOCS] * len(queries))

    async def go() -> list[Any]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/rerank", json={"query": q, "texts": DOCS, "raw_scores": True})
                                          for q in queries))

    responses = asyncio.run(go())
    assert all(r.status_code == 200 for r in responses)
    for r, e in zip(responses, expected):
        assert [x["index"] for x in r.json()] == [int(h.passage.id) for h in e]
        assert [x["score"] for x in r.json()] == pytest.approx(e.scores(), abs=1e-5)
    assert sum(rr.calls) == 16
    assert max(rr.calls) > 1 and len(rr.calls) < 16, f"no micro-batching: batch sizes {rr.calls}"
    assert max(rr.calls) <= 8


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/rerank", {"documents": ["a"]}, 422, "query"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, 422, "query"),
        ("/v1/rerank", {"query": "q", "documents": "a"}, 422, "documents"),
        ("/v1/rerank", {"query": "q", "documents": []}, 422, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a", 3]}, 422, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["a", {"title": "x"}]}, 422, "documents[1]"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": True}, 422, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * 11}, 413, "documents"),
        ("/v2/rerank", {"query": "q" * 101, "documents": ["a"]}, 413, "query"),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": "yes"}, 422, "raw_scores"),
        ("/rerank", {"query": "q", "documents": ["a"]}, 422, "texts"),
        ("/rerank", ["not", "an", "object"], 422, "body"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(tiny_reranker: Any, live_server: Any, path: str, body: Any,
                                                   status: int, field: str) -> None:
    srv = live_server(create_app(tiny_reranker, ServeSettings(max_documents=10, max_chars=100)))
    r = httpx.post(srv.url + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["field"] == field
    assert f"`{field}" in err["message"]


def test_invalid_json_and_oversized_body(tiny_reranker: Any, live_server: Any) -> None:
    srv = live_server(create_app(tiny_reranker, ServeSettings(max_documents=2, max_chars=10)))
    r = httpx.post(srv.url + "/rerank", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"
    big = b'{"query": "q", "texts": ["' + b"x" * 200_000 + b'"]}'
    r = httpx.post(srv.url + "/rerank", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["field"] == "body"
    assert httpx.post(srv.url + "/rerank", json={"query": "q", "texts": ["ok"]}).status_code == 200


def test_overload_gets_503_with_retry_after_and_server_stays_healthy(tiny_reranker: Any, live_server: Any) -> None:
    rr = Wrapped(tiny_reranker, delay=0.3)
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=1, max_wait_ms=0, max_queue=2, retry_after_s=3)))

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/v1/rerank", json={"query": f"q{i}", "documents": DOCS})
                                          for i in range(10)))

    responses = asyncio.run(go())
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 503}, codes
    # at most one running + max_queue waiting can be accepted at any time
    assert codes.count(200) >= 2 and codes.count(503) >= 1
    busy = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "3" for r in busy)
    assert "overloaded" in busy[0].json()["message"]
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.post(srv.url + "/v1/rerank", json={"query": "again", "documents": DOCS}).status_code == 200
    assert 'ragkit_requests_total{endpoint="cohere",status="503"}' in httpx.get(srv.url + "/metrics").text


def test_model_error_fails_only_its_request(tiny_reranker: Any, live_server: Any) -> None:
    rr = Wrapped(tiny_reranker)
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=8, max_wait_ms=300)))

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/rerank", json={"query": q, "texts": DOCS})
                                          for q in ["good one", "BOOM here", "good two"]))

    good1, bad, good2 = asyncio.run(go())
    assert bad.status_code == 500 and "BOOM" in bad.json()["message"]
    assert good1.status_code == 200 and good2.status_code == 200
    assert rr.calls[0] == 3  # they shared a batch, which was retried one by one
    assert httpx.get(srv.url + "/health").status_code == 200
    assert httpx.post(srv.url + "/rerank", json={"query": "fine", "texts": DOCS}).status_code == 200


def test_bearer_token_auth(tiny_reranker: Any, live_server: Any) -> None:
    import cohere
    from cohere.errors import UnauthorizedError  # ``cohere.errors`` resolves only once the submodule is imported

    srv = live_server(create_app(tiny_reranker, ServeSettings(api_key="s3cret")))
    body = {"query": QUERY, "texts": DOCS}
    assert httpx.post(srv.url + "/rerank", json=body).status_code == 401
    r = httpx.post(srv.url + "/rerank", json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.post(srv.url + "/rerank", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    with pytest.raises(UnauthorizedError):
        cohere.ClientV2(base_url=srv.url, api_key="wrong").rerank(model="m", query=QUERY, documents=DOCS)
    ok = cohere.ClientV2(base_url=srv.url, api_key="s3cret").rerank(model="m", query=QUERY, documents=DOCS)
    assert len(ok.results) == len(DOCS)
    assert httpx.get(srv.url + "/health").status_code == 200  # health and metrics stay open
    assert httpx.get(srv.url + "/metrics").status_code == 200


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="max_queue"):
        ServeSettings(max_queue=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        ServeSettings(max_wait_ms=-1)
    with pytest.raises(ValueError, match="api_key"):
        ServeSettings(api_key=" ")
    assert ServeSettings(api_key="k").public()["api_key"] == "set"
    with pytest.raises(TypeError, match="rank_many"):
        create_app(object())
