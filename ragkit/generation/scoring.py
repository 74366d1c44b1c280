"""Teacher-forced answer scoring, with the shared prompt prefix computed once per question.

For a prompt ``x`` and an answer ``y = y_1..y_T`` (tokenised together, see
:mod:`ragkit.generation.fitting`)

    log p(y | x) = Σ_t log softmax(z_{|x|+t-1})[y_t]

where ``z`` are the model's own output logits (its ``forward``, so any post-head transform of the
architecture is applied); only the ``T + 1`` last positions of each batch reach the LM head
(``logits_to_keep``): prompts are left-padded and answers right-padded, so the answer positions
are the same columns in every row.

Many orderings of the same passages (Mixture-of-Intervention, Lee et al., "Inference Scaling for
Bridging Retrieval and Augmented Generation", NAACL Findings 2025, arXiv 2412.10684) share
their prompt prefix (instruction + question): :func:`score_orderings` runs that prefix once per
question and reuses its key/value cache for every ordering. Presence interventions share more:
the prompt without passage ``p`` equals the full prompt up to ``p`` (leave-one-out attribution
with a shared key/value prefix, AttriBoT: Liu et al., "AttriBoT: A Bag of Tricks for Efficiently
Approximating Leave-One-Out Context Attribution", ICLR 2025, arXiv 2411.15102). So each query
caches one *reference* row's prefix (:func:`prefix_plan`) and every row reuses the part it shares
with that row (its own length ``l_m``, masked beyond), recomputing only the rest: the tokens a
query costs are ``P + Σ_m (|x_m| - l_m)`` with ``P = max_{m ≠ ref} l_m``. :func:`run_orderings` goes further
(one prefill per ordering): it generates each ordering's answer from that cache and then scores
candidate answers as continuations of each ordering's cached prompt, so an ordering's passages are
never prefilled twice. Its greedy decoding stacks prefill batches up to the generator's
``decode_batch_size`` rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.batching import length_buckets
from ragkit.generation.base import CandidateFn, OrderingRun, ScoreResult
from ragkit.generation.decoding import Prefilled, decode_prefilled, decode_rows, finish_text, generate
from ragkit.generation.fitting import answer_text, encode_answers, encode_prompts, fit_prompt_ids
from ragkit.generation.handle import ModelHandle, cache_ok, chunks, crop, forward_logits, layout, positions
from ragkit.generation.layout import PromptSettings, candidate_rounds, ordering_inputs, ordering_prompts, per_query
from ragkit.io import progress
from ragkit.text import extract_answer
from ragkit.types import Passage

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ragkit.generation.prompts import PromptTemplate

logger = logging.getLogger(__name__)

#: The fixed cost of one forward, in token-equivalents, traded against padding when rows are cut
#: into length buckets (:func:`ragkit.batching.length_buckets`); a decoding batch pays it per step.
FORWARD_COST_TOKENS = 32

__all__ = ["score", "score_orderings", "run_orderings", "common_prefix_len", "prefix_plan"]


# ----------------------------------------------------------------------------- helpers
def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Longest common token prefix, leaving at least one prompt token in every suffix."""
    first = seqs[0]
    lcp = min(len(s) for s in seqs) - 1
    for s in seqs[1:]:
        k = 0
        while k < lcp and s[k] == first[k]:
            k += 1
        lcp = k
    return max(lcp, 1) if min(len(s) for s in seqs) > 1 else 0


def prefix_plan(seqs: Sequence[Sequence[int]]) -> tuple[int, list[int]]:
    """Reference row and the prefix length each row reuses from its key/value cache.

    For a reference row ``r``, row ``m`` reuses ``l_m = min(lcp(x_m, x_r), |x_m| - 1, P)`` tokens,
    where ``P = max_{m ≠ r} min(lcp(x_m, x_r), |x_m| - 1)`` is the length of the cached prefix (the
    reference row itself reuses ``P``; a single row reuses all but its last token). ``r`` maximises
    ``Σ_m l_m``, the prompt tokens not recomputed (ties: the first row). Permutations share only
    the instruction and question, so ``l_m`` is their common prefix (:func:`common_prefix_len`);
    leave-one-out rows share everything before the passage they drop. Rows of one token reuse 0.
    """
    m = len(seqs)
    lens = np.array([len(s) for s in seqs], dtype=np.int64)
    if m == 1:
        return 0, [int(max(lens[0] - 1, 0))]
    width = int(lens.max())
    arr = np.full((m, width), -1, dtype=np.int64)
    for i, s in enumerate(seqs):
        arr[i, : len(s)] = s
    best: tuple[int, list[int]] = (0, [0] * m)
    best_total = -1
    for r in range(m):
        same = (arr == arr[r]) & (arr >= 0)
        lcp = np.where(same.all(axis=1), lens, np.argmin(same, axis=1))
        own = np.minimum(np.minimum(lcp, lens - 1), lens[r])
        others = np.delete(own, r)
        big_p = int(others.max()) if others.size else 0
        plan = np.minimum(own, big_p)
        plan[r] = min(big_p, int(lens[r]) - 1)
        plan = np.maximum(plan, 0)
        total = int(plan.sum())
        if total > best_total:
            best, best_total = (r, [int(x) for x in plan]), total
    return best


def _score_rows(
    h: ModelHandle,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    answers: Sequence[Sequence[int]],
    past: Any = None,
) -> list[np.ndarray]:
    """Answer-token log-probs for a :func:`_layout` batch (answers in the last ``wa`` columns)."""
    import torch

    wa = max(len(a) for a in answers)
    logits, _ = forward_logits(h, input_ids, attention_mask, position_ids, past=past, keep=wa + 1)
    dev = logits.device
    rows = torch.tensor([r for r, a in enumerate(answers) for _ in a], device=dev, dtype=torch.long)
    cols = torch.tensor([t for a in answers for t in range(len(a))], device=dev, dtype=torch.long)
    tgt = torch.tensor([x for a in answers for x in a], device=dev, dtype=torch.long)
    sel = logits[rows, cols]
    lp = (sel.gather(-1, tgt[:, None])[:, 0] - torch.logsumexp(sel, dim=-1)).double().cpu().numpy()
    out: list[np.ndarray] = []
    off = 0
    for a in answers:
        out.append(lp[off:off + len(a)])
        off += len(a)
    return out


def _encode_scored(h: ModelHandle, prompts: Sequence[str], answers: Sequence[str], what: Sequence[str]
                   ) -> tuple[list[list[int]], list[list[int]]]:
    """Joint tokenisation, checks and fitting of (prompt, answer) pairs."""
    texts = [answer_text(p, a, i) for i, (p, a) in enumerate(zip(prompts, answers))]
    p_ids, a_ids = encode_answers(h.tokenizer, prompts, texts)
    for i, a in enumerate(a_ids):
        if not a:
            raise ValueError(f"{what[i]}: the answer {answers[i]!r} tokenises to nothing; pass a non-empty answer")
        if len(a) >= h.max_length:
            raise ValueError(f"{what[i]}: the answer has {len(a)} tokens, more than the context window "
                             f"{h.max_length}")
        p_ids[i] = fit_prompt_ids(p_ids[i], h.max_length - len(a), f"{what[i]} prompt", h.max_length)
    return p_ids, a_ids


def score(h: ModelHandle, prompts: Sequence[str], answers: Sequence[str]) -> ScoreResult:
    """:meth:`ragkit.generation.Generator.score` (see there)."""

    prompts, answers = list(prompts), list(answers)
    if len(prompts) != len(answers):
        raise ValueError(f"score() got {len(prompts)} prompts but {len(answers)} answers; pass one answer per prompt")
    if not prompts:
        return ScoreResult.from_token_logprobs([])
    p_ids, a_ids = _encode_scored(h, prompts, answers, [f"answer {i}" for i in range(len(prompts))])
    return ScoreResult.from_token_logprobs(_score_ids(h, p_ids, a_ids, desc="score"))


def _score_ids(h: ModelHandle, p_ids: Sequence[Sequence[int]], a_ids: Sequence[Sequence[int]],
               desc: str = "score") -> list[np.ndarray]:
    import torch

    result: list[np.ndarray] = [np.empty(0)] * len(p_ids)
    batches = length_buckets([len(p) + len(a) for p, a in zip(p_ids, a_ids)], h.batch_size,
                             forward_cost_tokens=FORWARD_COST_TOKENS)
    with torch.inference_mode():
        for idx in progress(batches, show=h.show_progress, desc=desc, leave=False):
            ids, mask = layout(h, [p_ids[i] for i in idx], [a_ids[i] for i in idx])
            rows = _score_rows(h, ids, mask, positions(mask), [a_ids[i] for i in idx])
            for i, r in zip(idx, rows):
                result[i] = r
    return result


# ----------------------------------------------------------------------------- orderings
def _groups(p_ids: Sequence[Sequence[Sequence[int]]], batch_size: int) -> list[list[int]]:
    """Queries grouped so that each group's orderings fill about one batch (longest first)."""
    groups: list[list[int]] = []
    cur: list[int] = []
    rows_in_cur = 0
    for q in sorted(range(len(p_ids)), key=lambda q: -max(len(p) for p in p_ids[q])):
        mq = len(p_ids[q])
        if cur and rows_in_cur + mq > batch_size:
            groups.append(cur)
            cur, rows_in_cur = [], 0
        cur.append(q)
        rows_in_cur += mq
    if cur:
        groups.append(cur)
    return groups


Plan = tuple[int, list[int]]  # (reference row, prefix length reused by each row): prefix_plan()


def _prefix_cache(h: ModelHandle, queries: Sequence[int], p_ids: Sequence[Sequence[Sequence[int]]],
                  plans: Sequence[Plan]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Key/value tensors of the queries' cached prefixes (each its reference row's, right-padded),
    computed ``h.batch_size`` queries per forward."""
    import torch
    from transformers import DynamicCache

    prefixes = [p_ids[q][plans[q][0]][: max(plans[q][1])] for q in queries]
    parts = []
    for b in chunks(len(prefixes), h.batch_size):
        ids, mask = layout(h, [[] for _ in b], [prefixes[j] for j in b])
        _, cache = forward_logits(h, ids, mask, positions(mask), past=DynamicCache(config=h.model.config), keep=1)
        parts.append([(layer.keys, layer.values) for layer in cache.layers])
    if len(parts) == 1:
        return parts[0]
    width = max(kv[0][0].shape[2] for kv in parts)

    def right_pad(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[2]))

    return [(torch.cat([right_pad(kv[i][0]) for kv in parts]), torch.cat([right_pad(kv[i][1]) for kv in parts]))
            for i in range(len(parts[0]))]


def _row_cache(h: ModelHandle, kv: Sequence[tuple[torch.Tensor, torch.Tensor]], idx: torch.Tensor,
               reuse: Sequence[int]) -> tuple[Any, torch.Tensor]:
    """A batch's cache: its queries' prefixes cut to the longest reuse of the batch, and the mask
    over those columns (row ``i`` sees its first ``reuse[i]`` cached positions)."""
    import torch
    from transformers import DynamicCache

    width = max(1, max(reuse))
    cache = DynamicCache(ddp_cache_data=[(k.index_select(0, idx)[:, :, :width], v.index_select(0, idx)[:, :, :width])
                                         for k, v in kv])
    lim = torch.tensor(list(reuse), device=h.device, dtype=torch.long)
    return cache, (torch.arange(width, device=h.device)[None, :] < lim[:, None]).long()


def score_orderings(
    h: ModelHandle,
    settings: PromptSettings,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage | str]],
    orderings: Sequence[Sequence[Sequence[int]]],
    answers: Sequence[str | Sequence[str]],
    template: PromptTemplate | None = None,
) -> list[ScoreResult]:
    """:meth:`ragkit.generation.Generator.score_orderings` (see there): the prompts laid out with
    ``settings``, run through the model of ``h``."""
    import torch

    prompts, ans = ordering_inputs(settings, questions, passages, orderings, answers, template)
    n = len(prompts)
    flat_p = [p for ps_ in prompts for p in ps_]
    flat_a = [a for as_ in ans for a in as_]
    what = [f"query {q} ordering {m}" for q in range(n) for m in range(len(prompts[q]))]
    p_flat, a_flat = _encode_scored(h, flat_p, flat_a, what)
    if not cache_ok(h):
        logger.info("model cache layout does not allow prefix reuse; scoring orderings without it")
        return per_query(_score_ids(h, p_flat, a_flat, desc="score orderings"), [len(ps_) for ps_ in prompts])
    p_ids: list[list[list[int]]] = []
    a_ids: list[list[list[int]]] = []
    off = 0
    for ps_ in prompts:
        p_ids.append(p_flat[off:off + len(ps_)])
        a_ids.append(a_flat[off:off + len(ps_)])
        off += len(ps_)
    plans = [prefix_plan(p_ids[q]) for q in range(n)]
    results: list[list[np.ndarray]] = [[np.empty(0)] * len(p_ids[q]) for q in range(n)]
    with torch.inference_mode():
        for g in progress(_groups(p_ids, h.batch_size), show=h.show_progress, desc="score orderings",
                          leave=False):
            _score_group(h, g, p_ids, a_ids, plans, results)
    return [ScoreResult.from_token_logprobs(r) for r in results]


def _score_group(
    h: ModelHandle,
    group: Sequence[int],
    p_ids: list[list[list[int]]],
    a_ids: list[list[list[int]]],
    plans: Sequence[Plan],
    results: list[list[np.ndarray]],
) -> None:
    """Prefix forward once for the group's queries, then suffix + answer for all their orderings."""
    import torch

    dev = h.device
    reuse = {(q, m): plans[q][1][m] for q in group for m in range(len(p_ids[q]))}
    with_prefix = [q for q in group if max(plans[q][1]) > 0]
    local = {q: j for j, q in enumerate(with_prefix)}
    rows = [(q, m) for q in group for m in range(len(p_ids[q]))]
    # rows that reuse nothing (one-token prompts, or nothing shared) are scored without the cache
    plain = [r for r in rows if reuse[r] == 0]
    cached = [r for r in rows if reuse[r] > 0]
    if plain:
        res = _score_ids(h, [p_ids[q][m] for q, m in plain], [a_ids[q][m] for q, m in plain])
        for (q, m), r in zip(plain, res):
            results[q][m] = r
    if not cached:
        return
    kv = _prefix_cache(h, with_prefix, p_ids, plans)
    # rows cut into length buckets by what they still compute (suffix + answer), so that a row
    # reusing most of the prompt is not padded to one that reuses little
    work = [len(p_ids[q][m]) - reuse[(q, m)] + len(a_ids[q][m]) for q, m in cached]
    for b in length_buckets(work, h.batch_size, forward_cost_tokens=FORWARD_COST_TOKENS):
        sel = [cached[j] for j in b]
        idx = torch.tensor([local[q] for q, _ in sel], device=dev, dtype=torch.long)
        ids, mask = layout(h, [p_ids[q][m][reuse[(q, m)]:] for q, m in sel], [a_ids[q][m] for q, m in sel])
        cache, pre_mask = _row_cache(h, kv, idx, [reuse[r] for r in sel])
        full_mask = torch.cat([pre_mask, mask], dim=1)
        offs = torch.tensor([reuse[r] for r in sel], device=dev, dtype=torch.long)
        out = _score_rows(h, ids, full_mask, positions(mask, offs), [a_ids[q][m] for q, m in sel], past=cache)
        for (q, m), r in zip(sel, out):
            results[q][m] = r


# ----------------------------------------------------------------------------- one prefill per ordering
def run_orderings(
    h: ModelHandle,
    settings: PromptSettings,
    questions: Sequence[str],
    passages: Sequence[Sequence[Passage | str]],
    orderings: Sequence[Sequence[Sequence[int]]],
    candidates: CandidateFn | None = None,
    max_new_tokens: int = 16,
    stop: Sequence[str] | None = None,
    min_new_tokens: int = 0,
) -> list[OrderingRun]:
    """:meth:`ragkit.generation.Generator.run_orderings` (see there): the prompts laid out with
    ``settings``, run through the model of ``h``."""
    import torch

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stops = [s for s in (stop if stop is not None else settings.template.stop) if s]
    prompts = ordering_prompts(settings, questions, passages, orderings)
    n = len(prompts)
    room = h.max_length - max_new_tokens
    if room < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room in the context window {h.max_length}")
    p_ids = [[fit_prompt_ids(p, room, f"query {q} ordering {m}", h.max_length)
              for m, p in enumerate(encode_prompts(h.tokenizer, ps))] for q, ps in enumerate(prompts)]
    plans = [prefix_plan(p) for p in p_ids]
    use_cache = cache_ok(h)
    runs: list[OrderingRun | None] = [None] * n
    plain = [q for q in range(n) if not use_cache or max(plans[q][1]) == 0]
    if plain:
        flat = [prompts[q][m] for q in plain for m in range(len(prompts[q]))]
        outs = generate(h, flat, max_new_tokens=max_new_tokens, stop=stops, min_new_tokens=min_new_tokens)
        off = 0
        for q in plain:
            mq = len(prompts[q])
            runs[q] = OrderingRun(answers=[extract_answer(str(o)) for o in outs[off:off + mq]])
            off += mq
    # rows to score outside the cache: (query, ordering, round, answer)
    fallback: list[tuple[int, int, int, str]] = []
    cached_q = [q for q in range(n) if q not in set(plain)]
    lps: dict[tuple[int, int, int], np.ndarray] = {}
    with torch.inference_mode():
        for g in progress(_groups([p_ids[q] for q in cached_q], decode_rows(h)), show=h.show_progress,
                          desc="run orderings", leave=False):
            group = [cached_q[j] for j in g]
            _run_group(h, group, prompts, p_ids, plans, max_new_tokens, stops, candidates, runs,
                       lps, fallback, min_new_tokens)
    for q in plain:
        run = runs[q]
        assert run is not None
        if candidates is not None:
            run.candidates = candidate_rounds(candidates(q, list(run.answers)), len(prompts[q]), q)
            for j, rnd in enumerate(run.candidates):
                fallback += [(q, m, j, c) for m, c in enumerate(rnd) if c.strip()]
    if fallback:
        res = score(h, [prompts[q][m] for q, m, _, _ in fallback], [c for _, _, _, c in fallback])
        for (q, m, j, _), r in zip(fallback, res.token_logprobs):
            lps[(q, m, j)] = r
    out: list[OrderingRun] = []
    for q in range(n):
        run = runs[q]
        assert run is not None
        for j, rnd in enumerate(run.candidates):
            run.scores.append(ScoreResult.from_token_logprobs(
                [lps.get((q, m, j), np.empty(0)) for m in range(len(rnd))]))
        out.append(run)
    return out


def _run_group(
    h: ModelHandle,
    group: Sequence[int],
    prompts: Sequence[Sequence[str]],
    p_ids: Sequence[Sequence[Sequence[int]]],
    plans: Sequence[Plan],
    max_new_tokens: int,
    stops: Sequence[str],
    candidates: CandidateFn | None,
    runs: list[OrderingRun | None],
    lps: dict[tuple[int, int, int], np.ndarray],
    fallback: list[tuple[int, int, int, str]],
    min_new_tokens: int = 0,
) -> None:
    """Prefix once, each ordering's suffix once + greedy decoding, then candidates from the caches.

    The suffixes are prefilled ``h.batch_size`` rows at a time (length buckets) and decoded
    :func:`~ragkit.generation.decoding.decode_rows` rows at a time (the prefilled batches' caches
    stacked: :func:`~ragkit.generation.decoding.decode_prefilled`).
    """
    import torch

    dev = h.device
    local = {q: j for j, q in enumerate(group)}
    kv = _prefix_cache(h, group, p_ids, plans)
    rows = [(q, m) for q in group for m in range(len(p_ids[q]))]
    states = []
    tokens: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
    work = [len(p_ids[q][m]) - plans[q][1][m] for q, m in rows]

    def prefilled() -> Iterator[Prefilled]:
        # a bucket decoded alone pays the forward's fixed cost at every decoding step too
        alone = decode_rows(h) == h.batch_size
        cost = FORWARD_COST_TOKENS * (1 + max_new_tokens) if alone else FORWARD_COST_TOKENS
        for b in length_buckets(work, h.batch_size, forward_cost_tokens=cost):
            sel = [rows[j] for j in b]
            idx = torch.tensor([local[q] for q, _ in sel], device=dev, dtype=torch.long)
            reuse = [plans[q][1][m] for q, m in sel]
            ids, mask = layout(h, [p_ids[q][m][r:] for (q, m), r in zip(sel, reuse)], [[] for _ in sel])
            cache, pre_mask = _row_cache(h, kv, idx, reuse)
            full_mask = torch.cat([pre_mask, mask], dim=1)
            pos = positions(mask, torch.tensor(reuse, device=dev, dtype=torch.long))
            logits, cache = forward_logits(h, ids, full_mask, pos, past=cache, keep=1)
            yield Prefilled(sel, cache, full_mask, logits[:, -1], ids[:, -1], pos[:, -1])

    for batch, new, logps in decode_prefilled(h, prefilled(), decode_rows(h), max_new_tokens, stops,
                                              min_new_tokens=min_new_tokens):
        sel, cache, full_mask, _, last_ids, last_pos = batch
        for (q, m), t, lp in zip(sel, new, logps):
            tokens[(q, m)] = (t, lp)
        if candidates is not None:
            width = full_mask.shape[1]
            crop(cache, width - 1)  # the prompt without its last token, which each round re-feeds
            states.append((sel, cache, full_mask[:, :-1], last_ids, last_pos))
    for q in group:
        texts = [finish_text(h, tokens[(q, m)][0], stops) for m in range(len(p_ids[q]))]
        runs[q] = OrderingRun(answers=[extract_answer(t) for t in texts])
    if candidates is None:
        return
    for q in group:
        run = runs[q]
        assert run is not None
        run.candidates = candidate_rounds(candidates(q, list(run.answers)), len(p_ids[q]), q)
    for sel, cache, mask, last_tok, last_pos in states:
        width = mask.shape[1]
        n_rounds = max(len(runs[q].candidates) for q, _ in sel)  # type: ignore[union-attr]
        for j in range(n_rounds):
            need: list[list[int]] = []
            for q, m in sel:
                run = runs[q]
                assert run is not None
                c = run.candidates[j][m] if j < len(run.candidates) else ""
                a: list[int] = []
                if c.strip():
                    p_joint, a_ids = encode_answers(h.tokenizer, [prompts[q][m]],
                                                    [answer_text(prompts[q][m], c, m)])
                    gen_t, gen_lp = tokens[(q, m)]
                    if not a_ids[0] or p_joint[0] != list(p_ids[q][m]):
                        fallback.append((q, m, j, c))
                    elif gen_t[:len(a_ids[0])] == a_ids[0]:  # the greedy answer itself: its log-probs are known
                        lps[(q, m, j)] = np.asarray(gen_lp[:len(a_ids[0])], dtype=np.float64)
                    else:
                        a = a_ids[0]
                need.append(a)
            if not any(need):
                continue
            wa = max(len(a) for a in need)
            ids = torch.full((len(sel), 1 + wa), h.pad_id, dtype=torch.long)
            new_mask = torch.zeros((len(sel), 1 + wa), dtype=torch.long)
            for r, a in enumerate(need):
                if a:
                    ids[r, 1:1 + len(a)] = torch.tensor(a, dtype=torch.long)
                    new_mask[r, : 1 + len(a)] = 1
            ids, new_mask = ids.to(dev), new_mask.to(dev)
            ids[:, 0] = last_tok
            pos = last_pos[:, None] + torch.arange(1 + wa, device=dev)[None, :]
            logits, _ = forward_logits(h, ids, torch.cat([mask, new_mask], dim=1), pos, past=cache, keep=1 + wa)
            crop(cache, width)
            lsm = logits[:, :wa] - torch.logsumexp(logits[:, :wa], dim=-1, keepdim=True)
            for r, ((q, m), a) in enumerate(zip(sel, need)):
                if a:
                    lps[(q, m, j)] = lsm[r, torch.arange(len(a), device=dev),
                                         torch.tensor(a, device=dev)].double().cpu().numpy()
