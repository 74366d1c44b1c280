"""From text to token ids that fit the context window: prompts, answers and passage truncation.

Answers are tokenised *together with their prompt* and the answer's tokens are the ones whose
character span reaches into the answer (``return_offsets_mapping``), so the scored tokens are
exactly those the model would read or produce after that prompt. Tokenising the answer on its
own differs for SentencePiece tokenizers with a Metaspace pre-tokenizer (Llama-2, Mistral-v0.1):
``" Paris"`` alone becomes ``["▁", "▁Paris"]`` (the prepended ``▁`` plus the space) while after
``"Answer:"`` it is ``["▁Paris"]``. Slow tokenizers, which give no offsets, use incremental
prefix tokenisation: the answer's tokens are those after the longest common token prefix of
``tok(prompt)`` and ``tok(prompt + answer)``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ragkit.types import Passage

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

    from ragkit.generation.prompts import PromptTemplate

logger = logging.getLogger(__name__)

__all__ = [
    "answer_text",
    "encode_prompts",
    "encode_texts",
    "encode_answers",
    "fit_passages",
    "fit_prompt_ids",
]


def _starts_with_bos(tokenizer: PreTrainedTokenizerBase, text: str) -> bool:
    bos = tokenizer.bos_token
    return bool(bos and text.startswith(bos))


def encode_prompts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of prompts; special tokens are added unless the text already starts with BOS.

    An empty prompt becomes ``[bos]``; a tokenizer without BOS cannot encode an empty prompt.
    """
    out: list[list[int]] = [[] for _ in texts]
    for special in (True, False):
        idx = [i for i, t in enumerate(texts) if special != _starts_with_bos(tokenizer, t)]
        if idx:
            enc = tokenizer([texts[i] for i in idx], add_special_tokens=special)["input_ids"]
            for i, ids in zip(idx, enc):
                out[i] = list(ids)
    for i, ids in enumerate(out):
        if not ids:
            if tokenizer.bos_token_id is None:
                raise ValueError(f"prompt {i} is empty and the tokenizer has no BOS token; pass a non-empty prompt")
            out[i] = [int(tokenizer.bos_token_id)]
    return out


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of plain texts (no special tokens)."""
    if not texts:
        return []
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def answer_text(prompt: str, answer: str, i: int = 0) -> str:
    """The answer as it continues the prompt: a space is inserted after a non-space prompt end."""
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"answer {i} is empty; every scored answer needs at least one non-space character")
    if prompt and not prompt[-1].isspace() and not answer[0].isspace():
        return " " + answer
    return answer


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def encode_answers(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], answers: Sequence[str]
) -> tuple[list[list[int]], list[list[int]]]:
    """``(prompt_ids, answer_ids)`` of each ``prompt + answer`` tokenised as one text.

    ``answers`` are the texts exactly as they follow the prompt (see :func:`answer_text`). The
    answer's tokens are the tokens whose character span ends after ``len(prompt)`` (a token that
    straddles the boundary belongs to the answer); special tokens added after the answer (an EOS
    some tokenizers append) are dropped. ``prompt_ids + answer_ids`` is the joint tokenisation.
    """
    prompts, answers = list(prompts), list(answers)
    if not prompts:
        return [], []
    joint = [p + a for p, a in zip(prompts, answers)]
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    p_out: list[list[int]] = [[] for _ in prompts]
    a_out: list[list[int]] = [[] for _ in prompts]
    fast = bool(getattr(tokenizer, "is_fast", False))
    for special in (True, False):
        idx = [i for i, t in enumerate(joint) if special != _starts_with_bos(tokenizer, t)]
        if not idx:
            continue
        if fast:
            enc = tokenizer([joint[i] for i in idx], add_special_tokens=special, return_offsets_mapping=True)
            for i, ids, offs in zip(idx, enc["input_ids"], enc["offset_mapping"]):
                bound = len(prompts[i])
                first = next((j for j, (s, e) in enumerate(offs) if e > bound and e > s), len(ids))
                p_out[i] = list(ids[:first])
                a_out[i] = [t for t in ids[first:] if t not in special_ids]
        else:
            full = tokenizer([joint[i] for i in idx], add_special_tokens=special)["input_ids"]
            alone = tokenizer([prompts[i] for i in idx], add_special_tokens=special)["input_ids"]
            for i, f, p in zip(idx, full, alone):
                # drop trailing special tokens of the prompt alone (an appended EOS) before matching
                p = list(p)
                while p and p[-1] in special_ids and len(p) > 1:
                    p.pop()
                k = _lcp(f, p)
                p_out[i] = list(f[:k])
                a_out[i] = [t for t in f[k:] if t not in special_ids]
    for i, p in enumerate(p_out):
        if not p:
            bos = tokenizer.bos_token_id
            if bos is None:
                raise ValueError(f"prompt {i} is empty and the tokenizer has no BOS token; pass a non-empty prompt")
            p_out[i] = [int(bos)]
    return p_out, a_out


def fit_prompt_ids(p: list[int], room: int, what: str, max_length: int) -> list[int]:
    """Keep the last ``room`` tokens of an over-long prompt (with a warning)."""
    if len(p) > room:
        logger.warning("%s has %d tokens but only %d fit the context window (%d); keeping its last %d",
                       what, len(p), room, max_length, room)
        return p[-room:]
    return p


def fit_passages(
    tokenizer: PreTrainedTokenizerBase,
    template: PromptTemplate,
    question: str,
    passages: Sequence[Passage],
    *,
    max_length: int,
    answer_reserve: int,
    passage_max_tokens: int | None,
) -> list[str]:
    """Passage bodies cut to ``passage_max_tokens`` and, if needed, to fit the context window.

    Over-long prompts are fixed by cutting the longest passages first ("water-filling": all
    passages longer than a cap ``c`` are cut to ``c`` tokens, with the largest ``c`` such that
    ``Σ_p max(0, len_p - c) >= excess``). The result does not depend on the passage order.

    A cut body re-tokenises inside the prompt to a few more tokens than its cut ids, so the
    estimated cap can leave the prompt a little over; the cap is then lowered again, strictly
    each time, until the measured prompt fits (at cap 0 the passages are empty and the prompt
    is returned as it is, with a warning).
    """
    texts = [p.text for p in passages]
    if not texts:
        return texts
    ids = encode_texts(tokenizer, texts)
    if passage_max_tokens is not None:
        n = passage_max_tokens
        texts = [tokenizer.decode(t[:n]) if len(t) > n else s for t, s in zip(ids, texts)]
        ids = [t[:n] for t in ids]
    limit = max_length - answer_reserve

    def _len(bodies: list[str]) -> int:
        return len(encode_prompts(tokenizer, [template.build(question, passages, tokenizer, bodies)])[0])

    total = _len(texts)
    if total <= limit:
        return texts
    lens = np.array([len(t) for t in ids])
    margin = 0
    cap = int(lens.max())
    while True:
        excess = total - limit + margin
        lo, hi = 0, cap  # largest cap c (below the last one) with sum(max(0, l - c)) >= excess
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if np.maximum(lens - mid, 0).sum() >= excess:
                lo = mid
            else:
                hi = mid - 1
        cap = lo if margin == 0 else min(lo, cap - 1)
        cut = [tokenizer.decode(t[:cap]) if len(t) > cap else s for t, s in zip(ids, texts)]
        new_total = _len(cut)
        if new_total <= limit or cap == 0:
            logger.warning(
                "prompt of %d tokens exceeds the context window (%d tokens incl. %d for the answer); "
                "passages longer than %d tokens were truncated (now %d tokens)",
                total, max_length, answer_reserve, cap, new_total)
            return cut
        margin += max(8, new_total - limit)

