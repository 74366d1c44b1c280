"""The GPU evidence kit: every GPU measurement of ragkit in one bounded command.

Runs, in order, each bounded in time and written as one JSON in ``--out`` as soon as it ends:

=================  ============================================================================
``moi``            MoI leave-one-out at the Llama-3-8B shape, k = 10 and 20 passages of 128
                   tokens: ragkit against a bare batched forward of the same prompts (target
                   >= 0.9) and one prompt at a time (target >= 5x); tokens prefilled, peak
                   memory, batch-size sweep
``generate``       batched greedy decoding at the Llama-3-8B shape: ``Generator.generate``
                   against ``model.generate``
``cord``           one CORD step with LoRA at the Llama-3-8B shape: s/step, peak memory,
                   cord / ce (target <= 2.3)
``dense``          dense encoding at the MiniLM-L6 shape (passages/s) and exact top-k search
                   (FAISS GPU when installed, else a torch matrix product, said so)
``serve``          ``ragkit serve`` with a MiniLM-L6-shaped cross-encoder on the device:
                   requests/s at 1, 8, 32 clients against sequential in-process (target >= 2x
                   at 8 clients), 0 failed requests
``moi_qwen``       the ``moi`` measurement at the Qwen2.5-7B shape (k = 10)
=================  ============================================================================

Models are random weights at real shapes built in-process, bf16 on CUDA (``_build.py``); nothing
is downloaded. The environment (torch, CUDA, transformers, GPU name and memory) is recorded
first, in ``summary.json``, which is rewritten after every measurement with the summary table.
A measurement that cannot run (no CUDA device outside ``--smoke``, a package missing, too
little time left) is written with ``"status": "skipped"`` and the reason. The run ends before
``--time-limit`` seconds: measurements stop adding repeats as their share of the time runs out,
and a watchdog writes the summary and exits (code 3) if one overruns.

``--smoke``: tiny shapes on whatever device is present (the CPU here), seconds in all; the
files are named ``NAME-smoke.json`` instead of ``NAME-gpu.json``.

    python3 benchmarks/gpu/run.py --out "$OUT"                  # on the GPU machine (docs/gpu.md)
    python3 benchmarks/gpu/run.py --smoke --out /tmp/gpu-smoke  # CPU check, seconds
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
sys.path.insert(2, str(HERE.parents[1]))  # the repository root: ragkit, when it is not installed

import _measure  # noqa: E402

from ragkit.eval.harness import write_result  # noqa: E402

STEPS = ("moi", "generate", "cord", "dense", "serve", "moi_qwen")

# Per measurement: (weight, least seconds worth starting with, JSON name stem). A measurement's
# deadline in full mode is its weight's share of the time still left among the measurements
# still to run, so time one leaves unused goes to those after it.
PLAN: dict[str, tuple[float, float, str]] = {
    "moi": (0.30, 40.0, "moi-llama-3-8b"),
    "generate": (0.10, 20.0, "generate-llama-3-8b"),
    "cord": (0.15, 30.0, "cord-llama-3-8b"),
    "dense": (0.08, 15.0, "dense-minilm-l6"),
    "serve": (0.22, 40.0, "serve-minilm-l6"),
    "moi_qwen": (0.15, 40.0, "moi-qwen2.5-7b"),
}

PACKAGES = ("torch", "transformers", "tokenizers", "huggingface-hub", "safetensors", "sentence-transformers",
            "accelerate", "peft", "numpy", "starlette", "uvicorn", "httpx", "prometheus-client", "faiss-cpu",
            "faiss-gpu-cu12", "ragkit")


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What the machine has: Python, packages (version and where they load from), CUDA, GPU, memory, driver."""
    import torch

    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "packages": {n: _version(n) for n in PACKAGES}}
    import transformers

    import ragkit

    env["transformers_file"] = str(Path(transformers.__file__).parent)
    env["ragkit_file"] = str(Path(ragkit.__file__).parent)
    env["torch"] = {"version": torch.__version__, "cuda_build": torch.version.cuda,
                    "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": p.name, "count": torch.cuda.device_count(), "memory_gib": p.total_memory / 2**30,
                      "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                      "bf16": torch.cuda.is_bf16_supported()}
    if shutil.which("nvidia-smi"):
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used,clocks.sm",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"failed: {e}"
    tv = env["packages"]["transformers"] or "0"
    major_minor = tuple(int(x) for x in tv.split(".")[:2] if x.isdigit())
    if major_minor < (5, 23):
        env["warning"] = (f"transformers {tv} is below ragkit's floor 5.23: install the carried wheel first "
                          "(benchmarks/gpu/install.sh)")
    return env


def settings(smoke: bool) -> dict[str, dict[str, Any]]:
    """Each measurement's arguments: the real shapes, or the smoke mode's tiny ones."""
    if smoke:
        return {
            "moi": dict(shape="tiny-llama", ks=[4], passage_tokens=16, n_queries=1, batch_size=4, sweep=[2],
                        repeats=1),
            "generate": dict(shape="tiny-llama", batch_sizes=[2], prompt_passages=2, passage_tokens=16,
                             new_tokens=4, repeats=1),
            "cord": dict(shape="tiny-llama", batch_size=2, k=3, passage_tokens=16, lora_r=4, repeats=1),
            "dense": dict(shape="tiny-bert", n_passages=64, passage_words=40, batch_sizes=[16], n_docs=2000,
                          n_queries=16, search_k=5),
            "serve": dict(shape="tiny-bert", docs_levels=[4], clients=[1, 8], seconds=0.5, seq_seconds=0.25,
                          doc_words=30, start_timeout=120.0),
            "moi_qwen": dict(shape="tiny-qwen2", ks=[3], passage_tokens=16, n_queries=1, batch_size=4, sweep=[],
                             repeats=1),
        }
    return {
        "moi": dict(shape="llama-3-8b", ks=[10, 20], passage_tokens=128, n_queries=2, batch_size=16,
                    sweep=[1, 4, 8, 16, 32], repeats=3),
        "generate": dict(shape="llama-3-8b", batch_sizes=[1, 16, 64], prompt_passages=5, passage_tokens=64,
                         new_tokens=64, repeats=2),
        "cord": dict(shape="llama-3-8b", batch_size=2, k=10, passage_tokens=64, lora_r=16, repeats=3),
        "dense": dict(shape="minilm-l6", n_passages=20000, passage_words=120, batch_sizes=[64, 256],
                      n_docs=1_000_000, n_queries=1024, search_k=10),
        "serve": dict(shape="minilm-l6", docs_levels=[10, 1], clients=[1, 8, 32], seconds=6.0, seq_seconds=3.0,
                      doc_words=100, start_timeout=120.0),
        "moi_qwen": dict(shape="qwen2.5-7b", ks=[10], passage_tokens=128, n_queries=2, batch_size=16, sweep=[],
                         repeats=3),
    }


FUNCS: dict[str, Callable[..., dict[str, Any]]] = {
    "moi": _measure.moi, "generate": _measure.generate, "cord": _measure.cord, "dense": _measure.dense,
    "serve": _measure.serve, "moi_qwen": _measure.moi,
}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(rows: list[dict[str, Any]]) -> str:
    """The summary table: one line per measurement (status, seconds, headline figures, targets met)."""
    lines = [f"{'measurement':12} {'status':8} {'s':>6}  headline / targets"]
    for r in rows:
        head = r.get("headline") or {}
        figs = ", ".join(f"{k} {_fmt(v)}" for k, v in head.items())
        tg = r.get("targets") or {}
        met = ", ".join(f"{k} {'met' if t['met'] else ('unmet' if t['met'] is False else 'n/a')} "
                        f"({_fmt(t['value'])} {t['target']})" for k, t in tg.items())
        detail = r.get("reason") if r["status"] in ("skipped", "error", "killed") else figs
        lines.append(f"{r['name']:12} {r['status']:8} {r.get('seconds', 0.0):6.1f}  {detail}")
        if met and r["status"] not in ("skipped", "error", "killed"):
            lines.append(f"{'':28}targets: {met}")
    return "\n".join(lines)


class Kit:
    """The run: the plan, the summary rows, and the watchdog that ends an overrunning run in time."""

    def __init__(self, out: Path, smoke: bool, time_limit: float, only: list[str], device: str,
                 hard_exit: bool = True) -> None:
        self.out, self.smoke, self.time_limit, self.only, self.hard_exit = out, smoke, time_limit, only, hard_exit
        self.t0 = time.perf_counter()
        self.end = self.t0 + time_limit
        self.device = device
        self.tag = "smoke" if smoke else "gpu"
        self.rows: list[dict[str, Any]] = []
        self.env: dict[str, Any] = {}
        self.current: str | None = None
        self.lock = threading.Lock()
        self.finished = False

    def write_summary(self, note: str | None = None) -> None:
        with self.lock:
            payload = {"benchmark": "gpu-kit", "mode": "smoke" if self.smoke else "full", "device": self.device,
                       "time_limit_s": self.time_limit, "elapsed_s": time.perf_counter() - self.t0,
                       "environment": self.env, "measurements": self.rows, "table": table(self.rows).splitlines()}
            if note:
                payload["note"] = note
            write_result(self.out / "summary.json", payload, device=self.device)

    def watchdog(self) -> threading.Timer:
        def fire() -> None:
            if self.finished:
                return
            name = self.current or "?"
            self.rows.append({"name": name, "status": "killed", "seconds": time.perf_counter() - self.t0,
                              "reason": f"the time limit ({self.time_limit:.0f} s) was reached during {name}"})
            self.write_summary(note=f"stopped by the watchdog during {name}")
            print(table(self.rows), flush=True)
            if self.hard_exit:
                os._exit(3)

        t = threading.Timer(max(0.0, self.end - time.perf_counter() - 3.0), fire)
        t.daemon = True
        t.start()
        return t

    def record(self, name: str, payload: dict[str, Any], status: str, started: float) -> dict[str, Any]:
        stem = PLAN[name][2]
        row = {"name": name, "status": status, "seconds": time.perf_counter() - started,
               "file": f"{stem}-{self.tag}.json", "headline": payload.get("headline"),
               "targets": payload.get("targets"), "reason": payload.get("reason")}
        body = {"benchmark": f"gpu-kit/{name}", "mode": "smoke" if self.smoke else "full", "status": status,
                "device": self.device, "gpu": (self.env.get("gpu") or {}).get("name"),
                "seconds": row["seconds"], **payload}
        if payload.get("left_out"):
            body["partial"] = True
        write_result(self.out / row["file"], body, device=self.device)
        self.rows.append(row)
        self.write_summary()
        return row

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.env = environment()
        self.write_summary()
        dog = self.watchdog()
        ctx = _measure.Ctx(device=self.device, smoke=self.smoke, tmp=_measure.new_tmp())
        conf = settings(self.smoke)
        todo = [n for n in STEPS if not self.only or n in self.only]
        try:
            for i, name in enumerate(todo):
                weight, least, _ = PLAN[name]
                share = weight / sum(PLAN[n][0] for n in todo[i:])
                started = time.perf_counter()
                left = self.end - started - 10.0  # room for the summary
                if not self.smoke and not self.device.startswith("cuda"):
                    self.record(name, {"reason": f"no CUDA device (device {self.device!r}); the full kit measures "
                                                 "a GPU: run with --smoke for the CPU check"}, "skipped", started)
                    continue
                if left < (1.0 if self.smoke else least):
                    self.record(name, {"reason": f"time limit: {max(left, 0):.0f} s left, {name} needs at least "
                                                 f"{least:.0f} s"}, "skipped", started)
                    continue
                ctx.deadline = started + (left if self.smoke else share * left)
                self.current = name
                print(f"[{time.perf_counter() - self.t0:6.1f} s] {name} ...", flush=True)
                try:
                    payload = FUNCS[name](ctx, **conf[name])
                    status = "partial" if payload.get("left_out") else "ok"
                except _measure.Skip as e:
                    payload, status = {"reason": str(e)}, "skipped"
                except Exception as e:  # one failed measurement must not cost the others
                    payload = {"reason": f"{type(e).__name__}: {str(e)[:800]}",
                               "traceback": traceback.format_exc()[-4000:]}
                    status = "error"
                if name in ("cord", "moi_qwen") or name == todo[-1]:
                    ctx.release()
                else:
                    _measure.free_memory()
                row = self.record(name, payload, status, started)
                print(f"[{time.perf_counter() - self.t0:6.1f} s] {name}: {row['status']}"
                      + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)
        finally:
            self.finished = True
            dog.cancel()
            shutil.rmtree(ctx.tmp, ignore_errors=True)
        self.write_summary()
        print(table(self.rows), flush=True)
        print(f"JSON: {self.out}/summary.json and {len(self.rows)} measurement files", flush=True)
        return 0


def main(argv: list[str] | None = None, hard_exit: bool = True) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the JSON files (on the GPU machine: $OUT)")
    ap.add_argument("--time-limit", type=float, default=480.0,
                    help="seconds for the whole run, environment included (default 480 = 8 minutes)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device: seconds, for CI")
    ap.add_argument("--only", default="", help=f"comma-separated measurements to run (default all: {','.join(STEPS)})")
    ap.add_argument("--device", default="auto", help="auto (cuda when present, else cpu), cuda, cuda:1, cpu")
    a = ap.parse_args(argv)
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in only if s not in STEPS]
    if bad:
        ap.error(f"unknown measurement(s) {', '.join(bad)}; choose from {', '.join(STEPS)}")
    if a.time_limit <= 0:
        ap.error("--time-limit must be positive")
    # the GPU machine reaches no hub: a lookup would wait for its network timeout instead of failing fast
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                "RAGKIT_NO_PROGRESS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING)
    from ragkit.models import check_device, resolve_device

    device = resolve_device(a.device)
    try:
        check_device(device)
    except ValueError as e:
        ap.error(str(e))
    kit = Kit(Path(a.out), a.smoke, a.time_limit, only, device, hard_exit=hard_exit)
    return kit.run()


if __name__ == "__main__":
    raise SystemExit(main())

