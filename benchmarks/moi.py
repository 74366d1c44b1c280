"""Speed of scoring all MoI orderings: library path (batched, shared-prefix KV reuse, logits only
at answer positions) vs a naive loop and vs a bare batched model forward.

For each HotpotQA dev question (k passages cut to ~60 tokens, gold answer as the scored text):

* ``lib``   : ``Generator.score_orderings`` for the cyclic design (M = k rotations) and the
              prior design (M = 3: retriever order, reversed, half rotation);
* ``naive`` : one ``model(input_ids)`` forward per ordering over prompt + answer, no prefix
              reuse, full ``(L, vocab)`` logits, log-softmax, gather;
* ``raw``   : exactly the token batches the library runs (one prefix batch, then the suffix +
              answer batch on a batch-expanded copy of the prefix cache) as bare decoder-body
              calls with pre-built tensors, then the LM head on the answer positions only: no
              tokenisation, no Python bookkeeping, the least work that yields the same log-probs
              (so ``lib/raw`` is a conservative measure of the library's overhead).

Tokens counted (``tokens_*``): real (non-pad) input tokens fed to the model. For ``lib``/``raw``
that is the shared prefix once per question plus every ordering's suffix + answer tokens; for
``naive`` it is every ordering's full prompt + answer.

Usage::

    python benchmarks/moi.py --out benchmarks/results/moi-cpu.json --n-questions 5 --k 10
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from _shapes import add_generator_args, bench_generator, bench_records

from ragkit.datasets import data_path
from ragkit.debias.designs import cyclic, prior
from ragkit.eval.harness import cpu_name, gpu_epilog, write_result


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/moi.py",
        "--model random:llama-3-8b --device cuda --n-questions 5 --out "
        "benchmarks/results/moi-llama3-8b-gpu.json",
        note="random:<shape> builds random weights in a model's shape (speed needs no trained "
             "weights); a hub id such as --model Qwen/Qwen2.5-7B-Instruct works the same.")
    ap = argparse.ArgumentParser(description=__doc__, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--n-questions", type=int, default=5)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passage-tokens", type=int, default=60)
    ap.add_argument("--data-file", "--data", dest="data", default=None,
                    help="HotpotQA JSONL (default: $RAGKIT_DATA/hotpotqa/dev.jsonl from the repository root, "
                         "or $RAGKIT_SHARED_DATA/hotpotqa/dev.jsonl)")
    ap.add_argument("--threads", type=int, default=2)
    add_generator_args(ap)
    ap.add_argument("--max-seconds", type=float, default=420.0,
                    help="stop adding questions once this much time is spent (at least one question runs)")
    args = ap.parse_args(argv)
    args.data = str(args.data or data_path("hotpotqa", "dev.jsonl"))

    import torch
    from transformers import DynamicCache

    from ragkit.generation.layout import ordering_prompts
    from ragkit.generation.scoring import common_prefix_len

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    gen = bench_generator(args.model, device=args.device, passage_max_tokens=args.passage_tokens,
                          batch_size=args.k, show_progress=False)
    model = gen.model
    dev = model.device
    cuda = dev.type == "cuda"

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()
    records = bench_records(args.data, args.n_questions, args.k)
    designs = {"cyclic": cyclic(args.k), "prior": prior(args.k, 3)}
    acc: dict[str, dict[str, float]] = {
        d: {"lib_s": 0.0, "naive_s": 0.0, "raw_s": 0.0, "tokens_lib": 0, "tokens_naive": 0, "max_abs_diff": 0.0}
        for d in designs
    }
    done = 0
    t_start = time.perf_counter()

    def tokens_for(q: str, ps: list, orders: list[list[int]],
                   answer: str) -> tuple[list[list[int]], list[list[int]], int]:
        prompts = ordering_prompts(gen, [q], [ps], [orders])[0]
        p_ids, a_ids = gen.encode_answers(prompts, [answer] * len(prompts))
        return p_ids, a_ids, common_prefix_len(p_ids)

    # warm-up (CUDA context, kernels, allocator): one untimed library call per design
    for orders in designs.values():
        w = records[0]
        gen.score_orderings([w.question], [list(w.passages[: args.k])], [orders], [w.answers[0]])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for rec in records:
        if done and time.perf_counter() - t_start > args.max_seconds:
            break
        ps = list(rec.passages[: args.k])
        ans = rec.answers[0]
        for name, orders in designs.items():
            a = acc[name]
            # library path
            t0 = now()
            res = gen.score_orderings([rec.question], [ps], [orders], [ans])[0]
            a["lib_s"] += now() - t0
            p_ids, a_ids, L = tokens_for(rec.question, ps, orders, ans)
            a["tokens_lib"] += L + sum(len(p) - L + len(x) for p, x in zip(p_ids, a_ids))
            # naive loop: one full-logits forward per ordering, no reuse
            naive = []
            t0 = now()
            with torch.inference_mode():
                for p, x in zip(p_ids, a_ids):
                    ids = torch.tensor([p + x], device=dev)
                    lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                    pos = torch.arange(len(p) - 1, len(p) + len(x) - 1, device=dev)
                    naive.append(float(lp[pos, torch.tensor(x, device=dev)].sum()))
            a["naive_s"] += now() - t0
            a["tokens_naive"] += sum(len(p) + len(x) for p, x in zip(p_ids, a_ids))
            a["max_abs_diff"] = max(a["max_abs_diff"], float(max(abs(u - v) for u, v in zip(res.sum, naive))))
            # raw: the same token batches as the library, bare model calls on pre-built tensors
            pre_ids = torch.tensor([p_ids[0][:L]])
            pre_mask = torch.ones_like(pre_ids)
            suf = [p[L:] + x for p, x in zip(p_ids, a_ids)]
            w = max(len(s) for s in suf)
            s_ids = torch.full((len(suf), w), gen.handle.pad_id)
            s_mask = torch.zeros((len(suf), w), dtype=torch.long)
            for r, s in enumerate(suf):
                s_ids[r, : len(s)] = torch.tensor(s)
                s_mask[r, : len(s)] = 1
            full_mask = torch.cat([pre_mask.expand(len(suf), -1), s_mask], dim=1)
            pos = (L + torch.arange(w))[None].expand(len(suf), -1)
            idx = torch.zeros(len(suf), dtype=torch.long)
            # answer positions: the hidden state before each answer token, per row
            rows_i = torch.cat([torch.full((len(x),), r) for r, x in enumerate(a_ids)])
            cols_i = torch.cat([torch.arange(len(p) - L - 1, len(p) - L - 1 + len(x)) for p, x in zip(p_ids, a_ids)])
            body, head = model.get_decoder(), model.get_output_embeddings()
            pre_ids, pre_mask, s_ids, full_mask, pos, idx, rows_i, cols_i = (
                t.to(dev) for t in (pre_ids, pre_mask, s_ids, full_mask, pos, idx, rows_i, cols_i))
            t0 = now()
            with torch.inference_mode():
                out = body(input_ids=pre_ids, attention_mask=pre_mask, use_cache=True)
                cache = DynamicCache(ddp_cache_data=[(layer.keys.index_select(0, idx),
                                                      layer.values.index_select(0, idx))
                                                     for layer in out.past_key_values.layers])
                hid = body(input_ids=s_ids, attention_mask=full_mask, position_ids=pos, past_key_values=cache,
                           use_cache=True).last_hidden_state
                head(hid[rows_i, cols_i])
            a["raw_s"] += now() - t0
        done += 1
        print(f"question {done}/{len(records)} done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr)

    out: dict[str, Any] = {
        "benchmark": "moi",
        "model": gen.name,
        "device": f"cpu: {cpu_name()}" if not cuda else f"{gen.device}: {torch.cuda.get_device_name()}",
        "dtype": str(next(model.parameters()).dtype),
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "torch_threads": args.threads,
        "n_questions": done,
        "k": args.k,
        "passage_max_tokens": args.passage_tokens,
        "batch_size": gen.batch_size,
        "tokens_counted": ("real (non-pad) input tokens fed to the model; lib/raw: shared prefix once per "
                           "question + each ordering's suffix+answer; naive: each ordering's full prompt+answer"),
        "raw_forward": ("bare decoder-body calls on the library's exact token batches (prefix batch, then "
                        "suffix+answer batch on the expanded prefix cache), tensors pre-built, then the LM head on "
                        "the answer positions only: the least work that yields the same log-probs"),
        "designs": {},
    }
    rows = []
    for name, a in acc.items():
        m = len(designs[name])
        d = {
            "M": m,
            "lib_s_per_query": a["lib_s"] / done,
            "naive_s_per_query": a["naive_s"] / done,
            "raw_forward_s_per_query": a["raw_s"] / done,
            "moi_speedup_vs_naive": a["naive_s"] / a["lib_s"],
            "moi_tokens_per_s": a["tokens_lib"] / a["lib_s"],
            "raw_forward_tokens_per_s": a["tokens_lib"] / a["raw_s"],
            "naive_tokens_per_s": a["tokens_naive"] / a["naive_s"],
            "moi_vs_raw_tokens_per_s_ratio": (a["tokens_lib"] / a["lib_s"]) / (a["tokens_lib"] / a["raw_s"]),
            "tokens_lib_per_query": a["tokens_lib"] / done,
            "tokens_naive_per_query": a["tokens_naive"] / done,
            "max_abs_diff_lib_vs_naive_logprob": a["max_abs_diff"],
        }
        out["designs"][name] = d
        rows.append((name, d))
    out["prior_vs_cyclic_lib_time_ratio"] = (out["designs"]["prior"]["lib_s_per_query"]
                                             / out["designs"]["cyclic"]["lib_s_per_query"])
    head = (f"{'design':8} {'M':>3} {'lib s/q':>9} {'naive s/q':>10} {'speedup':>8} {'lib tok/s':>10} "
            f"{'raw tok/s':>10} {'lib/raw':>8}")
    print(f"moi benchmark: {gen.name}, {out['device']}, {args.threads} threads, n={done}, k={args.k}")
    print(head)
    for name, d in rows:
        print(f"{name:8} {d['M']:>3} {d['lib_s_per_query']:>9.2f} {d['naive_s_per_query']:>10.2f} "
              f"{d['moi_speedup_vs_naive']:>8.2f} {d['moi_tokens_per_s']:>10.0f} "
              f"{d['raw_forward_tokens_per_s']:>10.0f} "
              f"{d['moi_vs_raw_tokens_per_s_ratio']:>8.2f}")
    write_result(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
