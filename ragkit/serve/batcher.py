"""Micro-batching: concurrent requests merged into one batched reranker call off the event loop."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MicroBatcher", "QueueFullError"]

logger = logging.getLogger(__name__)

BatchFn = Callable[[list[Any], list[Any]], Sequence[Any]]


class QueueFullError(RuntimeError):
    """The batcher already holds ``max_queue`` waiting requests; the caller should retry later."""


@dataclass
class _Item:
    query: Any
    passages: Any
    future: asyncio.Future[Any]
    key: Any = None
    group: int = 0  # the request this item is a slice of
    seq: int = 0  # the slice's position in its request
    weight: int = 1  # its documents (for max_batch_weight)
    enqueued: float = field(default_factory=time.monotonic)


class _Worker:
    """One daemon thread that runs the batch function, so that a call stuck in a backend (a sleeping
    HTTP retry, a hung socket) never keeps the process from exiting: ``concurrent.futures`` threads
    are joined at interpreter exit, a daemon thread is not."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, loop, fut = job
            try:
                res = fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                loop.call_soon_threadsafe(_settle, fut, None, e)
            else:
                loop.call_soon_threadsafe(_settle, fut, res, None)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((fn, args, loop, fut))
        return fut

    def shutdown(self) -> None:
        self._jobs.put(None)


def _size(passages: Any) -> int:
    try:
        return len(passages)
    except TypeError:
        return 1


def _settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class MicroBatcher:
    """Collect concurrent ``submit`` calls into batches for one function run in a worker thread.

    A batch starts when ``max_batch_size`` requests wait or when the oldest waiting request has
    waited ``max_wait_ms``, whichever comes first; while the model runs, new requests queue up
    and form the next batch. The model function runs in ONE worker thread, so the event loop
    keeps accepting requests and the model is never called concurrently. At most ``max_queue``
    requests wait; :meth:`submit` raises :class:`QueueFullError` beyond that (no unbounded
    backlog).

    If a batch raises, it is split in halves and each half run again, down to single requests,
    so that only the requests that fail get the error (group testing: a batch of ``n`` holding
    ``b`` failing requests costs at most ``1 + 2 b ceil(log2 n)`` calls, the good requests of a
    half that succeeds are answered at once, and requests whose client went away are not rerun).
    A request that fails alone while a batch-mate succeeded failed because of its own input; when
    it has a ``key``, the same request is refused at once for ``quarantine_s`` seconds instead of
    entering (and failing) another batch. A failure of every request of a batch (a backend
    outage) quarantines nothing.

    Parameters
    ----------
    fn
        ``fn(queries, passage_lists) -> results`` (one result per query), e.g. a reranker's
        ``rank_many``.
    max_batch_size, max_wait_ms, max_queue
        See :class:`ragkit.serve.ServeSettings`.
    on_batch
        Called on the event loop after every batch with ``(batch_size, seconds)``.
    quarantine_s
        How long a request that failed on its own input is refused without running (0: never).
    max_batch_weight
        Most documents merged into one call (``None``: no bound); a request heavier than that
        runs alone. With :meth:`submit_slices`, a large request of a pointwise reranker is cut
        into slices that are taken round-robin with other requests (every request's first slice
        before any request's second, one slice of a request per call), so a small request waits
        for at most one slice's call instead of the whole of a large request.
    """

    def __init__(
        self,
        fn: BatchFn,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 256,
        on_batch: Callable[[int, float], None] | None = None,
        quarantine_s: float = 60.0,
        max_batch_weight: int | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_wait_ms >= 0")
        self.fn = fn
        self.max_batch_size = int(max_batch_size)
        self.max_wait = float(max_wait_ms) / 1000.0
        self.max_queue = int(max_queue)
        self.on_batch = on_batch
        self._pending: list[_Item] = []
        self._groups: dict[int, int] = {}  # request -> its items waiting
        self._next_group = 0
        self.max_batch_weight = max_batch_weight
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._worker: _Worker | None = None
        self.batches = 0
        self.requests = 0
        self.busy_since: float | None = None  # time.monotonic() when the running call started
        self.failed_batches = 0  # consecutive batches in which every request failed
        self.last_error: str | None = None
        self.quarantine_s = float(quarantine_s)
        self._quarantine: dict[Any, tuple[float, BaseException]] = {}

    # ------------------------------------------------------------------ lifecycle
    @property
    def depth(self) -> int:
        """Requests waiting for the model (not counting the batch that is running)."""
        return len(self._groups)

    @property
    def alive(self) -> bool:
        """Whether the batching loop runs (``False`` before :meth:`start` or after a crash)."""
        return self._task is not None and not self._task.done()

    @property
    def crashed(self) -> bool:
        """Whether the batching loop ended with an error (the server can no longer rerank)."""
        return self._task is not None and self._task.done() and not self._task.cancelled() \
            and self._task.exception() is not None

    async def start(self) -> None:
        """Start the batching loop on the running event loop (idempotent)."""
        if self.alive:
            return
        self._wakeup = asyncio.Event()
        if self._worker is None:
            self._worker = _Worker("ragkit-rerank")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="ragkit-microbatcher")

    async def stop(self) -> None:
        """Stop the loop; waiting requests fail with ``RuntimeError``."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
            self._task = None
        pending, self._pending = self._pending, []
        self._groups.clear()
        for it in pending:
            if not it.future.done():
                it.future.set_exception(RuntimeError("the server is shutting down"))
        if self._worker is not None:
            self._worker.shutdown()  # returns at once; a call still running ends with the process
            self._worker = None

    # ------------------------------------------------------------------ submitting
    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the model's worker thread, between batches (the model is never called
        concurrently), and return its result; not batched, not counted."""
        if not self.alive:
            await self.start()
        assert self._worker is not None
        return await self._worker.submit(fn, *args)

    async def submit(self, query: Any, passages: Any, key: Any = None) -> Any:
        """Queue one request and wait for its result.

        ``key`` (hashable) identifies the request's content for the quarantine of requests that
        failed on their own input (``None``: never quarantined).

        Raises
        ------
        QueueFullError
            When ``max_queue`` requests already wait.
        Exception
            What the batch function raised for this request (at once when it is quarantined).
        """
        (result,) = await self.submit_slices(query, [passages], key)
        return result

    async def submit_slices(self, query: Any, slices: Sequence[Any], key: Any = None) -> list[Any]:
        """Queue one request cut into ``slices`` of its passages and wait for every slice's result.

        Only for a batch function that scores each (query, passage) independently (a pointwise
        reranker): each slice is ranked on its own. The request counts once against ``max_queue``;
        when a slice fails, the others are dropped and the error raised.
        """
        if not self.alive:
            await self.start()
        if key is not None and key in self._quarantine:
            until, error = self._quarantine[key]
            if time.monotonic() < until:
                raise error
            del self._quarantine[key]
        if len(self._groups) >= self.max_queue:
            raise QueueFullError(f"{len(self._groups)} requests are waiting (max_queue={self.max_queue})")
        loop = asyncio.get_running_loop()
        group, self._next_group = self._next_group, self._next_group + 1
        futs: list[asyncio.Future[Any]] = []
        for seq, passages in enumerate(slices):
            fut: asyncio.Future[Any] = loop.create_future()
            futs.append(fut)
            self._pending.append(_Item(query, passages, fut, key, group, seq, max(1, _size(passages))))
        self._groups[group] = len(futs)
        assert self._wakeup is not None
        self._wakeup.set()
        try:
            return list(await asyncio.gather(*futs))
        except BaseException:
            for f in futs:
                f.cancel()  # its other slices are not run (or their results ignored)
            raise

    # ------------------------------------------------------------------ loop
    async def _loop(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            deadline = self._pending[0].enqueued + self.max_wait
            while len(self._pending) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            batch = [it for it in batch if not it.future.done()]  # the client went away
            if batch:
                await self._run(batch)

    def _take(self) -> list[_Item]:
        """The next batch: up to ``max_batch_size`` items within ``max_batch_weight``, earliest slices first."""
        order = sorted(range(len(self._pending)), key=lambda i: (self._pending[i].seq, self._pending[i].enqueued))
        chosen: list[int] = []
        groups: set[int] = set()
        weight = 0
        for i in order:
            it = self._pending[i]
            if it.group in groups:  # one slice of a request per call: the next waits its turn
                continue
            if chosen and self.max_batch_weight is not None and weight + it.weight > self.max_batch_weight:
                continue
            chosen.append(i)
            groups.add(it.group)
            weight += it.weight
            if len(chosen) == self.max_batch_size:
                break
        taken = set(chosen)
        batch = [self._pending[i] for i in sorted(chosen)]
        self._pending = [it for i, it in enumerate(self._pending) if i not in taken]
        for it in batch:
            left = self._groups.get(it.group, 0) - 1
            if left > 0:
                self._groups[it.group] = left
            else:
                self._groups.pop(it.group, None)
        return batch

    @property
    def busy_seconds(self) -> float:
        """How long the running batch function call has run (0 when idle)."""
        return 0.0 if self.busy_since is None else time.monotonic() - self.busy_since

    async def _call(self, batch: list[_Item]) -> Sequence[Any]:
        assert self._worker is not None
        queries = [it.query for it in batch]
        passages = [it.passages for it in batch]
        self.busy_since = time.monotonic()
        try:
            out = await self._worker.submit(self.fn, queries, passages)
        finally:
            self.busy_since = None
        if len(out) != len(batch):
            raise RuntimeError(f"the batch function returned {len(out)} results for {len(batch)} requests")
        return out

    async def _isolate(self, batch: list[_Item], error: Exception, alone: list[tuple[_Item, Exception]]) -> int:
        """Finish a failed batch: split it in halves and rerun them, down to the failing requests.

        Requests that failed alone are appended to ``alone``; returns the number that succeeded.
        """
        if len(batch) == 1:
            alone.append((batch[0], error))
            return 0
        mid = len(batch) // 2
        ok = 0
        for half in (batch[:mid], batch[mid:]):
            half = [it for it in half if not it.future.done()]  # clients that went away are not rerun
            if not half:
                continue
            try:
                results = await self._call(half)
            except Exception as e:  # noqa: BLE001 - narrowed down further
                ok += await self._isolate(half, e, alone)
            else:
                for it, res in zip(half, results):
                    self._finish(it, result=res)
                ok += len(half)
        return ok

    async def _run(self, batch: list[_Item]) -> None:
        t0 = time.perf_counter()
        failed = 0
        try:
            results = await self._call(batch)
        except Exception as e:  # noqa: BLE001 - one bad request must not fail its batch-mates
            if len(batch) > 1:
                logger.warning("a batch of %d failed (%s: %s); splitting it to find the failing requests",
                               len(batch), type(e).__name__, e)
            alone: list[tuple[_Item, Exception]] = []
            ok = await self._isolate(batch, e, alone)
            failed = len(alone)
            now = time.monotonic()
            for it, err in alone:
                logger.error("reranker call failed: %s: %s", type(err).__name__, err)
                if ok and it.key is not None and self.quarantine_s > 0:  # its own input, not the backend
                    self._quarantine[it.key] = (now + self.quarantine_s, err)
                self._finish(it, error=err)
            if len(self._quarantine) > 4096:  # bounded: expired entries go, then the oldest
                live = [(k, v) for k, v in self._quarantine.items() if v[0] > now]
                self._quarantine = dict(live[-2048:])
            self.last_error = f"{type(e).__name__}: {e}"[:500]
        else:
            for it, res in zip(batch, results):
                self._finish(it, result=res)
        self.failed_batches = self.failed_batches + 1 if failed == len(batch) else 0
        self.batches += 1
        self.requests += len(batch)
        if self.on_batch is not None:
            self.on_batch(len(batch), time.perf_counter() - t0)

    @staticmethod
    def _finish(it: _Item, result: Any = None, error: BaseException | None = None) -> None:
        if it.future.done():
            return
        if error is not None:
            it.future.set_exception(error)
        else:
            it.future.set_result(result)
