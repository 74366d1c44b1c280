"""PS-GRPO benchmarks: group-reward cost (exact vs kappa/s approximation) and one training step.

1. Reward computation time of :func:`ragkit.training.rewards.group_similarity_rewards` (exact,
   ``n g (n-1) g`` comparisons) vs :func:`approx_group_similarity_rewards` (``n g kappa s``),
   BLEU-2, on synthetic short-answer rollouts (answers drawn from a pool of HotpotQA gold
   answers with random extra words), for several (n, g); also the mean absolute deviation of
   the approximation from the exact reward.
2. One-step PS-GRPO throughput on TRL's GRPOTrainer (``use_vllm=False``): wall time of an
   optimisation step and rollout (completion) tokens per second, with the tiny random model
   (``--model tiny``, default), the embedded SmolLM2 (``--model default``) or any hub id, folder or
   ``.gguf`` file; ``--device cuda`` runs the step on a GPU, ``--lora-r`` trains LoRA adapters.

Usage::

    python benchmarks/psgrpo.py --out benchmarks/results/psgrpo-cpu.json [--model default]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ragkit.eval.harness import gpu_epilog, write_result

ROOT = Path(__file__).resolve().parents[1]


def _rollouts(n: int, g: int, rng: np.random.Generator, pool: list[str]) -> list[list[str]]:
    extra = ["the", "city", "of", "in", "American", "film", "band", "1990", "yes"]
    out = []
    for _ in range(n):
        row = []
        for _ in range(g):
            a = pool[int(rng.integers(len(pool)))]
            if rng.random() < 0.5:
                a = a + " " + " ".join(rng.choice(extra, size=int(rng.integers(1, 4))))
            row.append(a)
        out.append(row)
    return out


def bench_rewards(configs: list[tuple[int, int]], kappa: int, s: int, repeats: int) -> list[dict]:
    from ragkit.datasets import sample_records
    from ragkit.training.rewards import approx_group_similarity_rewards, group_similarity_rewards

    pool = sorted({a for r in sample_records() for a in r.answers})[:40] or ["Paris", "London"]
    rng = np.random.default_rng(0)
    rows = []
    for n, g in configs:
        sets = [_rollouts(n, g, rng, pool) for _ in range(repeats)]
        t0 = time.perf_counter()
        exact = [group_similarity_rewards(r, return_count=True) for r in sets]
        te = (time.perf_counter() - t0) / repeats
        t0 = time.perf_counter()
        approx = [approx_group_similarity_rewards(r, kappa=kappa, s=s, rng=rng) for r in sets]
        ta = (time.perf_counter() - t0) / repeats
        mad = float(np.mean([np.mean(np.abs(a[0] - e[0])) for a, e in zip(approx, exact)]))
        rows.append({"n": n, "g": g, "kappa": kappa, "s": s,
                     "exact_comparisons": exact[0][1], "approx_comparisons": approx[0][1],
                     "exact_ms": te * 1e3, "approx_ms": ta * 1e3, "speedup": te / ta,
                     "mean_abs_dev_from_exact": mad})
    return rows


def bench_step(model: str, steps: int, n: int, g: int, max_new: int, device: str = "cpu", lora_r: int = 0) -> dict:
    from ragkit.datasets import sample_records
    from ragkit.paraphrase import RuleParaphraser, build_paraphrase_sets
    from ragkit.training.psgrpo import PSGRPOConfig, select_passages, train_psgrpo

    tmp = Path(tempfile.mkdtemp(prefix="psgrpo-bench-"))
    if model == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import build_tiny_lm  # the test fixture's builder (random 2-layer Llama)

        path: str | None = str(build_tiny_lm(tmp / "tiny"))
        label = "tiny random 2-layer Llama (hidden 32)"
    elif model == "default":
        path = None
        label = "SmolLM2-135M-Instruct (embedded)"
    else:
        path = label = model
    recs = sample_records(max(steps, 2))
    sets = build_paraphrase_sets(recs, RuleParaphraser(seed=0), n=n - 1,
                                 passage_filter=lambda r: select_passages(r, 2))
    st = PSGRPOConfig(output_dir=str(tmp / "run"), model=path, paraphrases=n, num_generations=g, max_steps=steps,
                      beta=0.04, epsilon=0.2, kappa=3, consistency_weight=1.0, max_completion_length=max_new,
                      learning_rate=1e-5,
                      save_steps=10_000, mask_truncated_completions=False, passage_max_tokens=48,
                      use_cpu=not device.startswith("cuda"), lora_r=lora_r)
    summ = train_psgrpo(sets, st)
    return {"model": label, "device": device, "lora_r": lora_r, "steps": summ["steps"], "n": n, "g": g,
            "max_completion_length": max_new,
            "rollouts_per_step": n * g, "wall_s": summ["wall_s"], "s_per_step": summ["wall_s"] / summ["steps"],
            "rollout_tokens": summ["rollout_tokens"],
            "rollout_tokens_per_s": summ["rollout_tokens"] / summ["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(
        description="PS-GRPO reward and step benchmarks", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog("benchmarks/psgrpo.py",
                          "--model Qwen/Qwen2.5-7B-Instruct --device cuda --lora-r 16 --steps 4 "
                          "--out benchmarks/results/psgrpo-gpu.json",
                          note="(--lora-r: a 7B full fine-tune with AdamW does not fit in 80 GB; TRL with vLLM "
                               "rollouts is `ragkit train psgrpo --use-vllm`.)"))
    ap.add_argument("--out", required=True, help="JSON result file")
    ap.add_argument("--model", default="tiny",
                    help="'tiny' (random test model), 'default' (embedded SmolLM2), or a hub id, folder or .gguf file")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank of the training step (0: full fine-tuning)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--skip-step", action="store_true")
    args = ap.parse_args()
    import torch

    from ragkit.models import check_device, resolve_device

    device = resolve_device(args.device)
    try:
        check_device(device)
    except ValueError as e:
        ap.error(str(e))
    res: dict = {"machine": f"{torch.get_num_threads()} torch threads, shared with other jobs" if device == "cpu"
                 else f"GPU ({device})",
                 "rewards": bench_rewards([(6, 4), (16, 4), (16, 8)], kappa=3, s=1, repeats=args.repeats)}
    print(f"{'n':>3} {'g':>3} {'exact cmp':>9} {'approx cmp':>10} {'exact ms':>9} {'approx ms':>9} "
          f"{'speedup':>7} {'MAD':>6}")
    for r in res["rewards"]:
        print(f"{r['n']:>3} {r['g']:>3} {r['exact_comparisons']:>9} {r['approx_comparisons']:>10} "
              f"{r['exact_ms']:>9.2f} {r['approx_ms']:>9.2f} {r['speedup']:>7.1f} {r['mean_abs_dev_from_exact']:>6.3f}")
    if not args.skip_step:
        res["step"] = bench_step(args.model, args.steps, n=4, g=4, max_new=12, device=device, lora_r=args.lora_r)
        st = res["step"]
        print(f"\none PS-GRPO step ({st['model']}, n=4, g=4): {st['s_per_step']:.2f} s/step, "
              f"{st['rollout_tokens_per_s']:.1f} rollout tokens/s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, res, device=device)


if __name__ == "__main__":
    main()
