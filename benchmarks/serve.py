"""Benchmark: ``ragkit serve`` micro-batching vs the same reranker called sequentially (CPU).

The reranker is a distilled student on the embedded all-MiniLM-L6-v2 encoder (``--student DIR``
for a trained one; an untrained head costs the same), saved with ``save_pretrained`` and served by
the real command ``python -m ragkit.cli serve --reranker student:DIR`` in its own process. A
request is one bundled HotpotQA question with ``D`` of its paragraphs (TEI ``/rerank``), ``D`` in
``--docs`` (1, 4, 10: Cohere/TEI clients often send few texts). For every ``D``, in one run:

* sequential, in-process, one request after the other, for ``--seq-seconds`` before AND after the
  served levels (the machine is shared; both are reported and the speedup uses their mean):
  ``reranker.rank(query, docs)`` (the baseline: the reranker's defaults, length buckets capped by
  ``batch_size`` only), and the server's own scoring path (the same reranker with the server's
  ``max_batch_tokens`` / ``forward_cost_tokens``, on one request: length-bucketed, no merging) to
  separate what bucketing gains from what merging concurrent requests gains;
* served: ``C`` concurrent HTTP clients (asyncio + httpx, each sending back-to-back) for
  ``--seconds`` per level, ``C`` in ``--clients`` (1, 8, 32): throughput, p50/p99 latency,
  failed requests, mean requests per merged batch;
* memory: the server's resident set size sampled every second under a bounded load
  (``--mem-clients`` clients, ``--mem-docs`` documents, for ``--mem-seconds``; the queue bound is
  never reached, so every request must succeed), with the whole series.

The 1-minute load average is recorded before and after every phase (other jobs share the CPU).
``--threads N`` sets torch's intra-op threads on both sides alike (on an oversubscribed machine
two OpenMP threads that wait for each other at every operator cost more than they bring).

    python benchmarks/serve.py --mem-seconds 300 --out benchmarks/results/serve-cpu.json
    python benchmarks/serve.py --threads 1 --mem-seconds 30 --out benchmarks/results/serve-threads1-cpu.json

``--backends torch,onnx,onnx-int8,openvino`` measures the encoder backends instead: the same student (with
``--train-epochs``, trained first on the bundled questions' gold paragraphs with the library's
recipe, so that its scores carry a ranking worth keeping; or a saved one with ``--student DIR``,
whose training record goes into the JSON) served by ``ragkit serve --backend B`` in its own process, one
backend after the other, ``C`` clients in ``--clients`` for ``--seconds`` each with ``D`` = the
largest ``--docs``: requests/s, p50/p95 latency, and each backend's agreement with torch on the
bundled questions (same top-3 in order and as a set, mean Spearman). The score cache is off
(``--cache-size 0``) in every run: the workload repeats its questions.

    python benchmarks/serve.py --backends torch,onnx,onnx-int8 --train-epochs 1 --docs 10 \
        --out benchmarks/results/serve-backends-cpu.json

The gold-passage student (scores about 8 times more spread out than the ``--train-epochs 1``
student's: median standard deviation 0.28 within a question against 0.033, so its agreement
measures int8 on a ranking with margins) is built with one command, the ``cross-encoder`` recipe
on the committed gold labels of 300 HotpotQA train questions (20 BM25 candidates each; 240 train,
60 held out; about 30 minutes of training on 2 shared CPU cores, plus two passes of the training
loss). It ranks the held-out questions below BM25's order, so the gate refuses it without
``--force``: it is a student for measuring the backends, not for serving answers.

    ragkit distill --labels experiments/distill/results/hotpotqa-train-bm25-20-passages.jsonl.gz \
        --student cross-encoder --epochs 0.5 --batch-size 2 --device cpu --force --out students/minilm-gold
    python benchmarks/serve.py --backends torch,onnx,onnx-int8,openvino --student students/minilm-gold \
        --docs 10 --clients 1,8,32 --seconds 15 --threads 2 --out benchmarks/results/serve-backends-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata as md
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import agreement, batch_counts, free_port, load, rss_mb, sequential, wait_until_up

from ragkit.eval.harness import gpu_epilog, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragkit.datasets import sample_records  # noqa: E402
from ragkit.debias.student import DistilledReranker  # noqa: E402
from ragkit.serve import ServeSettings  # noqa: E402
from ragkit.types import Passage  # noqa: E402


def _workloads(docs: list[int]) -> dict[int, list[dict[str, Any]]]:
    recs = sample_records(None)
    out = {}
    for d in docs:
        w = [{"query": r.question, "texts": [p.contents for p in r.passages[:d]], "raw_scores": True}
             for r in recs if len(r.passages) >= d]
        if not w:
            raise SystemExit(f"--docs {d}: no bundled question has {d} paragraphs (HotpotQA has 10)")
        out[d] = w
    return out


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/serve.py",
        "--device cuda --docs 1,4,10 --clients 1,8,32 --out benchmarks/results/serve-gpu.json",
        note="On a GPU merged batches are where micro-batching pays (one forward for many requests).",
        generator=False)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="device of the served student and the in-process baselines")
    ap.add_argument("--student", default=None, help="a saved student folder (default: untrained head on MiniLM-L6)")
    ap.add_argument("--docs", default="1,4,10", help="documents per request, one table block each (1,4,10)")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=15.0, help="load per concurrency level (default 15 s)")
    ap.add_argument("--seq-seconds", type=float, default=8.0,
                    help="each sequential measurement (before and after the served levels; default 8 s)")
    ap.add_argument("--seq-min", type=int, default=8, help="at least this many sequential requests (8)")
    ap.add_argument("--mem-clients", type=int, default=32)
    ap.add_argument("--mem-docs", type=int, default=10)
    ap.add_argument("--mem-seconds", type=float, default=300.0, help="the bounded memory load (default 300 s)")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads on BOTH sides (in-process baseline and server, through "
                         "OMP_NUM_THREADS); default: torch's own (one per core)")
    ap.add_argument("--backends", default=None,
                    help="compare encoder backends (e.g. torch,onnx,onnx-int8,openvino) instead of the "
                         "micro-batching run")
    ap.add_argument("--train-epochs", type=float, default=0.0,
                    help="with --backends and no --student: train the student this many epochs on the bundled "
                         "questions' gold paragraphs first (0: untrained head)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve-cpu.json"))
    a = ap.parse_args(argv)
    if a.backends:
        return _compare_backends(a, argv)
    import httpx
    import torch

    env = dict(os.environ)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(a.threads)

    docs_levels = [int(x) for x in a.docs.split(",")]
    client_levels = [int(x) for x in a.clients.split(",")]
    workloads = _workloads(sorted({*docs_levels, a.mem_docs}))
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-serve-bench-"))
    if a.student:
        student = DistilledReranker.from_pretrained(a.student, device=a.device)
        folder, model_name = Path(a.student), f"student {a.student}"
    else:
        student = DistilledReranker.from_base(None, device=a.device, max_length=256, seed=0)
        folder = student.save_pretrained(tmp / "student")
        model_name = "student: all-MiniLM-L6-v2 cross-encoder (22M parameters, untrained head; max_length 256)"
    served = ServeSettings()  # the server's bucketing, on a second reranker over the same model
    bucketed = DistilledReranker(student.model, batch_size=student.batch_size)
    bucketed.max_batch_tokens, bucketed.forward_cost_tokens = served.max_batch_tokens, served.forward_cost_tokens

    def rank(body: dict[str, Any]) -> Any:
        return student.rank(body["query"], body["texts"])

    def scorer(body: dict[str, Any]) -> Any:  # what the server runs, on one request
        return bucketed.rank_many([body["query"]], [[Passage(id=str(i), text=t) for i, t in enumerate(body["texts"])]])

    # ---- the server, in its own process
    port = free_port()
    cmd = [sys.executable, "-m", "ragkit.cli", "serve", "--reranker", f"student:{folder}", "--device", a.device,
           "--port", str(port), "--max-batch-size", str(a.max_batch_size), "--max-wait-ms", str(a.max_wait_ms),
           "--max-queue", str(a.max_queue), "--cache-size", "0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = f"http://127.0.0.1:{port}"
    table: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    try:
        wait_until_up(proc, url + "/health", 300)
        for d in docs_levels:
            w = workloads[d]
            for body in w[:2]:  # warm-up, both sides
                rank(body)
                scorer(body)
            asyncio.run(load(url, w, 4, 2.0))
            block: dict[str, Any] = {"sequential_before": {"rank": sequential(rank, w, a.seq_seconds, a.seq_min),
                                                           "bucketed": sequential(scorer, w, a.seq_seconds,
                                                                                   a.seq_min)},
                                     "served": {}}
            for c in client_levels:
                r0, b0 = batch_counts(url)
                level = asyncio.run(load(url, w, c, a.seconds))
                r1, b1 = batch_counts(url)
                level["mean_requests_per_batch"] = (r1 - r0) / (b1 - b0) if b1 > b0 else None
                block["served"][str(c)] = level
            block["sequential_after"] = {"rank": sequential(rank, w, a.seq_seconds, a.seq_min),
                                         "bucketed": sequential(scorer, w, a.seq_seconds, a.seq_min)}
            before, after = block["sequential_before"], block["sequential_after"]
            base = {k: (before[k]["throughput_rps"] + after[k]["throughput_rps"]) / 2 for k in ("rank", "bucketed")}
            block["sequential_rps_mean"] = base
            for c, level in block["served"].items():
                level["speedup_vs_sequential_rank"] = level["throughput_rps"] / base["rank"]
                level["speedup_vs_sequential_bucketed"] = level["throughput_rps"] / base["bucketed"]
                print(f"docs {d:>2}, {c:>3} clients: {level['throughput_rps']:.2f} req/s "
                      f"(x{level['speedup_vs_sequential_rank']:.2f} vs rank, "
                      f"x{level['speedup_vs_sequential_bucketed']:.2f} vs bucketed), p50 {level['p50_ms']:.0f} ms, "
                      f"p99 {level['p99_ms']:.0f} ms, {level['mean_requests_per_batch'] or 0:.1f} req/batch, "
                      f"failed {level['failed']}, load {level['load1_before']}", flush=True)
            print(f"docs {d:>2}: sequential rank {base['rank']:.2f} req/s, bucketed {base['bucketed']:.2f} req/s",
                  flush=True)
            table[str(d)] = block

        samples: list[tuple[float, float]] = []
        done = threading.Event()
        t_mem = time.perf_counter()

        def sample() -> None:
            while not done.is_set():
                samples.append((round(time.perf_counter() - t_mem, 1), round(rss_mb(proc.pid), 1)))
                done.wait(1.0)

        rss_before = rss_mb(proc.pid)
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        mem_load = asyncio.run(load(url, workloads[a.mem_docs], a.mem_clients, a.mem_seconds))
        done.set()
        th.join()
        rss = [m for _, m in samples]
        n10 = max(1, len(rss) // 10)
        memory = {"clients": a.mem_clients, "docs": a.mem_docs, "seconds": a.mem_seconds,
                  "rss_mb_before": round(rss_before, 1), "rss_mb_peak": max(rss), "rss_mb_end": rss[-1],
                  "rss_mb_first_10pct_max": max(rss[:n10]), "rss_mb_last_10pct_max": max(rss[-n10:]),
                  "load": mem_load, "rss_mb_every_s": samples}
        print(f"memory: {a.mem_seconds:.0f} s, {mem_load['ok']} requests, {mem_load['failed']} failed; RSS "
              f"{rss_before:.0f} MB before, peak {max(rss):.0f} MB, first 10% max "
              f"{memory['rss_mb_first_10pct_max']:.0f}, last 10% max {memory['rss_mb_last_10pct_max']:.0f}", flush=True)
        health = httpx.get(url + "/health?detail=1").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    failed = sum(lv["failed"] for b in table.values() for lv in b["served"].values()) + memory["load"]["failed"]
    result = {
        "command": "python benchmarks/serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": model_name,
        "request": "TEI /rerank, one bundled HotpotQA question + D of its paragraphs (title + text)",
        "torch_threads": torch.get_num_threads(),
        "settings": {"max_batch_size": a.max_batch_size, "max_wait_ms": a.max_wait_ms, "max_queue": a.max_queue,
                     "max_batch_tokens": health.get("settings", {}).get("max_batch_tokens")},
        "baselines": {"rank": "reranker.rank(query, docs) in-process, one request after the other (the "
                              "reranker's defaults: length buckets capped by batch_size only)",
                      "bucketed": "the reranker with the server's max_batch_tokens / forward_cost_tokens on one "
                                  "request at a time, in-process (length-bucketed encoder batches, no merging)"},
        "by_docs": table,
        "memory_bounded_load": memory,
        "memory_note": f"{a.mem_seconds:.0f} s of load" + (" (the issue asks for 5 minutes)" if a.mem_seconds < 300
                                                           else ""),
        "server_batches": health.get("batches"),
        "server_pairs": health.get("pairs"),
        "failed_below_queue_limit": failed,
        "machine": {"sentence_transformers": md.version("sentence-transformers"),
                    "note": "2 shared CPU cores (other jobs running: see load1_* per phase); clients and server "
                            "on the same machine"},
    }
    write_result(a.out, result)
    print(f"failed {failed} -> {a.out}")
    return 0


def _start(folder: Path, a: argparse.Namespace, env: dict[str, str], extra: list[str]) -> tuple[Any, str]:
    """``ragkit serve --reranker student:folder`` in its own process, once ``/health`` answers: (process, url)."""

    port = free_port()
    cmd = [sys.executable, "-m", "ragkit.cli", "serve", "--reranker", f"student:{folder}", "--device", a.device,
           "--port", str(port), "--max-batch-size", str(a.max_batch_size), "--max-wait-ms", str(a.max_wait_ms),
           "--max-queue", str(a.max_queue), "--cache-size", "0", "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_until_up(proc, url + "/health", 600, what=" ".join(cmd))
    return proc, url


def _compare_backends(a: argparse.Namespace, argv: list[str] | None) -> int:
    """The ``--backends`` run (see the module docstring)."""
    import torch

    env = dict(os.environ)
    if a.threads is not None:
        torch.set_num_threads(a.threads)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(a.threads)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    clients = [int(x) for x in a.clients.split(",")]
    d = max(int(x) for x in a.docs.split(","))
    recs = sample_records(None)
    workload = _workloads([d])[d]
    tmp = Path(tempfile.mkdtemp(prefix="ragkit-serve-bench-"))
    if a.student:
        folder, model_name = Path(a.student), f"student {a.student}"
    elif a.train_epochs > 0:
        from ragkit.training.distill import train_student
        from ragkit.training.labels import LabelRecord

        labels = [LabelRecord(qid=r.id, question=r.question, passage_ids=tuple(p.id for p in r.passages),
                              texts=tuple(p.contents for p in r.passages),
                              u=tuple(float(p.id in r.gold_ids) for p in r.passages), answers=r.answers,
                              source="hotpotqa") for r in recs]
        t0 = time.perf_counter()
        # the library's recipe (ListNet, lr 1e-4, 4 questions a step): scores that carry a ranking, the
        # only kind on which int8's agreement with torch says something (an untrained head's scores lie
        # within 0.01 of each other, and quantisation noise reorders them)
        train_student(labels, tmp / "student", epochs=a.train_epochs, seed=0, max_length=256, device=a.device,
                      report_loss=False, show_progress=False)
        folder = tmp / "student"
        model_name = (f"student: all-MiniLM-L6-v2 cross-encoder trained {a.train_epochs:g} epoch(s) on the bundled "
                      f"questions' gold paragraphs ({time.perf_counter() - t0:.0f} s)")
    else:
        folder = DistilledReranker.from_base(None, device=a.device, max_length=256, seed=0).save_pretrained(
            tmp / "student")
        model_name = "student: all-MiniLM-L6-v2 cross-encoder (untrained head; max_length 256)"
    qs, ps = [r.question for r in recs], [list(r.passages[:d]) for r in recs]
    torch_student = DistilledReranker.load(folder, device=a.device)
    ref = torch_student.rank_many(qs, ps)
    rows: dict[str, Any] = {}
    for b in backends:
        agree = agreement(ref, DistilledReranker.load(folder, device=a.device, backend=b).rank_many(qs, ps))
        proc, url = _start(folder, a, env, ["--backend", b])
        try:
            asyncio.run(load(url, workload, 4, 2.0))  # warm-up
            levels = {str(c): asyncio.run(load(url, workload, c, a.seconds)) for c in clients}
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        rows[b] = {"agreement_with_torch": agree, "served": levels}
        for c, lv in levels.items():
            print(f"{b:>9} {c:>3} clients: {lv['throughput_rps']:.2f} req/s, p50 {lv['p50_ms']:.0f} ms, "
                  f"p95 {lv['p95_ms']:.0f} ms, failed {lv['failed']}, load {lv['load1_before']}", flush=True)
        print(f"{b:>9}: same top-3 as torch on {agree['same_top3']:.0%} in order, "
              f"{agree['same_top3_set']:.0%} as a set, Spearman {agree['spearman']:.4f}", flush=True)
    if "torch" in rows:
        for row in rows.values():
            row["throughput_vs_torch"] = {c: lv["throughput_rps"] / rows["torch"]["served"][c]["throughput_rps"]
                                          for c, lv in row["served"].items()}
    print("\n| backend | clients | req/s | p50 ms | p95 ms | x torch | same top-3 (order / set) |\n"
          "|---|---|---|---|---|---|---|")
    for b, row in rows.items():
        ag = row["agreement_with_torch"]
        for c, lv in row["served"].items():
            print(f"| {b} | {c} | {lv['throughput_rps']:.2f} | {lv['p50_ms']:.0f} | {lv['p95_ms']:.0f} | "
                  f"{row.get('throughput_vs_torch', {}).get(c, float('nan')):.2f} | "
                  f"{ag['same_top3']:.0%} / {ag['same_top3_set']:.0%} |")
    write_result(a.out, {
        "command": "python benchmarks/serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": model_name, "docs_per_request": d, "torch_threads": torch.get_num_threads(),
        "request": "TEI /rerank, one bundled HotpotQA question + D of its paragraphs; score cache off",
        # the served student's training record, as DistilledReranker.load read it
        "student": {k: v for k, v in torch_student.metadata.items() if k != "base_path"} or None,
        "by_backend": rows,
        "machine": {"cpus": os.cpu_count(), "note": "clients and server on the same machine; load1_* per level"},
    })
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
