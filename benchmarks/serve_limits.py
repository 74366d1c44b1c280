"""Benchmark: ``ragkit serve`` memory and latency under requests at and past its documented limits (CPU).

The server is the real command ``python -m ragkit.cli serve --reranker student:DIR`` in its own
process, the student an untrained head on the embedded all-MiniLM-L6-v2 encoder (``max_length``
256; saved with ``save_pretrained``). Sent one after the other, each time with a one-document
request sent one second later (does a small request still get an answer, and when):

* ``issue``: 1,000 documents of 20,000 characters and a 1,700-character query (the request that
  once took the server from 0.55 to 10.6 GB of RSS): refused by the work budget;
* ``budget``: the largest request the default work budget admits, ``--budget-docs`` documents of
  20,000 characters and a 100-character query (each pair counted up to ``max_pair_chars``);
* ``chunked``: a 120 MB chunked body (more than ``max_body_bytes``), sent 1 MB at a time: how
  much the server read before answering 413.

Per request: status, seconds, the server's RSS before and its peak during (sampled every 0.1 s
from ``/proc``), and the small request's status and seconds. The 1-minute load average is
recorded (the machine may be shared).

    python benchmarks/serve_limits.py --out benchmarks/results/serve-limits-cpu.json
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from _common import free_port, rss_mb, wait_until_up

from ragkit.eval.harness import gpu_epilog, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Sampler:
    """The peak RSS of ``pid`` while in the ``with`` block (sampled every 0.1 s)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()

    def __enter__(self) -> Sampler:
        self.before = rss_mb(self.pid)
        self.peak = self.before
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_mb(self.pid))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()


def _small(url: str, out: dict[str, Any], delay: float) -> None:
    time.sleep(delay)
    t0 = time.perf_counter()
    try:
        r = httpx.post(url + "/rerank", json={"query": "which river?", "texts": ["A river flows."]}, timeout=600)
        out["small_status"] = r.status_code
    except httpx.HTTPError as e:
        out["small_status"] = type(e).__name__
    out["small_seconds"] = round(time.perf_counter() - t0, 2)


def _send(url: str, pid: int, name: str, body: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"case": name, "documents": len(body["texts"]),
                           "doc_chars": len(body["texts"][0]), "query_chars": len(body["query"])}
    small = threading.Thread(target=_small, args=(url, row, 1.0))
    with Sampler(pid) as s:
        small.start()
        t0 = time.perf_counter()
        r = httpx.post(url + "/rerank", json=body, timeout=600)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        small.join()
    row["status"] = r.status_code
    row["message"] = r.json().get("message", "")[:160] if r.status_code != 200 else ""
    row["rss_mb_before"], row["rss_mb_peak"] = round(s.before), round(s.peak)
    return row


def _chunked(url: str, pid: int, total_mb: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    status: Any = None
    with Sampler(pid) as s:
        t0 = time.perf_counter()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"POST /rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"x" * 2**20
            sock.setblocking(False)
            try:
                for _ in range(total_mb):
                    try:
                        head = sock.recv(4096)
                    except BlockingIOError:
                        head = b""
                    if head:
                        status = int(head.split(b" ", 2)[1])
                        break
                    sock.setblocking(True)
                    sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    sock.setblocking(False)
                    sent += len(chunk)
                if status is None:
                    sock.setblocking(True)
                    sock.sendall(b"0\r\n\r\n")
                    status = int(sock.recv(4096).split(b" ", 2)[1])
            except (BrokenPipeError, ConnectionResetError):
                sock.setblocking(True)
                try:
                    status = int(sock.recv(4096).split(b" ", 2)[1])
                except (OSError, IndexError, ValueError):
                    status = "reset"
        seconds = time.perf_counter() - t0
    return {"case": "chunked", "body_mb_offered": total_mb, "body_mb_sent_before_answer": round(sent / 2**20, 1),
            "status": status, "seconds": round(seconds, 2), "rss_mb_before": round(s.before),
            "rss_mb_peak": round(s.peak)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/serve_limits.py", None,
                          note="GPU: not applicable (the limits bound the server's memory and request handling, "
                               "the same on any device)."))
    ap.add_argument("--budget-docs", type=int, default=480,
                    help="documents in the 'budget' request (480 x 2,048 counted characters fit 1,000,000)")
    ap.add_argument("--chunked-mb", type=int, default=120)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads in the server (0: default)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    from ragkit.debias.student import DistilledReranker

    tmp = Path(tempfile.mkdtemp(prefix="ragkit-serve-limits-"))
    folder = DistilledReranker.from_base(None, device="cpu", max_length=256, seed=0).save_pretrained(tmp / "student")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAGKIT_NO_PROGRESS": "1"}
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    env.pop("RAGKIT_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "ragkit.cli", "serve", "--reranker", f"student:{folder}",
                             "--device", "cpu", "--port", str(port), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        wait_until_up(proc, url + "/health", 300)
        load = [os.getloadavg()[0]]
        long_doc = ("the castle river zebra walls " * 700)[:19_990]
        docs = [f"{i:>6} {long_doc}"[:20_000] for i in range(1000)]  # distinct: the reranker scores each pair
        rows.append(_send(url, proc.pid, "issue", {"query": ("which river " * 150)[:1700], "texts": docs}))
        rows.append(_send(url, proc.pid, "budget", {"query": ("which river " * 10)[:100],
                                                    "texts": docs[:a.budget_docs]}))
        rows.append(_chunked(url, proc.pid, a.chunked_mb))
        load.append(os.getloadavg()[0])
        health = httpx.get(url + "/health?detail=1").json()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"{'case':8} {'docs':>5} {'status':>6} {'seconds':>8} {'RSS before':>10} {'RSS peak':>9} "
          f"{'small':>6} {'small s':>8}")
    for r in rows:
        print(f"{r['case']:8} {r.get('documents', '-'):>5} {r['status']!s:>6} {r['seconds']:>8} "
              f"{r['rss_mb_before']:>10} {r['rss_mb_peak']:>9} {r.get('small_status', '-')!s:>6} "
              f"{r.get('small_seconds', '-')!s:>8}")
    print(f"load average {load[0]:.1f} -> {load[1]:.1f}")
    if a.out:
        write_result(a.out, {"rows": rows, "load_average": load, "settings": health.get("settings"),
                             "command": "python benchmarks/serve_limits.py " + " ".join(argv or sys.argv[1:])})
    return 0


if __name__ == "__main__":
    sys.exit(main())
