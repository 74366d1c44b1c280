"""Decoding: batched greedy / nucleus generation with a key/value cache, through the model's own forward.

Every forward goes through the model's ``*ForCausalLM.forward`` (with ``logits_to_keep`` when the
model supports it, so only the needed positions reach the LM head): the logits therefore include
whatever the architecture applies after its head (Cohere's ``logit_scale``, Granite's
``logits_scaling``, Gemma 2's ``final_logit_softcapping``, MiniCPM's scaling).

Sampling draws from ``softmax(logits / T)`` restricted to the smallest token set with probability
mass ``>= top_p`` (nucleus sampling, Holtzman et al., "The Curious Case of Neural Text
Degeneration", ICLR 2020).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ragkit.generation.fitting import answer_text, encode_answers, encode_prompts, fit_prompt_ids
from ragkit.generation.handle import ModelHandle, cache_ok, chunks, crop, forward_logits, layout, positions
from ragkit.io import progress
from ragkit.text import cut_at_stop

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

__all__ = ["Prefilled", "decode_loop", "decode_prefilled", "decode_rows", "finish_text", "generate", "pick",
           "verify_drafts"]


def pick(logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator | None) -> torch.Tensor:
    """Next tokens: argmax when ``temperature == 0``, else nucleus sampling (module docstring)."""
    import torch

    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p
        sp = sp * keep
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.multinomial(probs, 1, generator=rng)[:, 0]


def decode_loop(
    h: ModelHandle,
    past: Any,
    step_ids: torch.Tensor,
    mask: torch.Tensor,
    step_pos: torch.Tensor,
    max_new_tokens: int,
    stops: Sequence[str],
    temperature: float = 0.0,
    top_p: float = 1.0,
    rng: torch.Generator | None = None,
    min_new_tokens: int = 0,
    logits: torch.Tensor | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Decode from ``step_ids`` (the prompt tokens not yet in ``past``) until EOS / stop / length.

    The prompt must end in the last column for every row (left padding). Returns the new tokens
    of each row (EOS excluded) and the log-probability of each under the model's distribution
    (before any ``min_new_tokens`` masking). ``past`` is extended in place.

    ``logits``: the float logits ``(B, V)`` of each row's last prompt token when the whole prompt is
    already in ``past`` (a prefill run apart, so that decoding can batch more rows than a prefill
    fits); ``mask`` then covers ``past`` only, ``step_pos`` holds each row's last prompt position
    ``(B, 1)`` and ``step_ids`` is not read.
    """
    import torch

    dev = step_ids.device
    n = step_ids.shape[0]
    eos = torch.tensor(h.eos_ids or [-1], device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    new: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    for step in range(max_new_tokens):
        if step == 0 and logits is not None:
            logits = logits.clone()  # the EOS masking below writes into it
        else:
            out, past = forward_logits(h, step_ids, mask, step_pos, past=past, keep=1)
            logits = out[:, -1]
        lsm = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        if step < min_new_tokens and h.eos_ids:
            logits[:, eos] = float("-inf")
        nxt = pick(logits, temperature, top_p, rng)
        nxt = torch.where(done, torch.full_like(nxt, h.pad_id), nxt)
        is_eos = torch.isin(nxt, eos) & ~done
        nxt_lp = lsm.gather(-1, nxt[:, None])[:, 0].tolist()
        nxt_list = nxt.tolist()
        done_list = done.tolist()
        eos_list = is_eos.tolist()
        for r in range(n):
            if done_list[r] or eos_list[r]:
                continue
            new[r].append(nxt_list[r])
            logps[r].append(float(nxt_lp[r]))
            if stops and cut_at_stop(h.tokenizer.decode(new[r], skip_special_tokens=True), stops) is not None:
                eos_list[r] = True
        done = done | torch.tensor(eos_list, device=dev)
        if bool(done.all()):
            break
        step_pos = step_pos[:, -1:] + 1
        step_ids = nxt[:, None]
        mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=dev)], dim=1)
    return new, logps


def decode_rows(h: ModelHandle) -> int:
    """Rows of one greedy decoding batch: ``h.decode_batch_size``, at least ``h.batch_size``."""
    return max(h.batch_size, h.decode_batch_size or h.batch_size)


class Prefilled(NamedTuple):
    """A batch whose prompts are all in ``cache``: the caller's row ids, the mask over the cache, and
    per row the last prompt position's float logits ``(B, V)``, token ``(B,)`` and position ``(B,)``."""

    rows: list[Any]
    cache: Any
    mask: torch.Tensor
    logits: torch.Tensor
    last_ids: torch.Tensor
    last_pos: torch.Tensor


def _stack(parts: Sequence[Prefilled]) -> Prefilled:
    """One batch of several prefilled ones: caches and masks left-padded to the widest, rows stacked.

    Every row's prompt then ends in the last column, as :func:`decode_loop` needs; the padding
    columns are masked out and the positions are the rows' own, so each row decodes what it would
    alone, up to float error.
    """
    import torch
    from transformers import DynamicCache

    if len(parts) == 1:
        return parts[0]
    width = max(p.mask.shape[1] for p in parts)

    def left_pad(x: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.nn.functional.pad(x, [0, 0] * (x.dim() - 1 - dim) + [width - x.shape[dim], 0])

    layers = [[(layer.keys, layer.values) for layer in p.cache.layers] for p in parts]
    cache = DynamicCache(ddp_cache_data=[(torch.cat([left_pad(kv[i][0], 2) for kv in layers]),
                                          torch.cat([left_pad(kv[i][1], 2) for kv in layers]))
                                         for i in range(len(layers[0]))])
    return Prefilled([r for p in parts for r in p.rows], cache, torch.cat([left_pad(p.mask, 1) for p in parts]),
                     torch.cat([p.logits for p in parts]), torch.cat([p.last_ids for p in parts]),
                     torch.cat([p.last_pos for p in parts]))


def decode_prefilled(
    h: ModelHandle,
    parts: Iterable[Prefilled],
    max_rows: int,
    max_new_tokens: int,
    stops: Sequence[str],
    min_new_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    rng: torch.Generator | None = None,
) -> Iterator[tuple[Prefilled, list[list[int]], list[list[float]]]]:
    """Decoding of prefilled batches (greedy unless ``temperature``), consecutive ones stacked while
    their rows fit ``max_rows``.

    ``parts`` is read lazily, so at most ``max_rows`` rows of caches (plus one batch) are held. Yields
    each stacked batch (its cache then holds the prompts and the generated tokens) with the new
    tokens and their log-probs per row, as :func:`decode_loop` returns them.
    """
    pending: list[Prefilled] = []

    def run() -> tuple[Prefilled, list[list[int]], list[list[float]]]:
        st = _stack(pending)
        new, logps = decode_loop(h, st.cache, st.last_ids[:, None], st.mask, st.last_pos[:, None], max_new_tokens,
                                 stops, temperature, top_p, rng, min_new_tokens, logits=st.logits)
        return st, new, logps

    for part in parts:
        if pending and sum(len(p.rows) for p in pending) + len(part.rows) > max_rows:
            yield run()
            pending = []
        pending.append(part)
    if pending:
        yield run()


def finish_text(h: ModelHandle, tokens: Sequence[int], stops: Sequence[str]) -> str:
    """Decoded text of generated tokens, cut at the first stop string."""
    text = h.tokenizer.decode(list(tokens), skip_special_tokens=True)
    cut = cut_at_stop(text, stops) if stops else None
    return text if cut is None else text[:cut]


def _prefill(h: ModelHandle, seqs: Sequence[Sequence[int]], rows: list[Any]) -> Prefilled:
    """Left-padded prompts through one forward into a new cache."""
    from transformers import DynamicCache

    ids, mask = layout(h, seqs, [[] for _ in seqs])
    pos = positions(mask)
    logits, cache = forward_logits(h, ids, mask, pos, past=DynamicCache(config=h.model.config), keep=1)
    return Prefilled(rows, cache, mask, logits[:, -1], ids[:, -1], pos[:, -1])


def generate(
    h: ModelHandle,
    prompts: Sequence[str],
    max_new_tokens: int = 32,
    stop: Sequence[str] | None = None,
    temperature: float = 0.0,
    n: int = 1,
    seed: int = 0,
    top_p: float = 1.0,
    min_new_tokens: int = 0,
) -> list[str] | list[list[str]]:
    """:meth:`ragkit.generation.Generator.generate` on a model handle (see there)."""
    import torch

    prompts = list(prompts)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if n > 1 and temperature == 0:
        logger.warning("n=%d samples with temperature=0 are identical greedy answers", n)
    stops = [s for s in (stop or []) if s]
    if not prompts:
        return []
    p_ids = encode_prompts(h.tokenizer, prompts)
    room = h.max_length - max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room in the context window {h.max_length}")
    p_ids = [fit_prompt_ids(p, room, f"prompt {i}", h.max_length) for i, p in enumerate(p_ids)]
    rows = [(i, s) for i in range(len(prompts)) for s in range(n)]
    order = sorted(range(len(rows)), key=lambda r: -len(p_ids[rows[r][0]]))
    texts: list[str] = [""] * len(rows)
    rng = torch.Generator(device=h.device).manual_seed(int(seed)) if temperature > 0 else None

    def prefilled() -> Iterator[Prefilled]:
        for b in progress(list(chunks(len(order), h.batch_size)), show=h.show_progress, desc="generate", leave=False):
            idx = [order[j] for j in b]
            yield _prefill(h, [p_ids[rows[r][0]] for r in idx], idx)

    # sampling decodes each prefill batch alone, so that a seed's draws do not depend on decode_rows(h)
    rows_per_step = decode_rows(h) if temperature == 0 else h.batch_size
    with torch.inference_mode():
        for st, new, _ in decode_prefilled(h, prefilled(), rows_per_step, max_new_tokens, stops, min_new_tokens,
                                           temperature, top_p, rng):
            for r, t in zip(st.rows, new):
                texts[r] = finish_text(h, t, stops)
    if n == 1:
        return texts
    return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]


def verify_drafts(
    h: ModelHandle,
    prompts: Sequence[str],
    drafts: Sequence[str | None],
    max_new_tokens: int,
    stops: Sequence[str],
    min_new_tokens: int = 0,
) -> list[str | None]:
    """Greedy continuations of prompts that carry a draft answer, decoded in one forward when the draft holds.

    Greedy speculative decoding (Leviathan et al., "Fast Inference from Transformers via
    Speculative Decoding", ICML 2023) with an external draft: the draft ``d`` (tokenised with its
    prompt) is accepted when ``argmax z_{|x|+j-1} = d_j`` for every ``j`` (EOS masked for the
    first ``min_new_tokens`` steps), no proper prefix of ``d`` already hits a stop string, and the
    token ``t = argmax z_{|x|+|d|-1}`` after it ends decoding (EOS, or a stop string in
    ``decode(d + [t])``) or ``|d|`` is ``max_new_tokens``. The result is then exactly what
    :func:`generate` returns (cut at the stop string), at the cost of one prefill of ``x + d``
    instead of ``|d| + 1`` decode steps. A rejected draft costs nothing more: its row is decoded
    greedily from the prompt's cache of that same forward (a sliding-window cache, which cannot be
    rolled back, leaves the row ``None``). Prompts without a usable draft give ``None`` (the caller
    generates them).
    """
    import torch
    from transformers import DynamicCache

    out: list[str | None] = [None] * len(prompts)
    room = h.max_length - max_new_tokens
    rows: list[tuple[int, list[int], list[int]]] = []
    eos = set(h.eos_ids)
    for i, (p, d) in enumerate(zip(prompts, drafts)):
        if not d or not d.strip():
            continue
        p_ids, a_ids = encode_answers(h.tokenizer, [p], [answer_text(p, d, i)])
        a = a_ids[0]
        if (not a or len(a) > max_new_tokens or len(p_ids[0]) > room or eos.intersection(a)
                or p_ids[0] != encode_prompts(h.tokenizer, [p])[0]):
            continue
        if any(cut_at_stop(h.tokenizer.decode(a[:j], skip_special_tokens=True), stops) is not None
               for j in range(1, len(a))):
            continue
        rows.append((i, p_ids[0], a))
    if not rows:
        return out
    eos_t = list(eos)
    with torch.inference_mode():
        for b in chunks(len(rows), h.batch_size):
            sel = [rows[j] for j in b]
            ids, mask = layout(h, [p for _, p, _ in sel], [a for _, _, a in sel])
            wa = max(len(a) for _, _, a in sel)
            wp = ids.shape[1] - wa
            pos = positions(mask)
            cache = DynamicCache(config=h.model.config)
            logits, cache = forward_logits(h, ids, mask, pos, past=cache, keep=wa + 1)
            rejected: list[int] = []
            for r, (i, _, a) in enumerate(sel):
                lg = logits[r, : len(a) + 1].clone()
                if eos_t and min_new_tokens > 0:
                    lg[: min_new_tokens, eos_t] = float("-inf")
                pred = lg.argmax(dim=-1).tolist()
                text: str | None = None
                if pred[: len(a)] == a:
                    if cut_at_stop(h.tokenizer.decode(a, skip_special_tokens=True), stops) is not None:
                        text = finish_text(h, a, stops)  # the draft's last token completes a stop string
                    elif len(a) == max_new_tokens:  # decoding would stop here on length
                        text = finish_text(h, a, stops)
                    elif pred[len(a)] in eos:
                        text = finish_text(h, a, stops)
                    else:
                        full = h.tokenizer.decode(a + [pred[len(a)]], skip_special_tokens=True)
                        cut = cut_at_stop(full, stops) if stops else None
                        text = None if cut is None else full[:cut]
                if text is None:
                    rejected.append(r)
                else:
                    out[i] = text
            if rejected and cache_ok(h):
                # decode the rejected rows from the prompt part of this forward's cache (a sliding-window
                # cache cannot be rolled back: those rows stay None and the caller generates them)
                crop(cache, wp - 1)
                sel_idx = torch.tensor(rejected, device=ids.device, dtype=torch.long)
                cache.batch_select_indices(sel_idx)
                new, _ = decode_loop(h, cache, ids[sel_idx, wp - 1:wp], mask[sel_idx, :wp],
                                     pos[sel_idx, wp - 1:wp], max_new_tokens, stops, min_new_tokens=min_new_tokens)
                for r, t in zip(rejected, new):
                    out[sel[r][0]] = finish_text(h, t, stops)
    return out
