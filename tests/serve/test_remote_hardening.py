"""``RemoteGenerator`` against hostile or broken completions servers on 127.0.0.1: no server can hold a
call, make it trust a bad answer, or read its credentials back to the user."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_remote_generator import PASSAGES, openai_app  # the same folder (rootdir-less imports)

from ragkit.generation import Generator
from ragkit.generation.remote import RemoteGenerator, RemoteServerError


def upstream(handler: Any) -> Any:
    """A Starlette app whose ``/v1/completions`` is ``handler(request, body, state)``; ``state`` counts calls."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.routing import Route

    state: dict[str, Any] = {"calls": 0, "headers": []}

    async def completions(request: Request) -> Any:
        state["calls"] += 1
        state["headers"].append(dict(request.headers))
        return await handler(request, await request.json(), state)

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    app.state.calls = state
    return app


def _json(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import Response

    return Response(json.dumps(obj, allow_nan=True), status_code=status, headers=headers,
                    media_type="application/json")


def _remote(url: str, tiny_lm_dir: Path, **kw: Any) -> RemoteGenerator:
    kw = {"model": "tiny", "max_length": 512, "tokenizer": str(tiny_lm_dir), "show_progress": False, **kw}
    return RemoteGenerator(url + "/v1", **kw)


def test_retry_after_is_capped_and_every_call_has_a_total_deadline(tiny_lm_dir: Path, live_server: Any) -> None:
    async def busy(request: Any, body: dict, state: dict) -> Any:
        return _json({"error": "busy"}, 503, {"Retry-After": "3600"})

    srv = live_server(upstream(busy))
    gen = _remote(srv.url, tiny_lm_dir, max_retries=2, max_retry_after=0.2)
    t0 = time.monotonic()
    with pytest.raises(RemoteServerError, match="after 3 tries.*HTTP 503"):
        gen.generate(["Question: x\nAnswer:"], max_new_tokens=4)
    assert time.monotonic() - t0 < 5  # two waits of 0.2 s, not 3600 s
    assert srv.app.state.calls["calls"] == 3

    patient = _remote(srv.url, tiny_lm_dir, max_retries=50, max_retry_after=100, deadline=1.0)
    t0 = time.monotonic()
    with pytest.raises(RemoteServerError, match="deadline"):
        patient.generate(["Question: x\nAnswer:"], max_new_tokens=4)
    assert time.monotonic() - t0 < 3


def test_a_server_that_trickles_bytes_is_cut_off_at_the_deadline(tiny_lm_dir: Path, live_server: Any) -> None:
    from starlette.responses import StreamingResponse

    async def trickle(request: Any, body: dict, state: dict) -> Any:
        async def drip() -> Any:
            yield b'{"choices": ['
            for _ in range(600):
                await asyncio.sleep(0.2)
                yield b" "
        return StreamingResponse(drip(), media_type="application/json")

    srv = live_server(upstream(trickle))
    gen = _remote(srv.url, tiny_lm_dir, timeout=10.0, deadline=1.5, max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(RemoteServerError, match="deadline"):
        gen.generate(["Question: x\nAnswer:"], max_new_tokens=4)
    assert time.monotonic() - t0 < 4  # each read returns within httpx's 10 s; the whole call does not


def test_a_transient_503_on_the_first_scoring_call_keeps_token_prompts(local: Generator, tiny_lm_dir: Path,
                                                                        live_server: Any) -> None:
    srv = live_server(openai_app(local, fail_first=1))
    prompt = local.build_prompt("Which city is the capital of France?", PASSAGES)
    gen = _remote(srv.url, tiny_lm_dir, backoff=0.01)
    assert np.allclose(gen.score([prompt], ["Paris"]).sum, local.score([prompt], ["Paris"]).sum, atol=1e-4)
    assert gen.prompt_format == "tokens"  # the 503 was retried, not read as "token ids refused"

    srv2 = live_server(openai_app(local, fail_first=1))
    once = _remote(srv2.url, tiny_lm_dir, max_retries=0)
    with pytest.raises(RemoteServerError, match="503"):
        once.score([prompt], ["Paris"])
    assert once.prompt_format == "auto"
    once.score([prompt], ["Paris"])
    assert once.prompt_format == "tokens"


@pytest.fixture(scope="module")
def local(tiny_lm_dir: Path) -> Generator:
    return Generator(model=str(tiny_lm_dir), device="cpu", max_length=512, show_progress=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.7])
def test_non_finite_or_positive_log_probs_are_refused(tiny_lm_dir: Path, live_server: Any, bad: float) -> None:
    async def echo(request: Any, body: dict, state: dict) -> Any:
        ids = body["prompt"]
        vals = [None] + [-0.5] * (len(ids) - 2) + [bad, -0.1]  # the answer's last token is `bad`
        return _json({"choices": [{"index": 0, "text": "", "logprobs": {"token_logprobs": vals}}]})

    srv = live_server(upstream(echo))
    gen = _remote(srv.url, tiny_lm_dir, prompt_format="tokens", score_mode="echo")
    with pytest.raises(RemoteServerError, match="log-prob.*finite number <= 0"):
        gen.score(["Question: Which city?\nAnswer:"], ["Paris"])


@pytest.mark.parametrize(("text", "match"), [("x" * 10_000_000, "characters.*32 tokens were asked"),
                                             ({"answer": "Paris"}, "dict as the text")], ids=["10MB", "object"])
def test_a_completion_must_be_a_string_within_its_token_budget(tiny_lm_dir: Path, live_server: Any, text: Any,
                                                               match: str) -> None:
    async def complete(request: Any, body: dict, state: dict) -> Any:
        return _json({"choices": [{"index": 0, "text": text, "finish_reason": "length"}]})

    srv = live_server(upstream(complete))
    gen = _remote(srv.url, tiny_lm_dir)
    with pytest.raises(RemoteServerError, match=match):
        gen.generate(["Question: x\nAnswer:"], max_new_tokens=32)


def test_a_gzip_bomb_is_decompressed_only_up_to_the_bound(tiny_lm_dir: Path, live_server: Any) -> None:
    from starlette.responses import Response

    inner = b'{"choices": [{"index": 0, "text": "' + b"0" * 40_000_000 + b'"}]}'
    bomb = gzip.compress(inner, compresslevel=9)
    assert len(bomb) < 100_000

    async def complete(request: Any, body: dict, state: dict) -> Any:
        return Response(bomb, headers={"Content-Encoding": "gzip"}, media_type="application/json")

    srv = live_server(upstream(complete))
    gen = _remote(srv.url, tiny_lm_dir, max_response_bytes=2**20)
    with pytest.raises(RemoteServerError, match="max_response_bytes"):
        gen.generate(["Question: x\nAnswer:"], max_new_tokens=32)
    small = gzip.compress(b'{"choices": [{"index": 0, "text": " Paris"}]}')

    async def fine(request: Any, body: dict, state: dict) -> Any:
        return Response(small, headers={"Content-Encoding": "gzip"}, media_type="application/json")

    srv2 = live_server(upstream(fine))
    assert _remote(srv2.url, tiny_lm_dir).generate(["Q:"], max_new_tokens=4) == [" Paris"]

    async def broken(request: Any, body: dict, state: dict) -> Any:
        return Response(b"not gzip at all", headers={"Content-Encoding": "gzip"}, media_type="application/json")

    srv3 = live_server(upstream(broken))
    with pytest.raises(RemoteServerError, match="does not decompress"):
        _remote(srv3.url, tiny_lm_dir).generate(["Q:"], max_new_tokens=4)


def test_credentials_in_the_url_reach_the_server_but_are_never_shown(tiny_lm_dir: Path, live_server: Any,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    async def fail(request: Any, body: dict, state: dict) -> Any:
        return _json({"error": "boom"}, 500)

    srv = live_server(upstream(fail))
    url = srv.url.replace("http://", "http://alice:hunter2@") + "/v1?api_key=s3cret"
    gen = RemoteGenerator(url, model="tiny", max_length=512, tokenizer=str(tiny_lm_dir), max_retries=1, backoff=0,
                          show_progress=False)
    with caplog.at_level("INFO"), pytest.raises(RemoteServerError) as e:
        gen.generate(["Q:"], max_new_tokens=4)
    shown = str(e.value) + repr(gen) + gen.base_url + caplog.text
    assert "hunter2" not in shown and "s3cret" not in shown and "alice" not in shown
    assert "127.0.0.1" in str(e.value)
    assert srv.app.state.calls["headers"][0]["authorization"].startswith("Basic ")  # still sent to the server
