"""Micro-batching: concurrent requests merged into one batched reranker call off the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    enqueued: float = field(default_factory=time.monotonic)


class MicroBatcher:
    """Collect concurrent ``submit`` calls into batches for one function run in a worker thread.

    A batch starts when ``max_batch_size`` requests wait or when the oldest waiting request has
    waited ``max_wait_ms``, whichever comes first; while the model runs, new requests queue up
    and form the next batch. The model function runs in ONE worker thread, so the event loop
    keeps accepting requests and the model is never called concurrently. At most ``max_queue``
    requests wait; :meth:`submit` raises :class:`QueueFullError` beyond that (no unbounded
    backlog). If a batch raises, its requests are retried one by one so that only the request
    that fails gets the error.

    Parameters
    ----------
    fn
        ``fn(queries, passage_lists) -> results`` (one result per query), e.g. a reranker's
        ``rank_many``.
    max_batch_size, max_wait_ms, max_queue
        See :class:`ragkit.serve.ServeSettings`.
    on_batch
        Called on the event loop after every batch with ``(batch_size, seconds)``.
    """

    def __init__(
        self,
        fn: BatchFn,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 256,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("max_batch_size and max_queue must be >= 1 and max_wait_ms >= 0")
        self.fn = fn
        self.max_batch_size = int(max_batch_size)
        self.max_wait = float(max_wait_ms) / 1000.0
        self.max_queue = int(max_queue)
        self.on_batch = on_batch
        self._pending: deque[_Item] = deque()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.batches = 0
        self.requests = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def depth(self) -> int:
        """Requests waiting for the model (not counting the batch that is running)."""
        return len(self._pending)

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
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragkit-rerank")
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
        while self._pending:
            it = self._pending.popleft()
            if not it.future.done():
                it.future.set_exception(RuntimeError("the server is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # ------------------------------------------------------------------ submitting
    async def submit(self, query: Any, passages: Any) -> Any:
        """Queue one request and wait for its result.

        Raises
        ------
        QueueFullError
            When ``max_queue`` requests already wait.
        """
        if not self.alive:
            await self.start()
        if len(self._pending) >= self.max_queue:
            raise QueueFullError(f"{len(self._pending)} requests are waiting (max_queue={self.max_queue})")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append(_Item(query, passages, fut))
        assert self._wakeup is not None
        self._wakeup.set()
        return await fut

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
            n = min(len(self._pending), self.max_batch_size)
            batch = [self._pending.popleft() for _ in range(n)]
            batch = [it for it in batch if not it.future.done()]  # the client went away
            if batch:
                await self._run(batch)

    async def _call(self, batch: list[_Item]) -> Sequence[Any]:
        loop = asyncio.get_running_loop()
        queries = [it.query for it in batch]
        passages = [it.passages for it in batch]
        out = await loop.run_in_executor(self._executor, self.fn, queries, passages)
        if len(out) != len(batch):
            raise RuntimeError(f"the batch function returned {len(out)} results for {len(batch)} requests")
        return out

    async def _run(self, batch: list[_Item]) -> None:
        t0 = time.perf_counter()
        try:
            results = await self._call(batch)
        except Exception as e:  # noqa: BLE001 - one bad request must not fail its batch-mates
            if len(batch) == 1:
                logger.exception("reranker call failed")
                self._finish(batch[0], error=e)
            else:
                logger.warning("a batch of %d failed (%s: %s); retrying its requests one by one",
                               len(batch), type(e).__name__, e)
                for it in batch:
                    try:
                        (res,) = await self._call([it])
                    except Exception as e1:  # noqa: BLE001
                        logger.exception("reranker call failed")
                        self._finish(it, error=e1)
                    else:
                        self._finish(it, result=res)
        else:
            for it, res in zip(batch, results):
                self._finish(it, result=res)
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
