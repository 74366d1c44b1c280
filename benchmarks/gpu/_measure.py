"""The GPU kit's measurements: each takes a :class:`Ctx` and returns its JSON payload, or raises :class:`Skip`.

Every measurement is bounded by ``ctx.deadline``: repeats, batch sizes and client levels are
added only while time is left (at least one timed run of each path), and a measurement that
stopped early says so (``"partial": true`` and the parts left out). Timings synchronise the
device before reading the clock; each figure is the median of its repeats after a warm-up.
Peak memory is ``torch.cuda.max_memory_allocated`` since the path started (weights included)
on CUDA, the process's ``ru_maxrss`` on CPU.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import _build
import numpy as np
from _common import batch_counts, cord_step, free_port, load, sequential, wait_until_up


class Skip(Exception):
    """A measurement that cannot run here; the message is the reason written to its JSON."""


@dataclass
class Ctx:
    """What every measurement shares: device, mode, deadline, the text generator and the models built so far."""

    device: str
    smoke: bool
    tmp: Path
    deadline: float = float("inf")
    seed: int = 0
    text: _build.Text = field(default_factory=_build.Text)
    _tok: Any = None
    _lms: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def dtype(self) -> Any:
        import torch

        return torch.bfloat16 if self.cuda else torch.float32

    def left(self) -> float:
        """Seconds left before this measurement's deadline."""
        return self.deadline - time.perf_counter()

    def tokenizer(self) -> Any:
        """The LM tokenizer (trained once per run)."""
        if self._tok is None:
            self._tok = _build.lm_tokenizer(self.text, vocab_size=2000 if self.smoke else 8000)
        return self._tok

    def lm(self, shape: str) -> Any:
        """The random causal LM of ``shape``, built once and shared by the measurements that use it.

        Building another shape first frees the one held (one 8B model on the card at a time).
        """
        if shape not in self._lms:
            self.release()
            self._lms[shape] = _build.causal_lm(shape, self.tokenizer(), self.device, self.dtype, seed=self.seed)
        return self._lms[shape]

    def release(self, shape: str | None = None) -> None:
        """Drop the model of ``shape`` (all when ``None``) and return its memory to the device."""
        for s in [shape] if shape else list(self._lms):
            self._lms.pop(s, None)
        free_memory()


def free_memory() -> None:
    """Collect the dropped tensors and return the cached device memory (a no-op without CUDA)."""
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def _sync(ctx: Ctx) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()


def _reset_peak(ctx: Ctx) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(ctx: Ctx) -> float:
    if ctx.cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _allocated_gib(ctx: Ctx) -> float | None:
    if ctx.cuda:
        import torch

        return torch.cuda.memory_allocated() / 2**30
    return None


def peak_kind(ctx: Ctx) -> str:
    return ("torch.cuda.max_memory_allocated since the path started (weights included)" if ctx.cuda
            else "ru_maxrss of the whole process (CPU)")


def _timed(ctx: Ctx, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[list[float], Any]:
    """``fn`` run ``warmup`` times untimed, then timed up to ``repeats`` times (at least once, while time lasts)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times: list[float] = []
    for _ in range(repeats):
        _sync(ctx)
        t0 = time.perf_counter()
        out = fn()
        _sync(ctx)
        times.append(time.perf_counter() - t0)
        if ctx.left() < 2 * times[-1]:
            break
    return times, out


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def target(value: float | None, op: str, bound: float, what: str) -> dict[str, Any]:
    """A target entry: ``{"target": ">= 0.9", "value": v, "met": bool, "what": ...}`` (``met`` None without a value)."""
    met = None if value is None else bool(value >= bound if op == ">=" else value <= bound)
    return {"target": f"{op} {bound:g}", "value": value, "met": met, "what": what}


# ----------------------------------------------------------------------------- MoI leave-one-out
def moi(ctx: Ctx, shape: str, ks: list[int], passage_tokens: int, n_queries: int, batch_size: int,
        sweep: list[int], repeats: int) -> dict[str, Any]:
    """MoI leave-one-out (the default ``loo`` design, ``question`` outcome) against a bare batched forward and a loop.

    * ``ragkit``: ``MoI(design="loo", outcome="question").run_batch(..., generate_answer=False)``: the
      k + 1 prompts per query scored in one batched call (shared KV prefix, AttriBoT-style
      leave-one-out prefix reuse, log-probs at the scored positions only);
    * ``bare``: the same k + 1 prompts (the question scored after each intervention's passages,
      token for token what ragkit scores), right-padded in batches of ``batch_size``, one
      decoder-body forward each (no mask: causal attention never lets a real token see the
      trailing padding), the LM head on the scored positions only; no prefix reuse;
    * ``naive``: one prompt at a time, full ``(L, vocab)`` logits, log-softmax, gather.

    ``tokens_effective`` is the tokens of the k + 1 full prompts + scored text (the same for the
    three paths, so ``tokens/s`` ratios are time ratios); ``tokens_prefilled`` is what each path
    actually ran through the model (ragkit's from ``Generator.counters``).
    """
    import torch

    from ragkit.debias import MoI, PositionProfile
    from ragkit.debias.designs import loo
    from ragkit.generation import Generator, question_template

    tok = ctx.tokenizer()
    t_build = time.perf_counter()
    model = ctx.lm(shape)
    _sync(ctx)
    build_s = time.perf_counter() - t_build
    weights_gib = _allocated_gib(ctx)
    gen = Generator.from_components(model, tok, name=f"random:{shape}", batch_size=batch_size,
                                    passage_max_tokens=passage_tokens, show_progress=False)
    qgen = Generator.from_components(model, tok, name=f"random:{shape}", batch_size=batch_size,
                                     template=question_template(gen.template), passage_max_tokens=passage_tokens,
                                     show_progress=False)
    body, head = model.get_decoder(), model.get_output_embeddings()
    dev = torch.device(ctx.device)
    results: dict[str, Any] = {}
    left_out: list[str] = []

    def bare_inputs(qs: list[str], pss: list[list[Any]], k: int) -> tuple[list[list[int]], list[list[int]]]:
        prompts, answers = [], []
        for q, ps in zip(qs, pss):
            for o in loo(k):
                prompts.append(qgen.build_prompt(q, [ps[i] for i in o]))
                answers.append(q)
        return qgen.encode_answers(prompts, answers)

    def bare_batches(p_ids: list[list[int]], a_ids: list[list[int]], bs: int) -> list[tuple[Any, ...]]:
        order = sorted(range(len(p_ids)), key=lambda i: -(len(p_ids[i]) + len(a_ids[i])))
        out = []
        for s in range(0, len(order), bs):
            rows = order[s:s + bs]
            w = max(len(p_ids[i]) + len(a_ids[i]) for i in rows)
            ids = torch.full((len(rows), w), gen.tokenizer.pad_token_id, dtype=torch.long)
            r_i, c_i, tgt = [], [], []
            for r, i in enumerate(rows):
                seq = p_ids[i] + a_ids[i]
                ids[r, :len(seq)] = torch.tensor(seq)
                n_p, n_a = len(p_ids[i]), len(a_ids[i])
                r_i += [r] * n_a
                c_i += list(range(n_p - 1, n_p - 1 + n_a))
                tgt += a_ids[i]
            lens = [len(a_ids[i]) for i in rows]
            out.append((ids.to(dev), torch.tensor(r_i, device=dev), torch.tensor(c_i, device=dev),
                        torch.tensor(tgt, device=dev), rows, lens))
        return out

    def run_bare(batches: list[tuple[Any, ...]], n: int) -> list[float]:
        means = [0.0] * n
        with torch.inference_mode():
            for ids, r_i, c_i, tgt, rows, lens in batches:
                hid = body(input_ids=ids, use_cache=False).last_hidden_state
                lp = torch.log_softmax(head(hid[r_i, c_i]).float(), dim=-1).gather(-1, tgt[:, None])[:, 0]
                off = 0
                for i, n_a in zip(rows, lens):
                    means[i] = float(lp[off:off + n_a].mean())
                    off += n_a
        return means

    def run_naive(p_ids: list[list[int]], a_ids: list[list[int]]) -> list[float]:
        out = []
        with torch.inference_mode():
            for p, a in zip(p_ids, a_ids):
                logits = model(input_ids=torch.tensor([p + a], device=dev), use_cache=False).logits[0].float()
                lp = torch.log_softmax(logits, dim=-1)
                pos = torch.arange(len(p) - 1, len(p) + len(a) - 1, device=dev)
                out.append(float(lp[pos, torch.tensor(a, device=dev)].mean()))
        return out

    def measure_k(k: int) -> dict[str, Any]:
        qs = [ctx.text.question() for _ in range(n_queries)]
        pss = [ctx.text.passages(k, int(passage_tokens * 1.2) + 8, prefix=f"q{j}-") for j in range(n_queries)]
        mo = MoI(gen, design="loo", outcome="question", profile=PositionProfile.flat(k))
        p_ids, a_ids = bare_inputs(qs, pss, k)
        eff = sum(len(p) + len(a) for p, a in zip(p_ids, a_ids))
        row: dict[str, Any] = {"k": k, "queries_per_call": n_queries, "prompts_per_call": len(p_ids),
                               "tokens_effective": eff, "mean_prompt_tokens": eff / len(p_ids)}
        _reset_peak(ctx)
        gen.reset_counters()
        times, res = _timed(ctx, partial(mo.run_batch, qs, pss, generate_answer=False), repeats)
        calls = 1 + len(times)
        row["ragkit"] = {"s": _median(times), "all_s": times, "tokens_per_s": eff / _median(times),
                         "tokens_prefilled": gen.reset_counters()["prefill_tokens"] // calls,
                         "peak_gib": _peak_gib(ctx)}
        row["ragkit"]["prefilled_tokens_per_s"] = row["ragkit"]["tokens_prefilled"] / row["ragkit"]["s"]
        lib_vals = np.concatenate([np.asarray(r.outcomes, dtype=np.float64) for r in res])
        batches = bare_batches(p_ids, a_ids, batch_size)
        _reset_peak(ctx)
        times, bare_vals = _timed(ctx, partial(run_bare, batches, len(p_ids)), repeats)
        row["bare"] = {"s": _median(times), "all_s": times, "tokens_per_s": eff / _median(times),
                       "tokens_prefilled": eff, "peak_gib": _peak_gib(ctx)}
        row["max_abs_diff_ragkit_vs_bare"] = float(np.max(np.abs(lib_vals - np.asarray(bare_vals))))
        if ctx.left() > 3 * row["bare"]["s"] + 2:
            _reset_peak(ctx)
            times, naive_vals = _timed(ctx, partial(run_naive, p_ids, a_ids), 1)
            row["naive"] = {"s": _median(times), "all_s": times, "tokens_per_s": eff / _median(times),
                            "tokens_prefilled": eff, "peak_gib": _peak_gib(ctx)}
            row["max_abs_diff_ragkit_vs_naive"] = float(np.max(np.abs(lib_vals - np.asarray(naive_vals))))
            row["ragkit_speedup_vs_naive"] = row["naive"]["s"] / row["ragkit"]["s"]
        else:
            left_out.append(f"k={k} naive")
        row["ragkit_vs_bare_tokens_per_s"] = row["bare"]["s"] / row["ragkit"]["s"]
        row["ragkit_vs_bare_per_prefilled_token"] = (row["ragkit"]["prefilled_tokens_per_s"]
                                                     / row["bare"]["tokens_per_s"])
        return row

    for k in ks:
        if ctx.left() < 5:
            left_out.append(f"k={k}")
            continue
        try:
            results[f"k{k}"] = measure_k(k)
        except torch.OutOfMemoryError as e:  # recorded; the other k and the sweep still run
            results[f"k{k}"] = {"k": k, "error": f"out of memory: {str(e).splitlines()[0]}"}
            left_out.append(f"k={k} (out of memory)")
        free_memory()
    sweep_rows: dict[str, Any] = {}
    if sweep and ks:
        k = max(ks)
        qs = [ctx.text.question() for _ in range(n_queries)]
        pss = [ctx.text.passages(k, int(passage_tokens * 1.2) + 8, prefix=f"s{j}-") for j in range(n_queries)]
        p_ids, a_ids = bare_inputs(qs, pss, k)
        eff = sum(len(p) + len(a) for p, a in zip(p_ids, a_ids))
        for bs in sweep:
            if ctx.left() < 5:
                left_out.append(f"sweep batch {bs}")
                continue
            g = Generator.from_components(model, tok, batch_size=bs, passage_max_tokens=passage_tokens,
                                          show_progress=False)
            mo = MoI(g, design="loo", outcome="question", profile=PositionProfile.flat(k))
            try:
                _reset_peak(ctx)
                t_lib, _ = _timed(ctx, partial(mo.run_batch, qs, pss, generate_answer=False), 1)
                lib_peak = _peak_gib(ctx)
                batches = bare_batches(p_ids, a_ids, bs)
                _reset_peak(ctx)
                t_bare, _ = _timed(ctx, partial(run_bare, batches, len(p_ids)), 1)
                sweep_rows[str(bs)] = {"ragkit_s": _median(t_lib), "ragkit_tokens_per_s": eff / _median(t_lib),
                                       "ragkit_peak_gib": lib_peak, "bare_s": _median(t_bare),
                                       "bare_tokens_per_s": eff / _median(t_bare), "bare_peak_gib": _peak_gib(ctx),
                                       "ragkit_vs_bare_tokens_per_s": _median(t_bare) / _median(t_lib)}
            except torch.OutOfMemoryError as e:  # a batch too large for the card is a result, not a failure
                sweep_rows[str(bs)] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            batches = None
            free_memory()
    done = [row for row in results.values() if "error" not in row]
    main_k = max(done, key=lambda row: row["k"]) if done else None
    targets = {}
    for key, row in results.items():
        targets[f"{key}_ragkit_vs_bare"] = target(row.get("ragkit_vs_bare_tokens_per_s"), ">=", 0.9,
                                                  "ragkit tokens/s over a bare batched forward of the same prompts")
        targets[f"{key}_speedup_vs_naive"] = target(row.get("ragkit_speedup_vs_naive"), ">=", 5.0,
                                                    "ragkit against one prompt at a time with full logits")
    return {"shape": shape, "params": {"ks": ks, "passage_tokens": passage_tokens, "queries_per_call": n_queries,
                                       "batch_size": batch_size, "batch_size_sweep": sweep, "repeats": repeats,
                                       "design": "loo", "outcome": "question", "template": gen.template.name},
            "model": {"parameters": _build.n_params(model), "dtype": str(ctx.dtype), "build_s": build_s,
                      "allocated_gib_after_build": weights_gib,
                      "attn_implementation": getattr(model.config, "_attn_implementation", None)},
            "results": results, "batch_size_sweep": {"k": max(ks) if ks else None, "rows": sweep_rows},
            "headline": main_k and {"k": main_k["k"], "ragkit_vs_bare": main_k["ragkit_vs_bare_tokens_per_s"],
                                    "speedup_vs_naive": main_k.get("ragkit_speedup_vs_naive"),
                                    "ragkit_tokens_per_s": main_k["ragkit"]["tokens_per_s"],
                                    "peak_gib": main_k["ragkit"]["peak_gib"]},
            "targets": targets, "left_out": left_out, "peak_memory": peak_kind(ctx)}


# ----------------------------------------------------------------------------- generation
def generate(ctx: Ctx, shape: str, batch_sizes: list[int], prompt_passages: int, passage_tokens: int,
             new_tokens: int, repeats: int) -> dict[str, Any]:
    """Batched greedy decoding: ``Generator.generate`` against ``model.generate`` on the same prompts.

    Both decode exactly ``new_tokens`` tokens per row (EOS forbidden until then, no stop
    strings), from the same left-padded prompts, so tokens/s ratios are time ratios.
    """

    from ragkit.generation import Generator

    tok = ctx.tokenizer()
    model = ctx.lm(shape)
    rows: dict[str, Any] = {}
    left_out: list[str] = []
    for bs in batch_sizes:
        if ctx.left() < 5:
            left_out.append(f"batch {bs}")
            continue
        gen = Generator.from_components(model, tok, batch_size=bs, passage_max_tokens=passage_tokens,
                                        show_progress=False)
        prompts = [gen.build_prompt(ctx.text.question(), ctx.text.passages(prompt_passages, passage_tokens + 8))
                   for _ in range(bs)]
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left").to(ctx.device)

        ours = partial(gen.generate, prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        hf = partial(_hf_generate, model, enc, new_tokens, tok.pad_token_id, tok.eos_token_id)
        _reset_peak(ctx)
        t_ours, texts = _timed(ctx, ours, repeats)
        peak_ours = _peak_gib(ctx)
        _reset_peak(ctx)
        t_hf, out = _timed(ctx, hf, repeats)
        hf_new = out[:, enc["input_ids"].shape[1]:]
        hf_texts = tok.batch_decode(hf_new, skip_special_tokens=True)
        n_tok = bs * new_tokens
        rows[str(bs)] = {"prompt_tokens_max": int(enc["input_ids"].shape[1]), "new_tokens_per_row": new_tokens,
                         "ragkit_s": _median(t_ours), "ragkit_tokens_per_s": n_tok / _median(t_ours),
                         "ragkit_peak_gib": peak_ours, "hf_generate_s": _median(t_hf),
                         "hf_generate_tokens_per_s": n_tok / _median(t_hf), "hf_peak_gib": _peak_gib(ctx),
                         "ragkit_vs_hf_tokens_per_s": _median(t_hf) / _median(t_ours),
                         "hf_rows_decoded": int(hf_new.shape[1]),
                         "same_text_share": float(np.mean([a == b for a, b in zip(texts, hf_texts)])),
                         "all_s": {"ragkit": t_ours, "hf": t_hf}}
        del enc, out
        free_memory()
    best = max(rows.values(), key=lambda r: r["ragkit_tokens_per_s"]) if rows else None
    return {"shape": shape, "params": {"batch_sizes": batch_sizes, "prompt_passages": prompt_passages,
                                       "passage_tokens": passage_tokens, "new_tokens": new_tokens,
                                       "repeats": repeats, "decoding": "greedy, EOS masked until new_tokens"},
            "results": rows, "left_out": left_out, "peak_memory": peak_kind(ctx),
            "headline": best and {"batch": int(max(rows, key=lambda b: rows[b]["ragkit_tokens_per_s"])),
                                  "ragkit_tokens_per_s": best["ragkit_tokens_per_s"],
                                  "ragkit_vs_hf": best["ragkit_vs_hf_tokens_per_s"]},
            "targets": {}}


def _hf_generate(model: Any, enc: Any, new_tokens: int, pad_id: int, eos_id: int) -> Any:
    import torch

    with torch.inference_mode():
        return model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=pad_id, eos_token_id=eos_id)


# ----------------------------------------------------------------------------- CORD
def cord(ctx: Ctx, shape: str, batch_size: int, k: int, passage_tokens: int, lora_r: int,
         repeats: int) -> dict[str, Any]:
    """One CORD training step with LoRA against plain CE on the same batch (``benchmarks/cord.py``'s step).

    The model held by the earlier measurements is wrapped with LoRA (``ragkit.training.models.lora_config``,
    all linear layers) and released afterwards. ``cord`` runs both orderings (2B rows) in one
    stacked forward + backward, ``ce`` the retriever order (B rows). On an out-of-memory error the
    loss is measured again with gradient checkpointing, and the JSON says so.
    """
    import torch

    from ragkit.generation import Generator
    from ragkit.training.cord import CORDCollator
    from ragkit.training.data import Example
    from ragkit.training.models import lora_config
    from ragkit.training.perturb import OrderPerturbation

    try:
        from peft import get_peft_model
    except ImportError as e:
        raise Skip(f"peft is not installed ({e}); the CORD step needs LoRA") from None
    tok = ctx.tokenizer()
    base = ctx.lm(shape)
    ctx._lms.pop(shape, None)  # LoRA changes the model in place: nobody reuses it after this
    base.train()
    base.config.use_cache = False
    model = get_peft_model(base, lora_config(lora_r, 2 * lora_r))
    gen = Generator.from_components(model.get_base_model(), tok, passage_max_tokens=passage_tokens,
                                    show_progress=False)
    examples = []
    for i in range(batch_size):
        ps = tuple(ctx.text.passages(k, passage_tokens + 8, prefix=f"c{i}-"))
        examples.append(Example(id=f"ex{i}", question=ctx.text.question(), passages=ps,
                                answer=ctx.text.sentence(4)[:-1], scores=tuple(float(k - j) for j in range(k))))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    rows: dict[str, Any] = {}
    left_out: list[str] = []

    for loss in ("ce", "cord"):
        if ctx.left() < 5:
            left_out.append(loss)
            continue
        coll = CORDCollator(gen, loss=loss, perturbation=OrderPerturbation(alpha=1.0), seed=0)
        batch = {key: v.to(ctx.device) for key, v in coll(examples).items()}
        row: dict[str, Any] = {"rows": int(batch["input_ids"].shape[0]), "tokens": int(batch["input_ids"].numel()),
                               "gradient_checkpointing": False}
        for attempt in (0, 1):
            try:
                _reset_peak(ctx)
                times, last = _timed(ctx, partial(cord_step, model, opt, batch, loss), repeats)
                row.update({"s_per_step": _median(times), "all_s": times, "peak_gib": _peak_gib(ctx),
                            "last_loss": last})
                break
            except torch.OutOfMemoryError as e:
                opt.zero_grad(set_to_none=True)
                free_memory()
                if attempt:
                    row["error"] = f"out of memory with gradient checkpointing: {str(e).splitlines()[0]}"
                else:
                    row["oom_without_checkpointing"] = str(e).splitlines()[0]
                    model.gradient_checkpointing_enable()
                    model.enable_input_require_grads()
                    row["gradient_checkpointing"] = True
        rows[loss] = row
        del batch
        free_memory()
    ratio = (rows["cord"]["s_per_step"] / rows["ce"]["s_per_step"]
             if all("s_per_step" in rows.get(x, {}) for x in ("ce", "cord")) else None)
    mem_ratio = (rows["cord"]["peak_gib"] / rows["ce"]["peak_gib"]
                 if all("peak_gib" in rows.get(x, {}) for x in ("ce", "cord")) else None)
    trainable = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
    del model, base, opt, gen
    free_memory()
    return {"shape": shape, "params": {"batch_size": batch_size, "k": k, "passage_tokens": passage_tokens,
                                       "lora_r": lora_r, "lora_alpha": 2 * lora_r, "lora_targets": "all-linear",
                                       "repeats": repeats, "optimizer": "AdamW over the LoRA weights"},
            "trainable_parameters": trainable, "results": rows, "time_ratio_cord_over_ce": ratio,
            "memory_ratio_cord_over_ce": mem_ratio, "left_out": left_out, "peak_memory": peak_kind(ctx),
            "headline": {"cord_s_per_step": rows.get("cord", {}).get("s_per_step"), "cord_over_ce": ratio,
                         "cord_peak_gib": rows.get("cord", {}).get("peak_gib")},
            "targets": {"cord_over_ce": target(ratio, "<=", 2.3, "seconds per step, cord over plain CE "
                                                                 "(2x the rows)")}}


# ----------------------------------------------------------------------------- dense retrieval
def dense(ctx: Ctx, shape: str, n_passages: int, passage_words: int, batch_sizes: list[int], n_docs: int,
          n_queries: int, search_k: int) -> dict[str, Any]:
    """Dense encoding passages/s (``DenseRetriever.encode_passages``) and exact top-k search.

    Search runs through FAISS's GPU index (``DenseRetriever(use_gpu=True)``) when an importable
    FAISS sees a GPU; otherwise through a torch matrix product + ``topk`` on the device (what
    such an index computes, exactly), and the JSON says which and why.
    """
    import torch

    from ragkit.retrievers.dense import DenseRetriever

    folder = _build.sentence_encoder(shape, ctx.text, ctx.tmp / f"encoder-{shape}")
    passages = [p for i in range(0, n_passages, 500)
                for p in ctx.text.passages(min(500, n_passages - i), passage_words, prefix=f"d{i}-")]
    enc_rows: dict[str, Any] = {}
    left_out: list[str] = []
    dim = None
    for bs in batch_sizes:
        if ctx.left() < 5:
            left_out.append(f"encode batch {bs}")
            continue
        dr = DenseRetriever(model=str(folder), device=ctx.device, batch_size=bs, show_progress=False)
        dr.encode_passages(passages[: min(len(passages), 4 * bs)])  # warm-up: load, kernels, allocator
        _reset_peak(ctx)
        times, vecs = _timed(ctx, lambda dr=dr: dr.encode_passages(passages), 2, warmup=0)
        dim = int(vecs.shape[1])
        enc_rows[str(bs)] = {"passages": len(passages), "s": _median(times), "passages_per_s": len(passages) /
                             _median(times), "peak_gib": _peak_gib(ctx), "all_s": times}
    search: dict[str, Any] = {}
    dim = dim or 384
    if ctx.left() < 5:
        left_out.append("search")
    else:
        gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
        docs = torch.nn.functional.normalize(torch.randn(n_docs, dim, generator=gen), dim=1)
        queries = torch.nn.functional.normalize(torch.randn(n_queries, dim, generator=gen), dim=1)
        faiss_reason = None
        try:
            import faiss

            if not (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0):
                faiss_reason = "the installed FAISS is a CPU build or sees no GPU"
        except ImportError as e:
            faiss_reason = (f"FAISS is not installed ({e}): faiss-gpu-cu12 and the CUDA 12 libraries it needs do "
                            "not fit the 64 MiB the GPU machine receives (docs/gpu.md)")
        if faiss_reason is None and ctx.cuda:
            from ragkit.types import Passage

            stub = [Passage(id=str(i), text="") for i in range(n_docs)]
            dr = DenseRetriever(use_gpu=True, show_progress=False)
            dr.index_vectors(stub, docs.numpy())
            q_np = queries.numpy()
            times, _ = _timed(ctx, lambda: dr.search_vectors(q_np, search_k), 3)
            search["faiss_gpu_flat"] = {"qps": n_queries / _median(times), "s": _median(times)}
        else:
            search["faiss_gpu_skipped"] = faiss_reason or "no CUDA device"
        d_dev, q_dev = docs.to(ctx.device), queries.to(ctx.device)
        chunk = 262144

        def torch_search() -> Any:
            best_s = best_i = None
            for s in range(0, n_docs, chunk):
                sc = q_dev @ d_dev[s:s + chunk].T
                v, i = sc.topk(min(search_k, sc.shape[1]), dim=1)
                i = i + s
                if best_s is None:
                    best_s, best_i = v, i
                else:
                    cat_s, cat_i = torch.cat([best_s, v], 1), torch.cat([best_i, i], 1)
                    best_s, pos = cat_s.topk(search_k, dim=1)
                    best_i = cat_i.gather(1, pos)
            return best_i

        times, top = _timed(ctx, torch_search, 5)
        exact = (queries[:8] @ docs.T).topk(search_k, dim=1).indices
        search["torch_matrix_fp32"] = {"qps": n_queries / _median(times), "s": _median(times),
                                       "top_k_equal_exact_share": float((top[:8].cpu().sort(1).values
                                                                         == exact.sort(1).values).all(1)
                                                                        .float().mean())}
        del d_dev, q_dev, docs, queries
        free_memory()
    best = max(enc_rows.values(), key=lambda r: r["passages_per_s"]) if enc_rows else None
    return {"shape": shape, "params": {"passages": n_passages, "passage_words": passage_words,
                                       "batch_sizes": batch_sizes, "n_docs": n_docs, "n_queries": n_queries,
                                       "k": search_k, "dimension": dim},
            "encode": enc_rows, "search": search, "left_out": left_out, "peak_memory": peak_kind(ctx),
            "headline": {"passages_per_s": best and best["passages_per_s"],
                         "search_qps": search.get("torch_matrix_fp32", {}).get("qps"),
                         "search_backend": "faiss_gpu" if "faiss_gpu_flat" in search else "torch matrix"},
            "targets": {}}


# ----------------------------------------------------------------------------- ragkit serve
def serve(ctx: Ctx, shape: str, docs_levels: list[int], clients: list[int], seconds: float, seq_seconds: float,
          doc_words: int, start_timeout: float) -> dict[str, Any]:
    """``ragkit serve --reranker cross-encoder:DIR`` on the device against the same reranker called sequentially.

    The server is the real command in its own process on 127.0.0.1 (TEI ``/rerank``, a query and
    ``D`` documents per request); ``C`` concurrent asyncio + httpx clients send back to back for
    ``seconds`` per level. The baseline is ``reranker.rank(query, docs)`` in this process, one
    request after the other, measured before and after the served levels (their mean is the
    divisor), on the same device with the same weights.
    """
    import importlib.util

    for mod in ("starlette", "uvicorn", "prometheus_client", "pydantic", "httpx"):
        if importlib.util.find_spec(mod) is None:
            raise Skip(f"{mod} is not installed: the serve extra is missing (carry its wheels: "
                       "benchmarks/gpu/fetch_wheels.py)")
    import httpx

    from ragkit.debias import get_reranker

    folder = _build.cross_encoder(shape, ctx.text, ctx.tmp / f"cross-encoder-{shape}")
    spec = f"cross-encoder:{folder}"
    reranker = get_reranker(spec, device=ctx.device)
    workloads = {d: [{"query": ctx.text.question(), "texts": [ctx.text.sentence(doc_words) for _ in range(d)],
                      "raw_scores": True} for _ in range(64)] for d in docs_levels}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = ctx.tmp / "serve.log"
    cmd = [sys.executable, "-m", "ragkit.cli", "serve", "--reranker", spec, "--device", ctx.device,
           "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    env = dict(os.environ, RAGKIT_NO_PROGRESS="1")
    table: dict[str, Any] = {}
    left_out: list[str] = []
    t_start = time.perf_counter()
    with open(log, "wb") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until_up(proc, url + "/health", start_timeout, log=log, poll=0.25, give_up=lambda: ctx.left() < 3)
        start_s = time.perf_counter() - t_start

        def rank(body: dict[str, Any]) -> Any:
            return reranker.rank(body["query"], body["texts"])

        for d in docs_levels:
            need = 2 * seq_seconds + len(clients) * seconds + 2
            if ctx.left() < need:
                left_out.append(f"docs {d}")
                continue
            w = workloads[d]
            for body in w[:3]:  # warm-up, both sides
                rank(body)
            asyncio.run(load(url, w, 4, min(2.0, seconds), timeout=120))
            before = sequential(rank, w, seq_seconds, 4, after=partial(_sync, ctx))
            served: dict[str, Any] = {}
            for c in clients:
                r0, b0 = batch_counts(url)
                level = asyncio.run(load(url, w, c, seconds, timeout=120))
                r1, b1 = batch_counts(url)
                level["mean_requests_per_batch"] = (r1 - r0) / (b1 - b0) if b1 > b0 else None
                served[str(c)] = level
            after = sequential(rank, w, seq_seconds, 4, after=partial(_sync, ctx))
            base = (before["throughput_rps"] + after["throughput_rps"]) / 2
            for level in served.values():
                level["speedup_vs_sequential"] = level["throughput_rps"] / base if base else None
            table[str(d)] = {"sequential_before": before, "sequential_after": after, "sequential_rps_mean": base,
                             "served": served}
        health = httpx.get(url + "/health?detail=1", timeout=10).json()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    failed = sum(lv["failed"] for b in table.values() for lv in b["served"].values())
    targets = {}
    for d, b in table.items():
        if "8" in b["served"]:
            targets[f"docs{d}_speedup_at_8_clients"] = target(b["served"]["8"]["speedup_vs_sequential"], ">=", 2.0,
                                                              "served requests/s at 8 clients over sequential "
                                                              "in-process rank()")
    targets["failed_requests"] = target(float(failed), "<=", 0.0, "failed requests over all levels")
    head_d = str(max(int(d) for d in table)) if table else None
    return {"shape": shape, "command": " ".join(["ragkit serve", *cmd[4:]]).replace(str(folder), "DIR"),
            "params": {"docs_per_request": docs_levels, "clients": clients, "seconds_per_level": seconds,
                       "sequential_seconds": seq_seconds, "doc_words": doc_words},
            "server_start_s": start_s, "by_docs": table, "failed": failed,
            "server": {"batches": health.get("batches"), "pairs": health.get("pairs"),
                       "settings": health.get("settings")},
            "left_out": left_out,
            "headline": head_d and {"docs": int(head_d),
                                    "rps_at_8": table[head_d]["served"].get("8", {}).get("throughput_rps"),
                                    "speedup_at_8": table[head_d]["served"].get("8", {}).get("speedup_vs_sequential"),
                                    "failed": failed},
            "targets": targets}


def new_tmp() -> Path:
    """A scratch folder for the saved encoders (removed by the caller)."""
    return Path(tempfile.mkdtemp(prefix="ragkit-gpu-kit-"))
