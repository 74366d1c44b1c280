"""Helpers shared by the benchmark scripts (``benchmarks/*.py`` and the GPU kit in ``benchmarks/gpu/``).

* a server on a free port of 127.0.0.1, waited for until it answers (:func:`free_port`,
  :func:`wait_until_up`), and its resident memory (:func:`rss_mb`);
* the request load against ``ragkit serve``'s TEI ``/rerank``: concurrent asyncio + httpx clients
  (:func:`load`), the same reranker called in-process one request after the other
  (:func:`sequential`), their latency table (:func:`latency_stats`) and the server's micro-batch
  counts (:func:`batch_counts`);
* how far one backend's rankings are from torch's (:func:`agreement`);
* one CORD (or plain CE) optimiser step on a collated batch (:func:`cord_step`).

One copy of each, so that the CPU benchmarks and the GPU kit measure the same thing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


# ----------------------------------------------------------------------------- servers
def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(proc: subprocess.Popen[Any], url: str, timeout: float, what: str = "ragkit serve",
                  log: Path | None = None, poll: float = 0.5,
                  give_up: Callable[[], bool] | None = None) -> float:
    """Seconds until ``GET url`` answers 200; ``RuntimeError`` when ``proc`` exits first or ``timeout`` passes.

    ``log``: the server's output file, whose tail goes into the error; ``give_up``: a further
    reason to stop waiting (e.g. the caller's time budget).
    """
    import httpx

    def tail() -> str:
        return f": {log.read_text(errors='replace')[-1500:]}" if log is not None and log.exists() else ""

    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}{tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        if time.monotonic() - t0 > timeout or (give_up is not None and give_up()):
            proc.terminate()
            raise RuntimeError(f"{what} did not answer {url} in {time.monotonic() - t0:.0f} s{tail()}")
        time.sleep(poll)


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS`` of ``/proc/PID/status``; NaN when absent)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


# ----------------------------------------------------------------------------- request load
def _load1() -> float:
    return round(os.getloadavg()[0], 2)


def latency_stats(lat: list[float], ok: int, failed: int, seconds: float) -> dict[str, Any]:
    """Requests, throughput and p50/p95/p99 latency (ms) of the successful requests' ``lat`` (seconds)."""
    a = np.asarray(lat) * 1000.0
    return {"requests": ok + failed, "ok": ok, "failed": failed, "seconds": round(seconds, 3),
            "throughput_rps": ok / seconds if seconds > 0 else 0.0,
            "p50_ms": float(np.percentile(a, 50)) if a.size else None,
            "p95_ms": float(np.percentile(a, 95)) if a.size else None,
            "p99_ms": float(np.percentile(a, 99)) if a.size else None}


def sequential(call: Callable[[dict[str, Any]], Any], workload: list[dict[str, Any]], seconds: float,
               min_requests: int, after: Callable[[], Any] | None = None) -> dict[str, Any]:
    """``call`` on one request after the other for ``seconds`` (at least ``min_requests``).

    ``after`` runs after each call inside its timing (e.g. ``torch.cuda.synchronize``); the load
    average before and after is recorded (``load1_before``/``load1_after``).
    """
    lat: list[float] = []
    load_before = _load1()
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds or i < min_requests:
        t1 = time.perf_counter()
        call(workload[i % len(workload)])
        if after is not None:
            after()
        lat.append(time.perf_counter() - t1)
        i += 1
    out = latency_stats(lat, i, 0, time.perf_counter() - t0)
    out["load1_before"], out["load1_after"] = load_before, _load1()
    return out


async def load(url: str, workload: list[dict[str, Any]], clients: int, seconds: float,
               timeout: float = 300) -> dict[str, Any]:
    """``clients`` concurrent clients posting ``workload`` to ``url/rerank`` back to back for ``seconds``.

    Client ``c`` sends requests ``c, c + clients, ...`` of the workload (cycled). A failed
    connection counts as status ``-1``; only status 200 counts as ok and enters the latencies.
    """
    import httpx

    lat: list[float] = []
    codes: dict[int, int] = {}
    stop = time.perf_counter() + seconds

    async def client(c: int, http: httpx.AsyncClient) -> None:
        i = c
        while time.perf_counter() < stop:
            body = workload[i % len(workload)]
            i += clients
            t0 = time.perf_counter()
            try:
                code = (await http.post("/rerank", json=body)).status_code
            except httpx.HTTPError:
                code = -1
            if code == 200:
                lat.append(time.perf_counter() - t0)
            codes[code] = codes.get(code, 0) + 1

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    load_before = _load1()
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    ok = codes.get(200, 0)
    out = latency_stats(lat, ok, sum(v for k, v in codes.items() if k != 200), wall)
    out["status_codes"] = {str(k): v for k, v in sorted(codes.items())}
    out["load1_before"], out["load1_after"] = load_before, _load1()
    return out


def batch_counts(url: str) -> tuple[float, float]:
    """``(requests, batches)`` so far, from the server's Prometheus ``ragkit_batch_size`` histogram."""
    import httpx

    total = count = 0.0
    for ln in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if ln.startswith("ragkit_batch_size_sum"):
            total = float(ln.split()[-1])
        elif ln.startswith("ragkit_batch_size_count"):
            count = float(ln.split()[-1])
    return total, count


# ----------------------------------------------------------------------------- rankings
def agreement(ref: list[Any], got: list[Any]) -> dict[str, float]:
    """How far rankings ``got`` are from ``ref`` (one ``Ranking`` per question, the same passages): the share
    of questions with the same top-3 in order (``same_top3``) and as a set (``same_top3_set``: the same
    three passages first, whatever their order), the mean per-question Spearman of the scores and the
    largest score difference of a passage."""
    from scipy.stats import spearmanr

    by_id = [dict(zip(b.ids(), b.scores())) for b in got]
    return {
        "same_top3": float(np.mean([a.ids()[:3] == b.ids()[:3] for a, b in zip(ref, got)])),
        "same_top3_set": float(np.mean([set(a.ids()[:3]) == set(b.ids()[:3]) for a, b in zip(ref, got)])),
        "spearman": float(np.mean([spearmanr(a.scores(), [g[i] for i in a.ids()])[0] for a, g in zip(ref, by_id)])),
        "max_abs_diff": float(max(abs(x - g[i]) for a, g in zip(ref, by_id) for i, x in zip(a.ids(), a.scores()))),
    }


# ----------------------------------------------------------------------------- CORD
def cord_step(model: Any, opt: Any, batch: dict[str, Any], loss: str) -> float:
    """One optimiser step of ``loss`` (``"cord"`` or ``"ce"``) on a ``CORDCollator`` batch; returns the loss.

    ``cord`` scores both orderings (the batch's ``2B`` rows) in one stacked forward + backward and
    compares them (:func:`ragkit.training.cord.pair_loss`); ``ce`` is the retriever order alone.
    """
    from ragkit.training.cord import answer_logprobs, pair_loss

    b = batch["answer_ids"].shape[0]
    logp = answer_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["answer_pos"])
    if loss == "cord":
        out = pair_loss(logp[:b], logp[b:], batch["answer_ids"], batch["answer_mask"], loss="cord")
    else:
        out = pair_loss(logp, None, batch["answer_ids"], batch["answer_mask"], loss="ce")
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(out.loss.detach())
