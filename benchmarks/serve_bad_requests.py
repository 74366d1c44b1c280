"""Benchmark: how much one failing request in four slows the good ones in ``ragkit serve``.

The app (``ragkit.serve.create_app``) runs on a real uvicorn server on 127.0.0.1 over a reranker
whose cost is modelled as a batched model's (``--call-ms`` per call plus ``--doc-ms`` per document,
slept in the reranker thread) and which fails on any batch holding a query with ``BOOM`` (a
request the model cannot take). ``--clients`` concurrent clients send back-to-back TEI requests
of ``--docs`` documents for ``--seconds``; in the ``bad`` phase one client in four sends the
failing request. Reported per phase: good requests per second, their p50/p99 latency, reranker
calls. The slowdown is the good requests' p50 in ``bad`` over ``clean``.

    python benchmarks/serve_bad_requests.py --out benchmarks/results/serve-bad-requests-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "serve"))

from ragkit.eval.harness import gpu_epilog  # noqa: E402
from ragkit.reranking import Reranker  # noqa: E402
from ragkit.serve import ServeSettings, create_app  # noqa: E402
from ragkit.types import RankedList  # noqa: E402


class CostModel(Reranker):
    """Sleeps ``call_s + doc_s * documents`` per call; fails a call holding a ``BOOM`` query."""

    def __init__(self, call_s: float, doc_s: float) -> None:
        self.call_s, self.doc_s = call_s, doc_s
        self.calls = 0
        self.lock = threading.Lock()

    def _rank_many(self, queries, passages, scores):  # type: ignore[no-untyped-def]
        with self.lock:
            self.calls += 1
        time.sleep(self.call_s + self.doc_s * sum(len(p) for p in passages))
        if any("BOOM" in q.text for q in queries):
            raise RuntimeError("the model cannot take this request")
        return [RankedList.from_scores(p, [float(-i) for i in range(len(p))], q) for q, p in zip(queries, passages)]


async def _phase(url: str, clients: int, bad_every: int, seconds: float, docs: int) -> dict[str, Any]:
    lat: list[float] = []
    bad_codes: list[int] = []
    texts = [f"document {i}" for i in range(docs)]

    async def client(k: int) -> None:
        bad = bad_every and k % bad_every == bad_every - 1
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                n += 1
                q = "BOOM request" if bad else f"good request {k}-{n}"
                t0 = time.perf_counter()
                r = await c.post("/rerank", json={"query": q, "texts": texts})
                if bad:
                    bad_codes.append(r.status_code)
                elif r.status_code == 200:
                    lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(client(k) for k in range(clients)))
    arr = np.asarray(lat) if lat else np.asarray([np.nan])
    return {"good_per_s": round(len(lat) / seconds, 1), "good_p50_ms": round(float(np.percentile(arr, 50)) * 1e3, 1),
            "good_p99_ms": round(float(np.percentile(arr, 99)) * 1e3, 1), "bad_requests": len(bad_codes),
            "bad_codes": sorted(set(bad_codes))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/serve_bad_requests.py", None,
                          note="GPU: not applicable (the reranker is a sleeping stand-in; what is measured is the "
                               "server's isolation of failing requests, the same on any device)."))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--call-ms", type=float, default=20.0)
    ap.add_argument("--doc-ms", type=float, default=0.5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from conftest import LiveServer  # tests/serve/conftest.py: a uvicorn server on a free 127.0.0.1 port

    rows = {}
    for phase, bad_every in (("clean", 0), ("bad", 4)):
        rr = CostModel(a.call_ms / 1e3, a.doc_ms / 1e3)
        with LiveServer(create_app(rr, ServeSettings(max_batch_size=32, max_wait_ms=5))) as srv:
            rows[phase] = asyncio.run(_phase(srv.url, a.clients, bad_every, a.seconds, a.docs))
            rows[phase]["reranker_calls"] = rr.calls
    slowdown = rows["bad"]["good_p50_ms"] / rows["clean"]["good_p50_ms"]
    print(f"{'phase':6} {'good/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'bad reqs':>8} {'calls':>6}")
    for k, r in rows.items():
        print(f"{k:6} {r['good_per_s']:>7} {r['good_p50_ms']:>7} {r['good_p99_ms']:>7} {r['bad_requests']:>8} "
              f"{r['reranker_calls']:>6}")
    print(f"good-request p50 with one bad client in four: {slowdown:.2f}x the clean run")
    if a.out:
        from ragkit.eval.harness import write_result

        write_result(a.out, {"phases": rows, "slowdown_p50": round(slowdown, 2), "settings": vars(a),
                             "command": "python benchmarks/serve_bad_requests.py " + " ".join(argv or sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
