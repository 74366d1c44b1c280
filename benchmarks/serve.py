"""Benchmark: ``ragkit serve`` micro-batching vs the same reranker called sequentially (CPU).

The reranker is a distilled student on the embedded all-MiniLM-L6-v2 encoder (``--student DIR``
for a trained one; an untrained head costs the same), saved with ``save_pretrained`` and served by
the real command ``python -m ragkit.cli serve --reranker student:DIR`` in its own process. A
request is one bundled HotpotQA question with its ``--docs`` paragraphs (TEI ``/rerank``).

* sequential: ``reranker.rank(query, docs)`` in-process, one request after the other;
* served: ``C`` concurrent HTTP clients (asyncio + httpx, each sending back-to-back) for
  ``--seconds`` per level, ``C`` in ``--clients`` (1, 8, 32): throughput, p50/p99 latency,
  failed requests;
* memory: the server's resident set size sampled every second under a bounded load
  (``--mem-clients`` clients for ``--mem-seconds``; the queue bound is never reached, so every
  request must succeed).

    python benchmarks/serve.py --out benchmarks/results/serve-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _harness import write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragkit.datasets import sample_records  # noqa: E402
from ragkit.debias.student import DistilledReranker  # noqa: E402


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _stats(lat: list[float], ok: int, failed: int, seconds: float) -> dict[str, Any]:
    a = np.asarray(lat) * 1000.0
    return {"requests": ok + failed, "ok": ok, "failed": failed, "seconds": round(seconds, 2),
            "throughput_rps": ok / seconds if seconds > 0 else 0.0,
            "p50_ms": float(np.percentile(a, 50)) if a.size else None,
            "p99_ms": float(np.percentile(a, 99)) if a.size else None}


async def _load(url: str, workload: list[dict[str, Any]], clients: int, seconds: float) -> dict[str, Any]:
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
                r = await http.post("/rerank", json=body)
                code = r.status_code
            except httpx.HTTPError:
                code = -1
            if code == 200:
                lat.append(time.perf_counter() - t0)
            codes[code] = codes.get(code, 0) + 1

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    ok = codes.get(200, 0)
    out = _stats(lat, ok, sum(v for k, v in codes.items() if k != 200), wall)
    out["status_codes"] = {str(k): v for k, v in sorted(codes.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", default=None, help="a saved student folder (default: untrained head on MiniLM-L6)")
    ap.add_argument("--docs", type=int, default=10, help="paragraphs per request (default 10)")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=20.0, help="load per concurrency level (default 20 s)")
    ap.add_argument("--sequential", type=int, default=40, help="in-process sequential requests (default 40)")
    ap.add_argument("--mem-clients", type=int, default=32)
    ap.add_argument("--mem-seconds", type=float, default=60.0)
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve-cpu.json"))
    a = ap.parse_args(argv)
    import httpx

    recs = sample_records(None)
    workload = [{"query": r.question, "texts": [p.contents for p in r.passages[: a.docs]], "raw_scores": True}
                for r in recs if len(r.passages) >= a.docs]
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-serve-bench-"))
    if a.student:
        student = DistilledReranker.from_pretrained(a.student, device="cpu")
        folder, model_name = Path(a.student), f"student {a.student}"
    else:
        student = DistilledReranker.from_base(None, device="cpu", max_length=256, seed=0)
        folder = student.save_pretrained(tmp / "student")
        model_name = "student: all-MiniLM-L6-v2 cross-encoder (22M parameters, untrained head; max_length 256)"

    # ---- sequential, in-process
    for body in workload[:3]:  # warm-up
        student.rank(body["query"], body["texts"])
    lat = []
    t0 = time.perf_counter()
    for i in range(a.sequential):
        body = workload[i % len(workload)]
        t1 = time.perf_counter()
        student.rank(body["query"], body["texts"])
        lat.append(time.perf_counter() - t1)
    sequential = _stats(lat, a.sequential, 0, time.perf_counter() - t0)
    del student

    # ---- the server, in its own process
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "ragkit.cli", "serve", "--reranker", f"student:{folder}", "--device", "cpu",
           "--port", str(port), "--max-batch-size", str(a.max_batch_size), "--max-wait-ms", str(a.max_wait_ms),
           "--max-queue", str(a.max_queue), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = f"http://127.0.0.1:{port}"
    levels: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ragkit serve exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("ragkit serve did not start in 300 s")
            time.sleep(0.5)
        asyncio.run(_load(url, workload, 4, 3.0))  # warm-up
        for c in [int(x) for x in a.clients.split(",")]:
            levels[str(c)] = asyncio.run(_load(url, workload, c, a.seconds))
            levels[str(c)]["speedup_vs_sequential"] = levels[str(c)]["throughput_rps"] / sequential["throughput_rps"]
            print(f"{c:>3} clients: {levels[str(c)]['throughput_rps']:.2f} req/s "
                  f"(x{levels[str(c)]['speedup_vs_sequential']:.2f}), p50 {levels[str(c)]['p50_ms']:.0f} ms, "
                  f"p99 {levels[str(c)]['p99_ms']:.0f} ms, failed {levels[str(c)]['failed']}", flush=True)
        samples: list[float] = []
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                samples.append(_rss_mb(proc.pid))
                done.wait(1.0)

        rss_before = _rss_mb(proc.pid)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        mem_load = asyncio.run(_load(url, workload, a.mem_clients, a.mem_seconds))
        done.set()
        th.join()
        memory = {"clients": a.mem_clients, "seconds": a.mem_seconds, "rss_mb_before": rss_before,
                  "rss_mb_peak": max(samples), "rss_mb_end": samples[-1],
                  "rss_mb_first_10s_max": max(samples[:10]), "rss_mb_last_10s_max": max(samples[-10:]),
                  "load": mem_load}
        health = httpx.get(url + "/health").json()
        metrics = httpx.get(url + "/metrics").text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    batch_lines = [ln for ln in metrics.splitlines()
                   if ln.startswith(("ragkit_batch_size_sum", "ragkit_batch_size_count"))]
    bsum, bcount = (float(ln.split()[-1]) for ln in sorted(batch_lines, reverse=True))
    result = {
        "command": "python benchmarks/serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": model_name,
        "request": f"TEI /rerank, one bundled HotpotQA question + {a.docs} paragraphs (title + text)",
        "settings": {"max_batch_size": a.max_batch_size, "max_wait_ms": a.max_wait_ms, "max_queue": a.max_queue},
        "sequential_in_process": sequential,
        "served": levels,
        "memory_bounded_load": memory,
        "memory_note": f"{a.mem_seconds:.0f} s of load (the issue asks for 5 minutes; shortened to fit the CPU budget)"
                       if a.mem_seconds < 300 else "5 minutes of load",
        "mean_requests_per_batch": bsum / bcount if bcount else None,
        "server_batches": health.get("batches"),
        "failed_below_queue_limit": sum(v["failed"] for v in levels.values()) + memory["load"]["failed"],
        "machine": {"sentence_transformers": md.version("sentence-transformers"),
                    "note": "2 shared CPU cores; clients and server on the same machine"},
    }
    write_result(a.out, result)
    print(f"sequential {sequential['throughput_rps']:.2f} req/s; memory peak {memory['rss_mb_peak']:.0f} MB; "
          f"failed {result['failed_below_queue_limit']} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
