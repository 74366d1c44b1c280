"""The ``ragkit serve`` HTTP app: Cohere- and TEI-compatible rerank endpoints over any ragkit reranker.

Endpoints
---------
``POST /v1/rerank`` and ``POST /v2/rerank`` (Cohere)
    ``{"query": str, "documents": [str | {"text": str}], "top_n"?: int, "return_documents"?: bool,
    "model"?: str}`` -> ``{"id", "results": [{"index", "relevance_score"}], "meta"}``, best first.
``POST /rerank`` (Hugging Face text-embeddings-inference)
    ``{"query": str, "texts": [str], "raw_scores"?: bool, "return_text"?: bool}`` ->
    ``[{"index", "score"}]``, best first.
``POST /v1/attribute``
    ``{"query": str, "documents": [str | {"text": str}], "answer": str}`` -> ``{"results": [{"index",
    "contribution"}], "full_logprob", "meta"}``: each document's leave-one-out contribution to the
    answer, ``log p(answer | all documents) - log p(answer | all but this one)`` (MoI rerankers only:
    they hold the generator).
``GET /health``
    200 ``{"status": "ok"}`` while the reranker answers; 503 with ``"stuck"`` (a reranker call
    has run past ``request_timeout_s``), ``"failing"`` (the last batches all failed, e.g. an
    unreachable generator server) or ``"error"`` (the batching loop died), with a ``reason``.
    ``/health?detail=1`` adds the model, settings and counters; it needs the API key when one is
    set (the open view names no server-side path or setting).
``GET /metrics``
    Prometheus text format (requests by endpoint and status, latency, batch sizes, queue depth);
    a client that went away before its answer is counted under status ``499``.

The request and response shapes live in :mod:`ragkit.serve.schemas`. Scores: the reranker's raw
score ``s`` is reported as ``sigmoid(s) = 1 / (1 + exp(-s))`` (Cohere's ``relevance_score`` lies
in [0, 1]; TEI applies the same unless ``raw_scores``); the order is the reranker's order either
way. Concurrent requests are micro-batched into one ``rank_many`` call
(:class:`ragkit.serve.MicroBatcher`); a cross-encoder reranker (the distilled student) then scores
each distinct pair of the merged batch once, in length-bucketed encoder batches
(:class:`ragkit.debias.cross_encoder.CrossEncoderReranker`; ``ServeSettings.max_batch_tokens`` and
``forward_cost_tokens`` configure it).

No request can hold the server: bodies are read as a stream and refused as soon as they pass
``max_body_bytes`` (a chunked body included), all bodies in flight together are bounded by
``max_pending_bytes``, a request's work by ``max_request_chars``, and its wait by
``request_timeout_s`` (504).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from pydantic import BaseModel

from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.serve.batcher import MicroBatcher, QueueFullError
from ragkit.serve.cache import ScoreCache, cached_rank_many, model_key
from ragkit.serve.schemas import (
    AttributeRequest,
    CohereRerankRequest,
    RequestError,
    TEIRerankRequest,
    cohere_response,
    parse_request,
    sigmoid,
    tei_response,
)
from ragkit.serve.settings import ServeSettings
from ragkit.types import Passage, RankedList

__all__ = ["RerankService", "RequestError", "create_app"]

logger = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)

CLIENT_GONE = 499
"""Status counted in ``/metrics`` for a client that disconnected before its answer (nginx's convention)."""


def _need_serve_deps() -> None:
    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"ragkit serve needs starlette, uvicorn and prometheus-client ({e.name} is missing); "
            "install them with `pip install 'ragkit[serve]'`"
        ) from e


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
        self.pending_bytes = Gauge("ragkit_pending_body_bytes", "Request-body bytes held by the server",
                                   registry=self.registry)
        self.cache_hits = Counter("ragkit_cache_hits_total", "Pair scores served from the score cache",
                                  registry=self.registry)
        self.cache_misses = Counter("ragkit_cache_misses_total", "Pair scores not in the score cache",
                                    registry=self.registry)
        self.truncated = Counter("ragkit_documents_truncated_total", "Documents of which some tokens were not read",
                                 registry=self.registry)
        self.chunked = Counter("ragkit_documents_chunked_total", "Documents scored as several chunks",
                               registry=self.registry)

    def on_lookup(self, hit: bool) -> None:
        (self.cache_hits if hit else self.cache_misses).inc()

    def on_batch(self, n: int, seconds: float) -> None:
        self.batch_size.observe(n)
        self.batch_seconds.observe(seconds)


def is_pointwise(reranker: Any) -> bool:
    """Whether ``reranker`` scores each (query, document) pair on its own (its scores can be cached):
    its ``pointwise`` attribute (cross-encoders, the student and ``llm:`` say so; MoI and the residual
    student, whose scores depend on the other passages or their places, do not)."""
    return bool(getattr(reranker, "pointwise", False))


def _rank_fn(reranker: Any, settings: ServeSettings,
             cache: ScoreCache | None = None) -> Callable[[list[str], list[list[Passage]]], list[RankedList]]:
    """The batch function: ``reranker.rank_many`` (through ``cache`` when given); a cross-encoder gets the
    settings' length bucketing, a pointwise reranker their long-document rule."""
    if not callable(getattr(reranker, "rank_many", None)):
        raise TypeError(f"{type(reranker).__name__} has no rank_many(queries, passage_lists); "
                        "pass a ragkit.reranking.Reranker")
    if isinstance(reranker, CrossEncoderReranker):
        reranker.max_batch_tokens = settings.max_batch_tokens
        reranker.forward_cost_tokens = settings.forward_cost_tokens
    if hasattr(reranker, "long_docs") and settings.long_docs is not None:
        reranker.long_docs = settings.long_docs
    key = model_key(reranker, settings.model_name) if cache is not None else ""

    def fn(queries: list[str], passages: list[list[Passage]]) -> list[RankedList]:
        if cache is not None:
            return cached_rank_many(reranker, cache, key, queries, passages)
        return list(reranker.rank_many(queries, passages))

    return fn


def _request_key(query: str, docs: list[str]) -> str:
    """A digest of a request's content (the batcher's quarantine key)."""
    h = hashlib.blake2b(digest_size=16)
    for t in (query, *docs):
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


class _ByteBudget:
    """Bytes held by request bodies, over all requests (the event loop is single-threaded: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


class RerankService:
    """The server's state and its handlers; :func:`create_app` wires them into a Starlette app.

    Each endpoint is a small method; :meth:`handle` is the pipeline they share (authorise, read
    the body within the byte budgets, parse it into a :mod:`~ragkit.serve.schemas` model, run it,
    count it in ``/metrics``), so a new endpoint is a parse model, a ``run`` coroutine and a
    route in :meth:`routes`.

    Parameters
    ----------
    reranker, settings
        As in :func:`create_app`.
    """

    def __init__(self, reranker: Any, settings: ServeSettings | None = None) -> None:
        _need_serve_deps()
        self.reranker = reranker
        self.settings = settings or ServeSettings()
        self.metrics = _Metrics()
        self.cache = ScoreCache(self.settings.cache_size, on_lookup=self.metrics.on_lookup) \
            if self.settings.cache_size and is_pointwise(reranker) else None
        self.moi = getattr(reranker, "moi", None) is not None
        self.calibration = getattr(reranker, "calibration", None)
        self.batcher = MicroBatcher(_rank_fn(reranker, self.settings, self.cache), self.settings.max_batch_size,
                                    self.settings.max_wait_ms, self.settings.max_queue,
                                    on_batch=self.metrics.on_batch,
                                    max_batch_weight=self.settings.max_batch_documents)
        # a cross-encoder scores each pair on its own, so a large request can be ranked in slices
        self.pointwise = isinstance(reranker, CrossEncoderReranker)
        self.body_bytes = _ByteBudget(self.settings.pending_bytes_limit)

    # ------------------------------------------------------------------ building blocks
    @staticmethod
    def error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None,
              kind: str = "Validation") -> Any:
        """A JSON error body: ``message`` (Cohere), ``error`` + ``error_type`` (TEI) and the ``field`` at fault."""
        from starlette.responses import JSONResponse

        body = {"message": message, "error": message, "error_type": kind}
        if field:
            body["field"] = field
        return JSONResponse(body, status_code=status, headers=headers)

    def authorised(self, request: Any) -> bool:
        """Whether ``request`` carries ``Authorization: Bearer <api_key>`` (always, when no key is set).

        Header values arrive as Latin-1 text (HTTP's byte-transparent reading); they are turned back
        into the bytes the client sent and compared with the key's UTF-8 bytes in constant time.
        """
        key = self.settings.api_key
        if key is None:
            return True
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            sent = token.strip().encode("latin-1")
        except UnicodeEncodeError:
            return False
        return scheme.lower() == "bearer" and hmac.compare_digest(sent, key.encode("utf-8"))

    async def read_body(self, request: Any, held: list[int]) -> bytes:
        """The body, read as a stream and refused as soon as it passes ``max_body_bytes`` (413) or the
        server-wide ``max_pending_bytes`` (503); the bytes taken are added to ``held[0]``."""
        limit = self.settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise RequestError(413, "body", f"the request `body` has {int(length)} bytes, more than the server's "
                                            f"limit of {limit}; send fewer or shorter documents")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, "body", f"the request `body` has more than {limit} bytes, the server's "
                                                "limit; send fewer or shorter documents")
            if not self.body_bytes.take(len(chunk)):
                retry = str(self.settings.retry_after_s)
                raise RequestError(503, "body", f"the server is holding {self.body_bytes.held} bytes of request "
                                                f"bodies (max_pending_bytes={self.body_bytes.limit}); retry after "
                                                f"{retry} s", headers={"Retry-After": retry}, kind="Overloaded")
            held[0] += len(chunk)
            self.metrics.pending_bytes.set(self.body_bytes.held)
            chunks.append(chunk)
        return b"".join(chunks)

    async def rank(self, request: Any, query: str, docs: list[str]) -> RankedList:
        """Rank ``docs`` for ``query`` through the batcher within the request's deadline.

        Raises
        ------
        RequestError
            503 when the queue is full, 504 past ``request_timeout_s``, 500 when the reranker failed.
        ClientGone
            When the client disconnected first (its queued work is dropped).
        """
        passages = [Passage(id=str(i), text=d) for i, d in enumerate(docs)]
        self.metrics.queue.set(self.batcher.depth)
        job = asyncio.ensure_future(self._submit(query, passages, _request_key(query, docs)))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({job, gone}, timeout=self.settings.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not job.done():
                job.cancel()  # its future is cancelled: the batcher drops it, or ignores its result
        if job in done:
            try:
                return job.result()
            except QueueFullError as e:
                retry = str(self.settings.retry_after_s)
                raise RequestError(503, "", f"the server is overloaded ({e}); retry after {retry} s",
                                   headers={"Retry-After": retry}, kind="Overloaded") from None
            except Exception as e:  # noqa: BLE001 - the model failed for this request only
                raise RequestError(500, "", f"the reranker failed on this request: {type(e).__name__}: {e}",
                                   kind="Backend") from None
        if gone in done:
            raise ClientGone()
        raise RequestError(504, "", f"the reranker did not answer within {self.settings.request_timeout_s:g} s "
                                    "(request_timeout_s); retry later, or send fewer or shorter documents",
                           kind="Timeout")

    async def _submit(self, query: str, passages: list[Passage], key: str) -> RankedList:
        size = self.settings.slice_documents
        if not self.pointwise or size == 0 or len(passages) <= size:
            return await self.batcher.submit(query, passages, key=key)
        parts = await self.batcher.submit_slices(
            query, [passages[i:i + size] for i in range(0, len(passages), size)], key=key)
        # the slices' hits back in request order, then sorted as the reranker sorts (ties: request order)
        hits = sorted((h for part in parts for h in part), key=lambda h: int(h.passage.id))
        return RankedList.from_scores([h.passage for h in hits], [h.score for h in hits], parts[0].query)

    async def handle(self, request: Any, endpoint: str, model: type[R],
                     run: Callable[[Any, R], Awaitable[Any]]) -> Any:
        """The shared pipeline of a POST endpoint: auth, bounded body, ``model`` parse, ``run``, metrics."""
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, Response

        t0 = time.perf_counter()
        status = 500
        held = [0]
        try:
            if not self.authorised(request):
                status = 401
                return self.error(401, "missing or wrong API key; send `Authorization: Bearer <key>`",
                                  "authorization", headers={"WWW-Authenticate": "Bearer"}, kind="Unauthorized")
            try:
                req = parse_request(model, await self.read_body(request, held), self.settings)
                body = await run(request, req)
            except RequestError as e:
                status = e.status
                return self.error(e.status, e.message, e.field or None, headers=e.headers, kind=e.kind)
            except (ClientDisconnect, ClientGone):
                status = CLIENT_GONE
                return Response(status_code=CLIENT_GONE)  # nobody reads it
            except asyncio.CancelledError:  # shutdown_grace_s passed while this request waited: answer it
                status = 503
                return self.error(503, "the server is shutting down; retry on another instance or later",
                                  headers={"Retry-After": str(self.settings.retry_after_s)}, kind="Overloaded")
            status = 200
            return JSONResponse(body)
        finally:
            self.body_bytes.give(held[0])
            self.metrics.pending_bytes.set(self.body_bytes.held)
            self.metrics.queue.set(self.batcher.depth)
            self.metrics.requests.labels(endpoint, str(status)).inc()
            self.metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)

    # ------------------------------------------------------------------ endpoints
    def score(self, raw: float) -> float:
        """The reported ``relevance_score`` of a raw score: the reranker's calibration when it has one
        (:class:`ragkit.debias.calibration.PlattCalibration`), else ``sigmoid(raw)``."""
        return float(self.calibration(raw)) if self.calibration is not None else sigmoid(raw)

    def meta(self, ranked: RankedList) -> dict[str, Any]:
        """The ``meta`` fields ragkit adds: documents ``truncated`` / ``chunked``, cache hits, and for
        MoI ``abstain`` (no document helps) and ``fallback`` (MoI returned the input order)."""
        details = ranked.info.details
        long_docs = details.get("long_docs") or {}
        out: dict[str, Any] = {"truncated": int(long_docs.get("truncated", 0)),
                               "chunked": int(long_docs.get("chunked", 0))}
        self.metrics.truncated.inc(out["truncated"])
        self.metrics.chunked.inc(out["chunked"])
        if "cache" in details:
            out["cache_hits"] = int(details["cache"]["hits"])
        if self.moi:
            thr = self.settings.effect_threshold
            out["abstain"] = not any(h.score > thr for h in ranked)
            out["fallback"] = bool(ranked.info.fallback)
            if ranked.info.fallback_reason:
                out["fallback_reason"] = ranked.info.fallback_reason
            out["effect_threshold"] = thr
        return out

    async def _run_cohere(self, request: Any, req: CohereRerankRequest) -> dict[str, Any]:
        ranked = await self.rank(request, req.query, req.texts())
        self.metrics.documents.inc(len(req.documents))
        return cohere_response(req, ranked, self.settings.model_name, score=self.score, meta=self.meta(ranked),
                               effect_threshold=self.settings.effect_threshold if self.moi else None)

    async def _run_tei(self, request: Any, req: TEIRerankRequest) -> list[dict[str, Any]]:
        ranked = await self.rank(request, req.query, req.texts())
        self.metrics.documents.inc(len(req.texts()))
        self.meta(ranked)
        return tei_response(req, ranked, score=self.score)

    async def _run_attribute(self, request: Any, req: AttributeRequest) -> dict[str, Any]:
        if not self.moi:
            raise RequestError(404, "", "`/v1/attribute` needs a generator: serve an MoI reranker "
                                        "(--reranker moi --model ...)", kind="NotFound")
        docs = req.texts()
        gen = self.reranker.moi.generator
        passages = [Passage(id=str(i), text=d) for i, d in enumerate(docs)]
        prompts = [gen.build_prompt(req.query, passages)] + \
            [gen.build_prompt(req.query, passages[:i] + passages[i + 1:]) for i in range(len(passages))]
        res = await self.batcher.call(gen.score, prompts, [req.answer] * len(prompts))
        full = float(res.sum[0])
        contrib = [full - float(x) for x in res.sum[1:]]
        order = sorted(range(len(docs)), key=lambda i: (-contrib[i], i))
        thr = self.settings.effect_threshold
        return {"id": str(uuid.uuid4()), "full_logprob": full,
                "results": [{"index": i, "contribution": contrib[i],
                             "effect": "helps" if contrib[i] > thr else "hurts" if contrib[i] < -thr else "neutral"}
                            for i in order],
                "meta": {"model": self.settings.model_name, "answer_tokens": int(res.num_tokens[0]),
                         "effect_threshold": thr}}

    async def attribute(self, request: Any) -> Any:
        """``POST /v1/attribute``."""
        return await self.handle(request, "attribute", AttributeRequest, self._run_attribute)

    async def cohere_rerank(self, request: Any) -> Any:
        """``POST /v1/rerank``, ``/v2/rerank``."""
        return await self.handle(request, "cohere", CohereRerankRequest, self._run_cohere)

    async def tei_rerank(self, request: Any) -> Any:
        """``POST /rerank``."""
        return await self.handle(request, "tei", TEIRerankRequest, self._run_tei)

    def state(self) -> tuple[str, str]:
        """``(status, reason)``: ``ok``, ``stuck``, ``failing`` or ``error`` (see the module docstring)."""
        b = self.batcher
        if b.crashed:
            return "error", "the batching loop stopped; restart the server"
        busy, limit = b.busy_seconds, self.settings.request_timeout_s
        if busy > limit:
            return "stuck", f"a reranker call has run for {busy:.0f} s (request_timeout_s={limit:g})"
        if b.failed_batches >= 3:
            return "failing", f"the last {b.failed_batches} reranker calls failed (last error: {b.last_error})"
        return "ok", ""

    async def health(self, request: Any) -> Any:
        """``GET /health``: the status for anyone; ``?detail=1`` with the key adds model, settings, counters."""
        from starlette.responses import JSONResponse

        status, reason = self.state()
        body: dict[str, Any] = {"status": status, "queue_depth": self.batcher.depth,
                                "busy_seconds": round(self.batcher.busy_seconds, 3)}
        if reason:
            body["reason"] = reason
        if request.query_params.get("detail", "").lower() in ("1", "true", "yes"):
            if not self.authorised(request):
                return self.error(401, "`/health?detail=1` needs the API key; send `Authorization: Bearer <key>`",
                                  "authorization", headers={"WWW-Authenticate": "Bearer"}, kind="Unauthorized")
            body.update(self.detail())
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    def detail(self) -> dict[str, Any]:
        """Model, settings and counters (``/health?detail=1``)."""
        out: dict[str, Any] = {"model": self.settings.model_name, "batches": self.batcher.batches,
                               "requests": self.batcher.requests, "settings": self.settings.public(),
                               "pending_body_bytes": self.body_bytes.held}
        if self.cache is not None:
            out["cache"] = {"size": self.cache.size, "entries": len(self.cache), "hits": self.cache.hits,
                            "misses": self.cache.misses}
        r = self.reranker
        if isinstance(r, CrossEncoderReranker):
            out["pairs"] = {"requested": r.pairs_requested, "scored": r.pairs_scored,
                            "real_tokens": r.real_tokens, "padded_tokens": r.padded_tokens}
        return out

    async def prometheus(self, request: Any) -> Any:
        """``GET /metrics`` (Prometheus text format)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.responses import Response

        self.metrics.queue.set(self.batcher.depth)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------ wiring
    def routes(self) -> list[Any]:
        """The Starlette routes of the endpoints."""
        from starlette.routing import Route

        return [
            Route("/v1/rerank", self.cohere_rerank, methods=["POST"]),
            Route("/v2/rerank", self.cohere_rerank, methods=["POST"]),
            Route("/rerank", self.tei_rerank, methods=["POST"]),
            Route("/v1/attribute", self.attribute, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]

    @asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Start the batching loop with the server; stop it (failing waiting requests) on shutdown."""
        await self.batcher.start()
        logger.info("serving %s (%s)", self.settings.model_name, self.settings.public())
        try:
            yield
        finally:
            await self.batcher.stop()


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(request: Any) -> None:
    """Return when the client of ``request`` (whose body was read) disconnects."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


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
        Run it with :func:`ragkit.serve.run` (or ``uvicorn.run``); ``app.state.service`` is the
        :class:`RerankService`, ``app.state.batcher`` its :class:`MicroBatcher`.
    """
    from starlette.applications import Starlette

    service = RerankService(reranker, settings)
    app = Starlette(routes=service.routes(), lifespan=service.lifespan)
    app.state.service = service
    app.state.batcher = service.batcher
    app.state.settings = service.settings
    app.state.reranker = reranker
    return app
