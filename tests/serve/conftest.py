"""Fixtures for the serving tests: a tiny real cross-encoder reranker and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'ragkit[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra is not installed: pip install 'ragkit[serve]'")
pytest.importorskip("prometheus_client", reason="the serve extra is not installed: pip install 'ragkit[serve]'")


@pytest.fixture(scope="session")
def tiny_reranker(tiny_encoder_dir: Path) -> Any:
    """A tiny random one-output cross-encoder (2-layer BERT, hidden 32) as a ragkit reranker."""
    from ragkit.debias.student import DistilledReranker

    return DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0, batch_size=64)


class LiveServer:
    """A real uvicorn server for an app, on a free 127.0.0.1 port, in a background thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture()
def live_server() -> Iterator[Any]:
    """``live_server(app)`` starts ``app`` on a free port and stops it after the test."""
    servers: list[LiveServer] = []

    def start(app: Any) -> LiveServer:
        s = LiveServer(app).__enter__()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.__exit__(None, None, None)


@pytest.fixture()
def ragkit_serve() -> Iterator[Any]:
    """``ragkit_serve(args, env, timeout)`` runs ``ragkit serve ARGS --port P`` (a free 127.0.0.1 port) in its
    own process, waits until ``/health`` answers, and returns ``(process, url)``; the process is killed
    after the test if it still runs. Its output is piped (read it once the process has ended)."""
    import httpx

    procs: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], env: dict[str, str] | None = None,
              timeout: float = 240) -> tuple[subprocess.Popen[bytes], str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "ragkit.cli", "serve", *args, "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env if env is not None else dict(os.environ))
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "ragkit serve did not start"
            time.sleep(0.3)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
