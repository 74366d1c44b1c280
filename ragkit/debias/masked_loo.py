"""A cheap estimator of MoI's leave-one-out question likelihoods: one prefill, passages masked out.

Exact leave-one-out (MoI's default, ``design="loo"``, ``outcome="question"``) scores the question
after ``N + 1`` prompts: the full prompt and the prompt without passage ``i`` for each ``i``. With
the shared-prefix cache each prompt without ``i`` still recomputes every passage after ``i``, about
``N² L / 2`` tokens for ``N`` passages of ``L`` tokens, where UPR needs ``N L``.

This estimator prefills the full prompt's passage block **once** and scores every intervention
from that one cache: the tokens after the block (the cue, e.g. ``"Question:"``) and the question
are run once per intervention with an attention mask that hides the tokens of the passages the
intervention leaves out, at the positions they have in the full prompt:

    o_masked(S) = (1/|q|) Σ_t log p(q_t | q_<t, cue, KV(prefix + block) restricted to S).

Cost: ``|prompt| + M · (|cue| + |q|)`` prefilled tokens for ``M`` interventions, about UPR's.

It is an approximation, not exact leave-one-out: the passages after a hidden passage were encoded
while it was present (their keys and values still carry some of it), the positions keep the gap
it leaves, and the passage numbers ``[j]`` are not renumbered. (Attention masking over a shared
cache is the "KV blocks" family of context-attribution shortcuts; AttriBoT, Liu et al., ICLR 2025,
arXiv 2411.15102, reports such approximations against exact leave-one-out.) Use it where its
fidelity to exact leave-one-out has been measured (Spearman of the utilities, top-K agreement):
``experiments/pipeline`` reports both.

Any presence design whose interventions keep the passages in input order works (``loo``,
``ablate``); the layout is the ``question`` outcome's (:func:`ragkit.generation.question_template`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ragkit.debias.icr import encode_with_spans, passage_layout
from ragkit.debias.outcomes import OutcomeResult
from ragkit.types import Passage

__all__ = ["masked_question_outcomes", "masked_scores"]


def masked_scores(generator: Any, question: str, passages: Sequence[Passage],
                  interventions: Sequence[Sequence[int]]) -> np.ndarray:
    """``o_masked(S_m)`` for each intervention ``S_m`` (increasing passage indices) of one question."""
    import torch
    from transformers import DynamicCache

    from ragkit.generation.handle import forward_logits, handle_of
    from ragkit.generation.prompts import question_template

    h = handle_of(generator, "the masked leave-one-out estimator")
    k = len(passages)
    sets = [[int(i) for i in o] for o in interventions]
    for m, o in enumerate(sets):
        if o != sorted(set(o)) or any(i < 0 or i >= k for i in o):
            raise ValueError(f"intervention {m} ({o}) must list passage indices in increasing order (a subset in "
                             "input order): the masked estimator hides passages of the full prompt, it cannot "
                             "reorder them")
    tmpl = question_template(generator.template)
    prompt, char_spans = passage_layout(generator, tmpl, question, passages, continuations=[question])
    p_ids, (q_ids,), spans = encode_with_spans(generator, prompt, char_spans, [question])
    block_end = max((max(s) + 1 for s in spans if s), default=1)
    cue = p_ids[block_end:]
    row = cue + q_ids
    dev = h.device
    # logits only where they are read: none of the block's (its last one is kept, the least the argument
    # takes), the question's in the rows; full-vocabulary logits of a 3,000-token block cost about a
    # quarter of a 0.5B model's prefill. Every forward is a prefill on the ledger (the block once, the
    # cue + question per row), whatever its width.
    n_read = len(row) - len(cue) + 1
    out = np.zeros(len(sets))
    with torch.inference_mode():
        ids = torch.tensor([p_ids[:block_end]], dtype=torch.long, device=dev)
        _, first = forward_logits(h, ids, torch.ones_like(ids), torch.arange(block_end, device=dev)[None, :],
                                  past=DynamicCache(config=h.model.config), keep=1, prefill=True)
        kv = [(layer.keys, layer.values) for layer in first.layers]
        bs = max(1, h.batch_size)
        r_ids = torch.tensor(row, dtype=torch.long, device=dev)
        pos = (block_end + torch.arange(len(row), device=dev))[None, :]
        tgt = torch.tensor(q_ids, dtype=torch.long, device=dev)
        for start in range(0, len(sets), bs):
            chunk = sets[start:start + bs]
            b = len(chunk)
            mask = torch.ones((b, block_end + len(row)), dtype=torch.long, device=dev)
            for r, keep in enumerate(chunk):
                hidden = [t for i in sorted(set(range(k)) - set(keep)) for t in spans[i]]
                if hidden:
                    mask[r, hidden] = 0
            cache = DynamicCache(ddp_cache_data=[(kk.expand(b, -1, -1, -1), vv.expand(b, -1, -1, -1))
                                                 for kk, vv in kv])
            read, _ = forward_logits(h, r_ids[None, :].expand(b, -1), mask, pos.expand(b, -1), past=cache,
                                     keep=n_read, prefill=True)
            logits = read[:, :-1]  # the positions before each question token
            lp = logits.gather(-1, tgt[None, :, None].expand(b, -1, 1))[..., 0] - torch.logsumexp(logits, dim=-1)
            out[start:start + b] = lp.double().mean(dim=1).cpu().numpy()
    return out


def masked_question_outcomes(generator: Any, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                             orderings: Sequence[Sequence[Sequence[int]]],
                             answers: Sequence[Sequence[str]] | None = None) -> list[OutcomeResult]:
    """An MoI outcome (``MoI(outcome=masked_question_outcomes)``): the masked estimate of the ``question`` outcome.

    One prefill of each question's passage block, then ``M`` short rows (module docstring);
    ``generator_calls`` counts the ``M`` scored rows. ``answers`` is accepted for the outcome
    signature and not used.
    """
    del answers
    res = []
    for q, p, o in zip(questions, passages, orderings):
        res.append(OutcomeResult(values=masked_scores(generator, q, list(p), o), answers=[], target=None,
                                 generator_calls=len(o)))
    return res
