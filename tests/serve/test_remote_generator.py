"""``RemoteGenerator`` against a real OpenAI-compatible completions server on 127.0.0.1.

The server here is a small Starlette app that implements ``/v1/models`` and ``/v1/completions``
(echo + logprobs, text or token-id prompts, lists of prompts) on top of the tiny random Llama
run in-process, so remote and local log-probs must agree to float precision. The llama.cpp
server check is in ``test_remote_llamacpp.py`` (slow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragkit.generation import Generator
from ragkit.generation.fitting import encode_answers
from ragkit.generation.loading import load_generator
from ragkit.generation.remote import RemoteGenerator, RemoteServerError
from ragkit.types import Passage

PASSAGES = [Passage("1", "Paris is the capital of France.", "Paris"),
            Passage("2", "The quick brown fox jumps over the lazy dog.", "Fox"),
            Passage("3", "Arthur's Magazine was published in Philadelphia.", "Arthur")]


def openai_app(gen: Generator, *, lists: bool = True, tokens: bool = True, logprobs: bool = True,
               fail_first: int = 0, misaligned: bool = False) -> Any:
    """An OpenAI-style completions server over a local generator (what vLLM / llama.cpp answer).

    ``misaligned``: echo like llama-cpp-python's server 0.3 (each token scored under the distribution
    that follows it, no entry for the generated token) and honour a GBNF ``root ::= "literal"`` grammar
    by forcing the literal's tokens (its generated-token log-probs are correct, as llama.cpp's are).
    """
    import torch
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    tok, model = gen.tokenizer, gen.model
    state: dict[str, Any] = {"calls": 0, "sizes": []}

    def echo(prompt: str | list[int]) -> dict[str, Any]:
        if isinstance(prompt, str):
            enc = tok(prompt, add_special_tokens=False, return_offsets_mapping=True)
            ids, offs = list(enc["input_ids"]), [s for s, _ in enc["offset_mapping"]]
            text = prompt
        else:
            ids, text = list(prompt), tok.decode(prompt)
            offs = None
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        if misaligned:
            vals = [None] + [float(lp[t, ids[t]]) for t in range(1, len(ids))]
            return {"text": text, "logprobs": {"tokens": [tok.decode([t]) for t in ids], "token_logprobs": vals,
                                               "text_offset": offs or list(range(len(ids)))}}
        vals = [None] + [float(lp[t - 1, ids[t]]) for t in range(1, len(ids))]
        nxt = int(lp[-1].argmax())
        vals.append(float(lp[-1, nxt]))
        out: dict[str, Any] = {"tokens": [tok.decode([t]) for t in ids + [nxt]], "token_logprobs": vals}
        if offs is not None:
            out["text_offset"] = offs + [len(text)]
        return {"text": text + tok.decode([nxt]), "logprobs": out if logprobs else None}

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "max_model_len": gen.max_length}]})

    async def completions(request: Request) -> JSONResponse:
        state["calls"] += 1
        if state["calls"] <= fail_first:
            return JSONResponse({"error": "warming up"}, status_code=503, headers={"Retry-After": "0"})
        body = await request.json()
        p = body["prompt"]
        prompts = [p] if isinstance(p, str) or (p and isinstance(p[0], int)) else list(p)
        if not tokens and any(not isinstance(x, str) for x in prompts):
            return JSONResponse({"detail": "prompt must be a string"}, status_code=422)
        if not lists:
            prompts = prompts[:1]  # llama-cpp-python's server: one prompt per request
        state["sizes"].append(len(prompts))
        n = int(body.get("n", 1))
        choices = []
        for i, pr in enumerate(prompts):
            if body.get("grammar") and misaligned:
                literal = json.loads(body["grammar"].split("::=", 1)[1].strip())
                p_ids, a_ids = encode_answers(tok, [pr], [literal])
                ids = p_ids[0] + a_ids[0]
                with torch.inference_mode():
                    lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
                n0 = len(p_ids[0])
                vals = [float(lp[n0 + t - 1, a]) for t, a in enumerate(a_ids[0])]
                choices.append({"index": i, "text": literal, "finish_reason": "stop",
                                "logprobs": {"tokens": [tok.decode([a]) for a in a_ids[0]], "token_logprobs": vals}})
                continue
            if body.get("echo"):
                choices.append({"index": i, "finish_reason": "length", **echo(pr)})
                continue
            outs = gen.generate([pr], max_new_tokens=body["max_tokens"], stop=body.get("stop"),
                                temperature=body.get("temperature", 0.0), n=n, seed=body.get("seed", 0),
                                min_new_tokens=body.get("min_tokens", 0))
            texts = outs if n == 1 else outs[0]
            choices += [{"index": i * n + j, "text": t, "finish_reason": "stop"} for j, t in enumerate(texts)]
        return JSONResponse({"id": "cmpl", "object": "text_completion", "model": "tiny", "choices": choices})

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])
    app.state.calls = state
    return app


@pytest.fixture(scope="module")
def local(tiny_lm_dir: Path) -> Generator:
    return Generator(model=str(tiny_lm_dir), device="cpu", max_length=512, show_progress=False)


def _questions(gen: Any) -> tuple[list[str], list[str]]:
    prompts = [gen.build_prompt("Which city is the capital of France?", PASSAGES),
               gen.build_prompt("Where was Arthur's Magazine published?", PASSAGES[::-1]),
               gen.build_prompt("What jumps over the dog?", PASSAGES[1:])]
    return prompts, ["Paris", "Philadelphia", "the quick brown fox"]


@pytest.mark.parametrize("fmt", ["tokens", "text"])
def test_remote_scores_equal_local(local: Generator, tiny_lm_dir: Path, live_server: Any, fmt: str) -> None:
    srv = live_server(openai_app(local))
    remote = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), batch_size=2, prompt_format=fmt,
                             show_progress=False)
    assert remote.name == "tiny" and remote.max_length == local.max_length and remote.model is None
    prompts, answers = _questions(local)
    assert _questions(remote)[0] == prompts  # same templates, same passage fitting
    want, got = local.score(prompts, answers), remote.score(prompts, answers)
    assert list(got.num_tokens) == list(want.num_tokens)
    assert np.allclose(got.sum, want.sum, atol=1e-4), (got.sum, want.sum)
    for a, b in zip(got.token_logprobs, want.token_logprobs):
        assert np.allclose(a, b, atol=1e-4)
    orders = [[[0, 1, 2], [2, 0, 1], [1, 2, 0]], [[1, 0], [0, 1]]]
    qs, ps, ans = ["capital of France?", "magazine?"], [PASSAGES, PASSAGES[1:]], ["Paris", ["Arthur", "Fox"]]
    for r, w in zip(remote.score_orderings(qs, ps, orders, ans), local.score_orderings(qs, ps, orders, ans)):
        assert np.allclose(r.sum, w.sum, atol=1e-4)
    assert max(srv.app.state.calls["sizes"]) == 2  # two prompts per request after the one-prompt probe
    remote.close()


def test_remote_generation_and_answers(local: Generator, tiny_lm_dir: Path, live_server: Any) -> None:
    srv = live_server(openai_app(local))
    remote = load_generator(srv.url, tokenizer=str(tiny_lm_dir), device="cpu", show_progress=False)
    assert isinstance(remote, RemoteGenerator) and remote.base_url == srv.url + "/v1"
    prompts, _ = _questions(local)
    assert remote.generate(prompts, max_new_tokens=6) == local.generate(prompts, max_new_tokens=6)
    qs = ["capital of France?", "who?"]
    assert remote.answer(qs, [PASSAGES, PASSAGES[:1]], max_new_tokens=5) == \
        local.answer(qs, [PASSAGES, PASSAGES[:1]], max_new_tokens=5)
    sampled = remote.generate(prompts[:1], max_new_tokens=4, temperature=1.0, n=3, seed=1)
    assert len(sampled) == 1 and len(sampled[0]) == 3
    with pytest.raises(ValueError, match="max_new_tokens"):
        remote.generate(prompts, max_new_tokens=0)


def test_one_prompt_servers_and_text_only_servers(local: Generator, tiny_lm_dir: Path, live_server: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    srv = live_server(openai_app(local, lists=False, tokens=False))
    remote = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), batch_size=4, show_progress=False)
    prompts, answers = _questions(local)
    with caplog.at_level("WARNING"):
        got = remote.score(prompts, answers)
    assert np.allclose(got.sum, local.score(prompts, answers).sum, atol=1e-4)
    assert remote.prompt_format == "text" and remote._per_request == 1
    assert "one prompt per request" in caplog.text and "token-id prompts" in caplog.text
    assert remote.generate(prompts, max_new_tokens=3) == local.generate(prompts, max_new_tokens=3)


def test_retries_and_clear_errors(local: Generator, tiny_lm_dir: Path, live_server: Any) -> None:
    srv = live_server(openai_app(local, fail_first=2))
    remote = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), backoff=0.01, show_progress=False)
    prompts, answers = _questions(local)
    assert np.allclose(remote.score(prompts[:1], answers[:1]).sum, local.score(prompts[:1], answers[:1]).sum,
                       atol=1e-4)
    assert srv.app.state.calls["calls"] == 4  # two 503s, the echo probe, then the answer

    srv2 = live_server(openai_app(local, fail_first=100))
    impatient = RemoteGenerator(srv2.url + "/v1", model="tiny", max_length=512, tokenizer=str(tiny_lm_dir),
                                max_retries=2, backoff=0.01, show_progress=False)
    with pytest.raises(RemoteServerError, match="after 3 tries.*HTTP 503"):
        impatient.score(prompts[:1], answers[:1])

    srv3 = live_server(openai_app(local, logprobs=False))
    blind = RemoteGenerator(srv3.url + "/v1", tokenizer=str(tiny_lm_dir), show_progress=False)
    with pytest.raises(RemoteServerError, match="no prompt log-probs.*logits_all"):
        blind.score(prompts[:1], answers[:1])

    with pytest.raises(ValueError, match="tokenizer"):
        RemoteGenerator(srv.url, tokenizer=str(tiny_lm_dir / "missing"))
    with pytest.raises(ValueError, match="http"):
        RemoteGenerator("localhost:8000")
    with pytest.raises(RemoteServerError, match="tries"):
        RemoteGenerator("http://127.0.0.1:9/v1", model="m", max_length=512, tokenizer=str(tiny_lm_dir),
                        max_retries=1, backoff=0.0).score(prompts[:1], answers[:1])
    with pytest.raises(ValueError, match="tokenizer.*only apply to a server URL"):
        load_generator(str(tiny_lm_dir), tokenizer="x")
    with pytest.raises(ValueError, match="answer 0"):
        remote.score(prompts[:1], [" "])


def test_misaligned_echo_is_detected_and_scored_by_forced_decoding(local: Generator, tiny_lm_dir: Path,
                                                                   live_server: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    srv = live_server(openai_app(local, lists=False, tokens=False, misaligned=True))
    prompts, answers = _questions(local)
    strict = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), score_mode="echo", show_progress=False)
    with pytest.raises(RemoteServerError, match="misaligned.*llama-cpp-python"):
        strict.score(prompts, answers)
    remote = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), show_progress=False)
    with caplog.at_level("WARNING"):
        got = remote.score(prompts, answers)
    assert remote.score_mode == "forced" and "forced" in caplog.text
    want = local.score(prompts, answers)
    assert np.allclose(got.sum, want.sum, atol=1e-4) and list(got.num_tokens) == list(want.num_tokens)
    with pytest.raises(ValueError, match="score_mode"):
        RemoteGenerator(srv.url, tokenizer=str(tiny_lm_dir), score_mode="magic")


@pytest.mark.parametrize("kw", [{"design": "cyclic", "outcome": "consensus", "max_new_tokens": 3},
                                {"max_new_tokens": 3, "fallback": False}],  # the default: loo + question
                         ids=["cyclic-consensus", "default"])
def test_moi_runs_unchanged_on_the_remote_generator(local: Generator, tiny_lm_dir: Path, live_server: Any,
                                                    kw: dict[str, Any]) -> None:
    from ragkit.debias import MoIReranker

    srv = live_server(openai_app(local))
    remote = RemoteGenerator(srv.url + "/v1", tokenizer=str(tiny_lm_dir), show_progress=False)
    qs = ["Which city is the capital of France?", "Where was Arthur's Magazine published?"]
    want = MoIReranker(local, **kw).rank_many(qs, [PASSAGES, PASSAGES])
    got = MoIReranker(remote, **kw).rank_many(qs, [PASSAGES, PASSAGES])
    for g, w in zip(got, want):
        assert g.ids() == w.ids()
        assert np.allclose(g.scores(), w.scores(), atol=1e-3)
    assert np.ptp(want[0].scores()) > 0  # real utilities, not a tie
