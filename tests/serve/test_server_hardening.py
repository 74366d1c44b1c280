"""``ragkit serve`` under requests that try to wedge or exhaust it, on a real uvicorn server on 127.0.0.1.

Each test names the way the server failed before: a 500 with a traceback, a body read whole before
its size was checked, a request that waited forever, a key that never matched, a secret shown.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from ragkit.reranking import Reranker
from ragkit.serve import ServeSettings, create_app

QUERY = "which river flows through the zebra castle?"
DOCS = ["The castle stands on a hill above the town.", "A zebra river flows past the old castle walls.",
        "Paris is the capital of France."]


class Slow(Reranker):
    """The tiny student behind a switchable delay and failure, recording every ``rank_many`` call."""

    def __init__(self, inner: Reranker, delay: float = 0.0, fail: bool = False, per_doc: float = 0.0) -> None:
        self.inner, self.delay, self.fail, self.per_doc = inner, delay, fail, per_doc
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls.append([q.text for q in queries])
        if self.delay or self.per_doc:
            time.sleep(self.delay + self.per_doc * sum(len(p) for p in passages))
        if self.fail:
            raise ConnectionError("the generator server is unreachable")
        if any("BOOM" in q.text for q in queries):
            raise RuntimeError("the model blew up on a BOOM query")
        return self.inner.rank_many(queries, passages, scores)


def _raw(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _chunked_head(path: str = "/rerank") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _status_within(s: socket.socket, seconds: float) -> int | None:
    """The status of the response on ``s`` if one arrives within ``seconds`` (None: none came)."""
    s.settimeout(seconds)
    try:
        head = s.recv(4096)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return -1
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1") else -1


def test_a_chunked_body_is_refused_once_it_passes_the_limit_not_after_reading_it(tiny_reranker: Any,
                                                                                  live_server: Any) -> None:
    settings = ServeSettings(max_documents=2, max_chars=100)  # max_body_bytes ~ 66 KB
    srv = live_server(create_app(tiny_reranker, settings))
    s = _raw(srv.url)
    s.sendall(_chunked_head() + _chunk(b'{"query": "q", "texts": ["' + b"x" * 100_000))
    # the body is not finished (no last chunk): the old server waited for all of it before checking
    assert _status_within(s, 5.0) == 413
    s.close()
    assert httpx.post(srv.url + "/rerank", json={"query": "q", "texts": ["ok"]}).status_code == 200


def test_bodies_in_flight_together_are_bounded(tiny_reranker: Any, live_server: Any) -> None:
    settings = ServeSettings(max_documents=2, max_chars=100, max_pending_bytes=100_000, retry_after_s=2)
    srv = live_server(create_app(tiny_reranker, settings))
    first = _raw(srv.url)
    first.sendall(_chunked_head() + _chunk(b'{"query": "q", "texts": ["' + b"x" * 60_000))
    time.sleep(0.5)
    second = _raw(srv.url)
    second.sendall(_chunked_head() + _chunk(b'{"query": "q", "texts": ["' + b"y" * 60_000))
    assert _status_within(second, 5.0) == 503  # 120 KB held at once would pass max_pending_bytes
    first.close()
    second.close()
    time.sleep(0.5)  # the first body's bytes are given back when its client goes
    assert httpx.post(srv.url + "/rerank", json={"query": "q", "texts": ["ok"]}).status_code == 200
    detail = httpx.get(srv.url + "/health?detail=1").json()
    assert detail["pending_body_bytes"] == 0


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.0, 1e9])
def test_max_wait_ms_must_be_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="max_wait_ms must be a finite number"):
        ServeSettings(max_wait_ms=bad)
    with pytest.raises(ValueError, match="request_timeout_s"):
        ServeSettings(request_timeout_s=bad if bad != 1e9 else math.inf)


def test_a_client_that_disconnects_is_not_a_server_error(tiny_reranker: Any, live_server: Any) -> None:
    srv = live_server(create_app(Slow(tiny_reranker, delay=1.0), ServeSettings()))
    s = _raw(srv.url)  # goes away in the middle of its body
    s.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
              b'{"query": "q", ')
    time.sleep(0.3)
    s.close()
    body = b'{"query": "q", "texts": ["a", "b"]}'
    s2 = _raw(srv.url)  # goes away while its request is ranked
    s2.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.3)
    s2.close()
    time.sleep(1.5)
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'status="500"' not in metrics
    assert 'ragkit_requests_total{endpoint="tei",status="499"} 2.0' in metrics


@pytest.mark.parametrize(("raw", "field"), [
    (b'{"query": "\\ud800", "texts": ["a"]}', "body"),  # a lone surrogate
    (b'{"query": "q", "texts": ["a", "\\udfff b"]}', "body"),
    (b"[" * 100_000 + b"]" * 100_000, "body"),  # nesting deeper than any parser's recursion
    (b'{"query": "q", "texts": ["a"], "raw_scores": ' + b"9" * 5000 + b"}", "body"),  # 5,000 digits
    (b'{"query": ' + b"9" * 5000 + b', "texts": ["a"]}', "body"),
    (b'{"query": "\\u0000\\u0000", "texts": ["a"]}', "query"),  # only NUL characters
    (b'{"query": "\\u200b\\u200c\\u200d\\u2060\\ufeff", "texts": ["a"]}', "query"),  # only zero-width characters
], ids=["surrogate-query", "surrogate-text", "nested-100k", "digits-raw_scores", "digits-query", "nul-query",
        "zero-width-query"])
def test_hostile_json_is_a_422_not_a_500(tiny_reranker: Any, live_server: Any, raw: bytes, field: str) -> None:
    srv = live_server(create_app(tiny_reranker, ServeSettings()))
    r = httpx.post(srv.url + "/rerank", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    cohere = raw.replace(b'"texts"', b'"documents"')
    r = httpx.post(srv.url + "/v1/rerank", content=cohere, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert 'status="500"' not in httpx.get(srv.url + "/metrics").text


def test_top_n_of_5000_digits_is_a_422(tiny_reranker: Any, live_server: Any) -> None:
    srv = live_server(create_app(tiny_reranker, ServeSettings()))
    raw = b'{"query": "q", "documents": ["a"], "top_n": ' + b"7" * 5000 + b"}"
    r = httpx.post(srv.url + "/v1/rerank", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"


def test_the_per_request_work_budget(tiny_reranker: Any, live_server: Any) -> None:
    srv = live_server(create_app(tiny_reranker, ServeSettings(max_request_chars=2_000, max_pair_chars=250)))
    r = httpx.post(srv.url + "/rerank", json={"query": "q" * 100, "texts": ["d" * 100] * 11})
    assert r.status_code == 413 and "max_request_chars" in r.json()["message"] and r.json()["field"] == "texts"
    assert httpx.post(srv.url + "/rerank", json={"query": "q" * 100, "texts": ["d" * 100] * 9}).status_code == 200
    # text past the window a reranker reads adds no work: a pair counts at most max_pair_chars
    assert httpx.post(srv.url + "/rerank", json={"query": "q", "texts": ["d" * 10_000] * 9}).status_code == 413
    assert httpx.post(srv.url + "/rerank", json={"query": "q", "texts": ["d" * 10_000] * 7}).status_code == 200


def test_a_request_gets_504_at_its_deadline_and_queued_work_is_dropped(tiny_reranker: Any, live_server: Any) -> None:
    rr = Slow(tiny_reranker, delay=2.0)
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=1, max_wait_ms=0, request_timeout_s=0.7)))

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            first = asyncio.ensure_future(c.post("/rerank", json={"query": "first", "texts": DOCS}))
            await asyncio.sleep(0.2)
            second = asyncio.ensure_future(c.post("/rerank", json={"query": "second", "texts": DOCS}))
            return list(await asyncio.gather(first, second))

    t0 = time.monotonic()
    first, second = asyncio.run(go())
    assert time.monotonic() - t0 < 1.8  # both answered at their deadlines, not after the 2 s call
    assert first.status_code == 504 and second.status_code == 504
    assert "request_timeout_s" in first.json()["message"]
    time.sleep(2.5)
    assert rr.calls == [["first"]]  # the second request timed out in the queue: never run


def test_health_reports_a_stuck_and_a_failing_backend(tiny_reranker: Any, live_server: Any) -> None:
    rr = Slow(tiny_reranker, delay=2.5)
    srv = live_server(create_app(rr, ServeSettings(request_timeout_s=0.5, max_wait_ms=0)))
    assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    threading.Thread(target=lambda: httpx.post(srv.url + "/rerank", json={"query": "q", "texts": DOCS}, timeout=30),
                     daemon=True).start()
    time.sleep(1.2)
    h = httpx.get(srv.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "stuck" and "request_timeout_s" in h.json()["reason"]
    time.sleep(2.0)
    assert httpx.get(srv.url + "/health").status_code == 200  # the call returned: ok again

    rr.delay, rr.fail = 0.0, True
    for i in range(3):
        assert httpx.post(srv.url + "/rerank", json={"query": f"q{i}", "texts": DOCS}).status_code == 500
    h = httpx.get(srv.url + "/health")
    assert h.status_code == 503 and h.json()["status"] == "failing" and "unreachable" in h.json()["reason"]
    rr.fail = False
    assert httpx.post(srv.url + "/rerank", json={"query": "again", "texts": DOCS}).status_code == 200
    assert httpx.get(srv.url + "/health").json()["status"] == "ok"


def test_a_bad_request_does_not_run_again_with_the_good_ones(tiny_reranker: Any, live_server: Any) -> None:
    rr = Slow(tiny_reranker)
    srv = live_server(create_app(rr, ServeSettings(max_batch_size=8, max_wait_ms=300)))
    queries = ["good one", "BOOM here", "good two", "good three"]

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            return list(await asyncio.gather(*(c.post("/rerank", json={"query": q, "texts": DOCS}) for q in queries)))

    for _ in range(2):
        codes = [r.status_code for r in asyncio.run(go())]
        assert codes == [200, 500, 200, 200]
    boom_calls = [c for c in rr.calls if any("BOOM" in q for q in c)]
    # first round: the batch of 4, then halves and quarters (3 calls hold BOOM); second round: refused at once
    assert len(boom_calls) == 3, rr.calls
    assert sorted(rr.calls[-1]) == ["good one", "good three", "good two"]  # the good ones, batched together


def test_api_key_is_stripped_and_compared_as_utf8(tiny_reranker: Any, live_server: Any) -> None:
    body = {"query": QUERY, "texts": DOCS}
    srv = live_server(create_app(tiny_reranker, ServeSettings(api_key="s3cret ")))
    assert httpx.post(srv.url + "/rerank", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    srv2 = live_server(create_app(tiny_reranker, ServeSettings(api_key="clé-ü-密钥")))
    utf8 = {"Authorization": "Bearer clé-ü-密钥".encode()}
    assert httpx.post(srv2.url + "/rerank", json=body, headers=utf8).status_code == 200
    latin1 = {"Authorization": "Bearer clé-ü".encode("latin-1")}
    assert httpx.post(srv2.url + "/rerank", json=body, headers=latin1).status_code == 401
    with pytest.raises(ValueError, match="api_key is empty"):
        ServeSettings(api_key="")


def test_health_shows_no_settings_or_secrets_without_the_key(tiny_reranker: Any, live_server: Any) -> None:
    import cohere

    name = "moi:http://alice:hunter2@10.0.0.5:8000/v1?api_key=s3cret"
    srv = live_server(create_app(tiny_reranker, ServeSettings(model_name=name, api_key="k")))
    open_view = httpx.get(srv.url + "/health")
    assert open_view.status_code == 200 and set(open_view.json()) == {"status", "queue_depth", "busy_seconds"}
    assert httpx.get(srv.url + "/health?detail=1").status_code == 401
    detail = httpx.get(srv.url + "/health?detail=1", headers={"Authorization": "Bearer k"}).text
    res = cohere.ClientV2(base_url=srv.url, api_key="k").rerank(model="m", query=QUERY, documents=DOCS)
    shown = detail + str(res.meta) + srv.app.state.settings.model_name
    assert "hunter2" not in shown and "s3cret" not in shown and "alice" not in shown
    assert "10.0.0.5:8000" in detail


@pytest.mark.slow
def test_sigterm_stops_ragkit_serve_while_a_backend_call_sleeps(tiny_lm_dir: Any, live_server: Any,
                                                                ragkit_serve: Any) -> None:
    """A generator server that answers 503 + ``Retry-After: 3600`` held ``ragkit serve`` until SIGKILL."""
    import os
    import signal
    import subprocess

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(request: Any) -> JSONResponse:
        return JSONResponse({"data": [{"id": str(tiny_lm_dir), "max_model_len": 512}]})

    async def completions(request: Any) -> JSONResponse:
        return JSONResponse({"error": "overloaded"}, status_code=503, headers={"Retry-After": "3600"})

    upstream = live_server(Starlette(routes=[Route("/v1/models", models),
                                             Route("/v1/completions", completions, methods=["POST"])]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAGKIT_NO_PROGRESS": "1"}
    env.pop("RAGKIT_API_KEY", None)
    proc, url = ragkit_serve(["--model", upstream.url.replace("http://", "http://bob:pa55word@") + "/v1",
                              "--log-level", "warning"], env=env, timeout=120)
    try:
        threading.Thread(target=lambda: httpx.post(url + "/rerank", json={"query": QUERY, "texts": DOCS},
                                                   timeout=60), daemon=True).start()
        time.sleep(2.0)  # the reranker thread now sleeps in a Retry-After wait
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("ragkit serve was still running 20 s after SIGTERM")
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert "pa55word" not in out and "Traceback" not in out, out[-2000:]


def test_a_large_request_is_ranked_in_slices_so_a_small_one_is_not_held(tiny_reranker: Any, live_server: Any) -> None:
    rr = Slow(tiny_reranker, per_doc=0.25)  # the time of a call grows with its documents, as a model's does
    settings = ServeSettings(max_batch_size=8, max_wait_ms=0, slice_documents=2, max_batch_documents=2)
    app = create_app(rr, settings)
    app.state.service.pointwise = True  # the wrapper scores each pair on its own, as the student inside it
    srv = live_server(app)
    docs = [f"{d} (copy {i})" for i in range(4) for d in DOCS]  # 12 documents: 6 slices of 2
    expected = tiny_reranker.rank(QUERY, docs)

    async def go() -> tuple[httpx.Response, httpx.Response, float, float]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            t0 = time.monotonic()
            big = asyncio.ensure_future(c.post("/rerank", json={"query": QUERY, "texts": docs, "raw_scores": True}))
            await asyncio.sleep(0.2)
            small = await c.post("/rerank", json={"query": "small", "texts": DOCS[:1]})
            t_small = time.monotonic() - t0
            big_r = await big
            return big_r, small, t_small, time.monotonic() - t0

    big, small, t_small, t_big = asyncio.run(go())
    assert big.status_code == 200 and small.status_code == 200
    assert t_small < 1.6 < t_big, (t_small, t_big)  # one slice (0.5 s) and its own call, not all 3 s
    assert [x["index"] for x in big.json()] == [int(i) for i in expected.ids()]  # slicing changes nothing
    assert [x["score"] for x in big.json()] == pytest.approx(expected.scores(), abs=1e-5)
    assert ["small"] in rr.calls[:3]
