"""``ragkit serve``: a reranker behind Cohere (``/v1/rerank``) and TEI (``/rerank``) endpoints."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from ragkit.cli._common import non_negative_float, non_negative_int, positive_float, positive_int, set_requirements

__all__ = ["register", "build_reranker"]

logger = logging.getLogger(__name__)


def build_reranker(spec: str, model: str | None = None, device: str = "auto",
                   backend_deadline: float | None = None, backend: str = "torch") -> Any:
    """A reranker from a spec through :func:`ragkit.debias.get_reranker`.

    ``moi`` (and the other MoI presets) run on the generator ``model``: a local model, or an
    OpenAI-compatible server URL such as ``http://HOST:PORT/v1`` (through
    :func:`ragkit.generation.load_generator`; ``backend_deadline`` bounds each of its HTTP calls,
    retries and waits included: the server passes its request deadline, past which the answer
    would be thrown away); ``student:DIR`` and ``cross-encoder:NAME`` load an encoder on ``device``
    and ``backend`` (``torch``, ``onnx``, ``onnx-int8``, ``openvino``); ``llm:MODEL`` a causal LM on ``device``.
    """
    from ragkit.debias import get_reranker
    from ragkit.debias.presets import parse_reranker

    parse_reranker(spec)  # a typo is reported before any model loads
    kind = spec.partition(":")[0]
    if kind.startswith("moi"):
        from ragkit.generation import load_generator
        from ragkit.generation.remote import is_server_url

        extra = {"deadline": backend_deadline} if backend_deadline is not None and is_server_url(model) else {}
        return get_reranker(spec, generator=load_generator(model, device=device, **extra))
    if kind in ("student", "cross-encoder"):  # a bi-encoder student takes no backend: pass it only when asked
        return get_reranker(spec, device=device, **({"backend": backend} if backend != "torch" else {}))
    if backend != "torch":
        raise ValueError(f"--backend {backend} applies to student: and cross-encoder: rerankers, not {spec!r}")
    if kind == "llm":
        return get_reranker(spec, device=device)
    return get_reranker(spec)


def _long_docs(args: argparse.Namespace) -> Any:
    """The :class:`~ragkit.debias.long_docs.LongDocs` of the command line (``None`` when no flag is given)."""
    from ragkit.debias.long_docs import LongDocs

    flags = (args.max_tokens_per_doc, args.chunking, args.chunk_tokens, args.chunk_stride)
    if all(v is None for v in flags) and args.truncation_side == "right":
        return None
    return LongDocs(max_tokens_per_doc=args.max_tokens_per_doc, truncation_side=args.truncation_side,
                    chunking=args.chunking, chunk_tokens=args.chunk_tokens, chunk_stride=args.chunk_stride)


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from ``--api-key`` or ``$RAGKIT_API_KEY``, stripped; an empty one is an error, never "no auth"."""
    if args.no_auth:
        if args.api_key is not None:
            raise ValueError("--no-auth and --api-key contradict each other; pass one of them")
        return None
    for given, where in ((args.api_key, "--api-key"), (os.environ.get("RAGKIT_API_KEY"), "RAGKIT_API_KEY")):
        if given is None:
            continue
        if not given.strip():
            raise ValueError(f"{where} is empty, which would serve without authentication; pass a non-empty key, "
                             "or --no-auth to serve without one on purpose")
        return given.strip()
    return None


def _serve(args: argparse.Namespace) -> int:
    from ragkit.serve import ServeSettings, create_app, run

    api_key = _api_key(args)
    settings = ServeSettings(max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                             max_queue=args.max_queue, max_documents=args.max_documents,
                             max_chars=args.max_chars, max_request_chars=args.max_request_chars,
                             request_timeout_s=args.request_timeout, max_batch_tokens=args.max_batch_tokens,
                             forward_cost_tokens=args.forward_cost_tokens, api_key=api_key,
                             long_docs=_long_docs(args), cache_size=args.cache_size,
                             effect_threshold=args.effect_threshold,
                             model_name=args.reranker if args.reranker != "moi" else f"moi:{args.model or 'default'}")
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        logger.warning("serving on %s without an API key; anyone who reaches the port can use it "
                       "(set --api-key or RAGKIT_API_KEY)", args.host)
    reranker = build_reranker(args.reranker, args.model, args.device, backend_deadline=settings.request_timeout_s,
                              backend=args.backend)
    if args.calibration is not None:
        from ragkit.debias.calibration import PlattCalibration

        reranker.calibration = PlattCalibration.load(args.calibration)
    app = create_app(reranker, settings)
    print(f"ragkit serve: {settings.model_name} on http://{args.host}:{args.port} "
          "(POST /v1/rerank, /v2/rerank, /rerank, /v1/attribute; GET /health, /metrics)", flush=True)
    run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _port(s: str) -> int:
    """``argparse`` type: a TCP port number 0-65535 (refused before any model loads)."""
    v = non_negative_int(s)
    if v > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535, got {v}")
    return v


def _wait_ms(s: str) -> float:
    """``argparse`` type: a finite number of milliseconds, 0-60000 (``inf`` and ``nan`` are refused)."""
    v = non_negative_float(s)
    if v > 60_000:
        raise argparse.ArgumentTypeError(f"must be at most 60000 ms, got {s}")
    return v


def _timeout_s(s: str) -> float:
    """``argparse`` type: a finite number of seconds, > 0 and at most a day."""
    v = positive_float(s)
    if v > 86_400:
        raise argparse.ArgumentTypeError(f"must be at most 86400 s, got {s}")
    return v


def register(subparsers: Any) -> None:
    """Add the ``serve`` command."""
    p = subparsers.add_parser(
        "serve", help="serve a reranker over HTTP (Cohere /v1/rerank, TEI /rerank, /health, /metrics)",
        description="Serve a ragkit reranker over HTTP with Cohere- and TEI-compatible rerank endpoints; "
                    "concurrent requests are micro-batched. Needs `pip install 'ragkit[serve]'`.")
    p.add_argument("--reranker", default="moi",
                   help="moi (MoI over --model: leave-one-out with the question's likelihood, k + 1 sequences "
                        "per request), another MoI preset (moi_cyclic, moi_prior, ...), student:DIR (a distilled "
                        "student), cross-encoder:NAME or llm:MODEL (yes/no relevance of a causal LM; default: moi)")
    p.add_argument("--model", default=None,
                   help="generator for moi: local model / hub id / .gguf, or an OpenAI-compatible server URL "
                        "http://HOST:PORT/v1 (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="auto")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8080, help="TCP port, 0-65535 (0: any free port; default 8080)")
    p.add_argument("--max-batch-size", type=positive_int, default=32, help="most requests per reranker call (32)")
    p.add_argument("--max-wait-ms", type=_wait_ms, default=5.0,
                   help="how long a request waits for batch-mates before its batch runs, 0-60000 (5 ms)")
    p.add_argument("--max-queue", type=positive_int, default=256,
                   help="most waiting requests; more get 503 + Retry-After (256)")
    p.add_argument("--max-documents", type=positive_int, default=1000,
                   help="most documents per request (1000; more: 413)")
    p.add_argument("--max-chars", type=positive_int, default=20_000,
                   help="most characters in the query (20000; more: 413); sizes the body limit. Longer documents "
                        "are read by the long-document flags and counted in meta.truncated/chunked")
    p.add_argument("--max-request-chars", type=positive_int, default=1_000_000,
                   help="per-request work budget: most characters of (query, document) pairs, the query counted "
                        "once per document (1000000; more: 413)")
    p.add_argument("--request-timeout", type=_timeout_s, default=60.0,
                   help="seconds a request may wait for its answer, queueing included (60; later: 504); /health "
                        "reports a reranker call running longer as stuck")
    p.add_argument("--max-batch-tokens", type=positive_int, default=4096,
                   help="cross-encoder rerankers: most padded tokens per encoder forward (4096)")
    p.add_argument("--forward-cost-tokens", type=non_negative_int, default=128,
                   help="cross-encoder rerankers: a forward's fixed cost in padded tokens, traded against padding "
                        "when merged pairs are cut into length buckets (128; 0: bucket as finely as padding asks)")
    p.add_argument("--backend", default="torch", choices=("torch", "onnx", "onnx-int8", "openvino"),
                   help="student:/cross-encoder: encoder backend: torch, onnx (ONNX Runtime), onnx-int8 (int8 "
                        "dynamic quantisation; both need `pip install 'ragkit[onnx]'`) or openvino (the fp32 ONNX "
                        "graph compiled by OpenVINO; `pip install 'ragkit[openvino]'`); exported once and cached")
    p.add_argument("--max-tokens-per-doc", type=positive_int, default=None,
                   help="pointwise rerankers: most document tokens read (default: the encoder's budget)")
    p.add_argument("--truncation-side", default="right", choices=("right", "left"),
                   help="which end of a long document is dropped: right keeps the beginning (default), left the end")
    p.add_argument("--chunking", default=None, choices=("max", "first"),
                   help="score long documents as chunks: max (best chunk) or first (first chunk); default: truncate")
    p.add_argument("--chunk-tokens", type=positive_int, default=None,
                   help="document tokens per chunk (default: the encoder's budget given the query)")
    p.add_argument("--chunk-stride", type=positive_int, default=None,
                   help="tokens between chunk starts (default: 3/4 of the chunk size)")
    p.add_argument("--cache-size", type=non_negative_int, default=10_000,
                   help="pointwise rerankers: most (query, document) scores in the LRU cache (10000; 0: off)")
    p.add_argument("--effect-threshold", type=non_negative_float, default=0.05,
                   help="MoI: a document helps above +T utility, hurts below -T, else is neutral (0.05)")
    p.add_argument("--calibration", default=None,
                   help="a ragkit_calibration.json (Platt scaling) for relevance_score (default: the one in the "
                        "student folder, if any; else sigmoid of the raw score)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` (default: $RAGKIT_API_KEY; unset: no auth; an empty "
                        "key is refused)")
    p.add_argument("--no-auth", action="store_true",
                   help="serve without an API key even when RAGKIT_API_KEY is set")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_serve)
    set_requirements(p, lambda a: [(["starlette", "uvicorn", "prometheus_client", "pydantic"], "ragkit serve")]
                     + ([(["httpx"], "ragkit serve --model URL")] if str(a.model or "").startswith("http") else []))
