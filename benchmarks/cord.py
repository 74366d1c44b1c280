"""Cost of a CORD training step against plain cross-entropy on the same batch.

``cord`` runs both orderings (2B rows) in one stacked forward + backward; ``ce`` runs the
retriever order only (B rows). Both use the same examples, prompts and LoRA setup. Each loss is
measured in its own subprocess so that the peak resident memory (``ru_maxrss``; on GPU
``torch.cuda.max_memory_allocated``) belongs to that loss alone.

    python benchmarks/cord.py --out benchmarks/results/cord-cpu.json
    python benchmarks/cord.py --model random-small --out /tmp/cord-small.json   # fast proxy
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import cord_step

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, write_result


def _model(name: str, tmp: Path) -> str | None:
    """``embedded`` -> the embedded SmolLM2; ``random-small`` -> a 4-layer random Llama with its tokenizer."""
    if name == "embedded":
        return None
    if name != "random-small":
        return name
    out = tmp / "random-small"
    if not (out / "config.json").exists():
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        from ragkit.models import resolve_generator_path

        tok = AutoTokenizer.from_pretrained(resolve_generator_path(None))
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
        LlamaForCausalLM(cfg).save_pretrained(out)
        tok.save_pretrained(out)
    return str(out)


def _single(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ragkit.generation import Generator
    from ragkit.models import check_device, resolve_device
    from ragkit.training.cord import CORDCollator, CORDConfig, load_model
    from ragkit.training.data import load_examples
    from ragkit.training.perturb import OrderPerturbation

    torch.manual_seed(0)
    st = CORDConfig(output_dir=str(Path(a.tmp) / "run"), model=_model(a.model, Path(a.tmp)), loss=a.single,
                    lora=a.lora, passage_max_tokens=a.passage_max_tokens, dtype=a.dtype)
    examples = load_examples(a.data_file, limit=a.batch_size, k=a.k)
    model, tok, _ = load_model(st)
    dev = resolve_device(a.device)
    check_device(dev)
    model.to(dev)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gen = Generator.from_components(base, tok, passage_max_tokens=a.passage_max_tokens, show_progress=False)
    coll = CORDCollator(gen, loss=a.single, perturbation=OrderPerturbation(alpha=1.0), seed=0)
    batch = {k: v.to(dev) for k, v in coll(examples).items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    times = []
    for i in range(a.warmup + a.repeats):
        t0 = time.perf_counter()
        cord_step(model, opt, batch, a.single)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.startswith("cuda")
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"loss": a.single, "rows": int(batch["input_ids"].shape[0]), "tokens": int(batch["input_ids"].numel()),
            "sec_per_step": sorted(times)[len(times) // 2], "all_times": times, "peak_mib": peak,
            "peak_kind": "cuda.max_memory_allocated" if dev.startswith("cuda") else "ru_maxrss (whole process)",
            "device": dev}


def main() -> int:
    ap = argparse.ArgumentParser(
        description="seconds per training step: cord vs plain CE", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/cord.py", "--model Qwen/Qwen2.5-7B-Instruct --device cuda --k 10 --batch-size 8 "
                                     "--passage-max-tokens 64 --out benchmarks/results/cord-gpu.json"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="embedded", help="embedded | random-small | a HF id, folder or .gguf file")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1")
    ap.add_argument("--data-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/train.jsonl")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--k", type=int, default=5, help="passages per prompt")
    ap.add_argument("--passage-max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-lora", dest="lora", action="store_false")
    ap.add_argument("--dtype", default="float32",
                    help="the model's weights: float32 (CORDConfig's default), bfloat16 (faster on CPUs with "
                         "AVX512-BF16 or AMX, and on GPUs), auto")
    ap.add_argument("--tmp", default="/tmp/ragkit-cord-bench")
    ap.add_argument("--single", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    from ragkit.models import check_device

    try:
        check_device(a.device)
    except ValueError as e:
        ap.error(str(e))
    if a.data_file is None:
        a.data_file = str(data_path("hotpotqa", "train.jsonl"))
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    if a.single:
        print(json.dumps(_single(a)))
        return 0
    Path(a.tmp).mkdir(parents=True, exist_ok=True)
    _model(a.model, Path(a.tmp))
    rows = {}
    for loss in ("ce", "cord"):
        cmd = [sys.executable, __file__, "--out", a.out, "--single", loss] + [
            x for k, v in (("--model", a.model), ("--device", a.device), ("--data-file", a.data_file),
                           ("--batch-size", a.batch_size), ("--k", a.k), ("--passage-max-tokens", a.passage_max_tokens),
                           ("--repeats", a.repeats),
                           ("--warmup", a.warmup), ("--dtype", a.dtype), ("--tmp", a.tmp)) for x in (k, str(v))]
        if not a.lora:
            cmd.append("--no-lora")
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows[loss] = json.loads(res.stdout.strip().splitlines()[-1])
    ratio = rows["cord"]["sec_per_step"] / rows["ce"]["sec_per_step"]
    result = {"model": a.model, "dtype": a.dtype, "batch_size": a.batch_size, "k": a.k,
              "passage_max_tokens": a.passage_max_tokens,
              "lora": a.lora, "rows": rows, "time_ratio_cord_over_ce": ratio, "target_ratio": 2.3,
              "memory_ratio_cord_over_ce": rows["cord"]["peak_mib"] / rows["ce"]["peak_mib"],
              "machine": f"{os.cpu_count()} CPU cores (shared, loaded)" if rows["ce"]["device"] == "cpu" else "GPU"}
    print(f"{'loss':6} {'rows':>4} {'tokens':>7} {'s/step':>8} {'peak MiB':>9}")
    for loss, r in rows.items():
        print(f"{loss:6} {r['rows']:4d} {r['tokens']:7d} {r['sec_per_step']:8.3f} {r['peak_mib']:9.0f}")
    print(f"cord/ce time ratio {ratio:.2f} (target <= 2.3)")
    write_result(a.out, result, device=rows["ce"]["device"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
