"""The ``ragkit serve`` HTTP app: Cohere- and TEI-compatible rerank endpoints over any ragkit reranker.

Endpoints
---------
``POST /v1/rerank`` and ``POST /v2/rerank`` (Cohere)
    ``{"query": str, "documents": [str | {"text": str}], "top_n"?: int, "return_documents"?: bool,
    "model"?: str}`` -> ``{"id", "results": [{"index", "relevance_score"}], "meta"}``, best first.
``POST /rerank`` (Hugging Face text-embeddings-inference)
    ``{"query": str, "texts": [str], "raw_scores"?: bool, "return_text"?: bool}`` ->
    ``[{"index", "score"}]``, best first.
``GET /health``
    200 ``{"status": "ok", ...}`` while the batching loop runs, else 503.
``GET /metrics``
    Prometheus text format (requests by endpoint and status, latency, batch sizes, queue depth).

Scores: the reranker's raw score ``s`` is reported as ``sigmoid(s) = 1 / (1 + exp(-s))`` (Cohere's
``relevance_score`` lies in [0, 1]; TEI applies the same unless ``raw_scores``); the order is the
reranker's order either way. Concurrent requests are micro-batched into one ``rank_many`` call
(:class:`ragkit.serve.MicroBatcher`); a cross-encoder reranker (the distilled student) then scores
each distinct pair of the merged batch once, in length-bucketed encoder batches
(:class:`ragkit.debias.cross_encoder.CrossEncoderReranker`; ``ServeSettings.max_batch_tokens`` and
``forward_cost_tokens`` configure it).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.serve.batcher import MicroBatcher, QueueFullError
from ragkit.serve.settings import ServeSettings
from ragkit.types import Passage, RankedList

__all__ = ["create_app", "RequestError"]

logger = logging.getLogger(__name__)


class RequestError(Exception):
    """A refused request: HTTP ``status`` and the ``field`` at fault."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _need_serve_deps() -> None:
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"ragkit serve needs starlette, uvicorn and prometheus-client ({e.name} is missing); "
            "install them with `pip install 'ragkit[serve]'`"
        ) from e


# ----------------------------------------------------------------------------- validation
def _check_text(value: Any, field: str, settings: ServeSettings) -> str:
    if not isinstance(value, str):
        raise RequestError(422, field, f"`{field}` must be a string, got {type(value).__name__}")
    if not value.strip():
        raise RequestError(422, field, f"`{field}` is empty; send non-empty text")
    if len(value) > settings.max_chars:
        raise RequestError(413, field, f"`{field}` has {len(value)} characters, more than the server's limit of "
                                       f"{settings.max_chars} (max_chars); shorten it or split it")
    return value


def _check_bool(body: dict[str, Any], field: str, default: bool) -> bool:
    v = body.get(field, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise RequestError(422, field, f"`{field}` must be true or false, got {v!r}")
    return v


def _check_documents(body: dict[str, Any], field: str, settings: ServeSettings) -> list[str]:
    if field not in body:
        raise RequestError(422, field, f"`{field}` is missing; send a list of texts")
    docs = body[field]
    if not isinstance(docs, list):
        raise RequestError(422, field, f"`{field}` must be a list, got {type(docs).__name__}")
    if not docs:
        raise RequestError(422, field, f"`{field}` is empty; send at least one text")
    if len(docs) > settings.max_documents:
        raise RequestError(413, field, f"`{field}` has {len(docs)} entries, more than the server's limit of "
                                       f"{settings.max_documents} (max_documents); send fewer per request")
    out = []
    for i, d in enumerate(docs):
        name = f"{field}[{i}]"
        if isinstance(d, dict):
            if "text" not in d:
                raise RequestError(422, name, f"`{name}` is an object without a `text` string")
            d, name = d["text"], f"{name}.text"
        out.append(_check_text(d, name, settings))
    return out


class _Metrics:
    """Prometheus metrics in a registry of their own (several apps may live in one process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("ragkit_requests_total", "Requests by endpoint and HTTP status",
                                ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("ragkit_request_seconds", "Request latency (seconds) by endpoint", ["endpoint"],
                                 registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.documents = Counter("ragkit_documents_total", "Documents reranked", registry=self.registry)
        self.batch_size = Histogram("ragkit_batch_size", "Requests per reranker call", registry=self.registry,
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.batch_seconds = Histogram("ragkit_batch_seconds", "Seconds per reranker call", registry=self.registry,
                                       buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.queue = Gauge("ragkit_queue_depth", "Requests waiting for the reranker", registry=self.registry)

    def on_batch(self, n: int, seconds: float) -> None:
        self.batch_size.observe(n)
        self.batch_seconds.observe(seconds)


def _rank_fn(reranker: Any, settings: ServeSettings) -> Callable[[list[str], list[list[Passage]]], list[RankedList]]:
    """The batch function: ``reranker.rank_many``; a cross-encoder gets the settings' length bucketing."""
    if not callable(getattr(reranker, "rank_many", None)):
        raise TypeError(f"{type(reranker).__name__} has no rank_many(queries, passage_lists); "
                        "pass a ragkit.reranking.Reranker")
    if isinstance(reranker, CrossEncoderReranker):
        reranker.max_batch_tokens = settings.max_batch_tokens
        reranker.forward_cost_tokens = settings.forward_cost_tokens

    def fn(queries: list[str], passages: list[list[Passage]]) -> list[RankedList]:
        return list(reranker.rank_many(queries, passages))

    return fn


# ----------------------------------------------------------------------------- app
def create_app(reranker: Any, settings: ServeSettings | None = None) -> Any:
    """The Starlette app serving ``reranker`` (any object with ``rank_many``, e.g. a ragkit Reranker).

    Parameters
    ----------
    reranker
        ``MoIReranker``, ``DistilledReranker``, a cross-encoder reranker, ... A
        :class:`~ragkit.debias.cross_encoder.CrossEncoderReranker` (the student included) is set
        to the settings' ``max_batch_tokens`` and ``forward_cost_tokens``.
    settings
        Batching, limits and auth (default :class:`ServeSettings`).

    Returns
    -------
    starlette.applications.Starlette
        Run it with ``uvicorn.run(app, host=..., port=...)``; ``app.state.batcher`` is the
        :class:`MicroBatcher`.
    """
    _need_serve_deps()
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    settings = settings or ServeSettings()
    metrics = _Metrics()
    rank_fn = _rank_fn(reranker, settings)
    batcher = MicroBatcher(rank_fn, settings.max_batch_size, settings.max_wait_ms,
                           settings.max_queue, on_batch=metrics.on_batch)

    def error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None,
              kind: str = "Validation") -> JSONResponse:
        body = {"message": message, "error": message, "error_type": kind}
        if field:
            body["field"] = field
        return JSONResponse(body, status_code=status, headers=headers)

    def authorised(request: Request) -> bool:
        if settings.api_key is None:
            return True
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), settings.api_key.encode())

    async def read_body(request: Request) -> dict[str, Any]:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            raise RequestError(413, "body", f"the request `body` has {length} bytes, more than the server's limit "
                                            f"of {settings.max_body_bytes}; send fewer or shorter documents")
        raw = await request.body()
        if len(raw) > settings.max_body_bytes:
            raise RequestError(413, "body", f"the request `body` has {len(raw)} bytes, more than the server's "
                                            f"limit of {settings.max_body_bytes}")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(422, "body", f"the request `body` is not valid JSON ({e})") from e
        if not isinstance(body, dict):
            raise RequestError(422, "body", f"the request `body` must be a JSON object, got {type(body).__name__}")
        return body

    async def rerank(request: Request, endpoint: str,
                     parse: Callable[[dict[str, Any]], tuple[str, list[str], dict[str, Any]]],
                     render: Callable[[RankedList, list[str], dict[str, Any]], Any]) -> Response:
        t0 = time.perf_counter()
        status = 500
        try:
            if not authorised(request):
                status = 401
                return error(401, "missing or wrong API key; send `Authorization: Bearer <key>`", "authorization",
                             headers={"WWW-Authenticate": "Bearer"}, kind="Unauthorized")
            try:
                body = await read_body(request)
                query, docs, opts = parse(body)
            except RequestError as e:
                status = e.status
                return error(e.status, e.message, e.field)
            passages = [Passage(id=str(i), text=d) for i, d in enumerate(docs)]
            metrics.queue.set(batcher.depth)
            try:
                ranked = await batcher.submit(query, passages)
            except QueueFullError as e:
                status = 503
                return error(503, f"the server is overloaded ({e}); retry after {settings.retry_after_s} s",
                             headers={"Retry-After": str(settings.retry_after_s)}, kind="Overloaded")
            except Exception as e:  # noqa: BLE001 - the model failed for this request only
                status = 500
                return error(500, f"the reranker failed on this request: {type(e).__name__}: {e}", kind="Backend")
            metrics.documents.inc(len(docs))
            status = 200
            return JSONResponse(render(ranked, docs, opts))
        finally:
            metrics.queue.set(batcher.depth)
            metrics.requests.labels(endpoint, str(status)).inc()
            metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)

    # ---------------------------------------------------------------- Cohere
    def parse_cohere(body: dict[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
        if "query" not in body:
            raise RequestError(422, "query", "`query` is missing; send the search query as a string")
        query = _check_text(body["query"], "query", settings)
        docs = _check_documents(body, "documents", settings)
        top_n = body.get("top_n")
        if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
            raise RequestError(422, "top_n", f"`top_n` must be an integer >= 1, got {top_n!r}")
        return query, docs, {"top_n": top_n, "return_documents": _check_bool(body, "return_documents", False)}

    def render_cohere(ranked: RankedList, docs: list[str], opts: dict[str, Any]) -> dict[str, Any]:
        hits = list(ranked)[: opts["top_n"]] if opts["top_n"] else list(ranked)
        results = []
        for h in hits:
            r: dict[str, Any] = {"index": int(h.passage.id), "relevance_score": _sigmoid(h.score)}
            if opts["return_documents"]:
                r["document"] = {"text": docs[int(h.passage.id)]}
            results.append(r)
        return {"id": str(uuid.uuid4()), "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                         "model": settings.model_name}}

    async def cohere_rerank(request: Request) -> Response:
        return await rerank(request, "cohere", parse_cohere, render_cohere)

    # ---------------------------------------------------------------- TEI
    def parse_tei(body: dict[str, Any]) -> tuple[str, list[str], dict[str, Any]]:
        if "query" not in body:
            raise RequestError(422, "query", "`query` is missing; send the search query as a string")
        query = _check_text(body["query"], "query", settings)
        docs = _check_documents(body, "texts", settings)
        return query, docs, {"raw_scores": _check_bool(body, "raw_scores", False),
                             "return_text": _check_bool(body, "return_text", False)}

    def render_tei(ranked: RankedList, docs: list[str], opts: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for h in ranked:
            r: dict[str, Any] = {"index": int(h.passage.id),
                                 "score": float(h.score) if opts["raw_scores"] else _sigmoid(h.score)}
            if opts["return_text"]:
                r["text"] = docs[int(h.passage.id)]
            out.append(r)
        return out

    async def tei_rerank(request: Request) -> Response:
        return await rerank(request, "tei", parse_tei, render_tei)

    # ---------------------------------------------------------------- health, metrics
    async def health(request: Request) -> Response:
        ok = not batcher.crashed
        body = {"status": "ok" if ok else "error", "model": settings.model_name, "queue_depth": batcher.depth,
                "batches": batcher.batches, "requests": batcher.requests, "settings": settings.public()}
        if isinstance(reranker, CrossEncoderReranker):
            body["pairs"] = {"requested": reranker.pairs_requested, "scored": reranker.pairs_scored,
                             "real_tokens": reranker.real_tokens, "padded_tokens": reranker.padded_tokens}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prometheus(request: Request) -> Response:
        metrics.queue.set(batcher.depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await batcher.start()
        logger.info("serving %s (%s)", settings.model_name, settings.public())
        try:
            yield
        finally:
            await batcher.stop()

    routes: Sequence[Route] = [
        Route("/v1/rerank", cohere_rerank, methods=["POST"]),
        Route("/v2/rerank", cohere_rerank, methods=["POST"]),
        Route("/rerank", tei_rerank, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(routes=list(routes), lifespan=lifespan)
    app.state.batcher = batcher
    app.state.settings = settings
    app.state.reranker = reranker
    return app
