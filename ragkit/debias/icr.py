"""``ICRReranker``: in-context reranking from the generator's attention, two passes for ``N`` passages.

In-context re-ranking (ICR; Chen et al., "Attention in Large Language Models Yields Efficient
Zero-Shot Re-Rankers", ICLR 2025, arXiv 2410.02642) puts all ``N`` candidates in one prompt,
followed by the query, and reads how much the query's tokens attend to each passage's tokens.
For a prompt token ``t`` and a query ``x`` appended after the passages,

    a_x(t) = Σ_layers Σ_heads mean_{j ∈ query tokens of x} A[j, t]

(``A`` the softmax attention weights). The same is measured with the content-free query
``"N/A"``, which captures the attention the model pays to a token whatever is asked (position and
content priors), and the calibrated token score is ``c(t) = a_q(t) − a_NA(t)``. Passage ``i``'s
score sums the calibrated scores of its tokens ``T_i``, after dropping the tokens whose ``c`` is
an outlier below ``mean_{T_i}(c) − 2 std_{T_i}(c)`` (the authors' default "masked N/A
calibration"):

    s_i = Σ_{t ∈ T_i} c(t) · 1[c(t) > mean_{T_i}(c) − 2 std_{T_i}(c)].

Cost: the instruction and passages are prefilled once and their key/value cache serves both
queries (one forward of the two query rows), so ``N`` candidates cost two scored sequences and
``|prompt| + |q| + |N/A|`` prefilled tokens, against ``N`` sequences for UPR.

Prompt (choice): the generator's passage format and passage fitting (``passage_max_tokens``,
the context window) in a plain, non-chat layout ``<instruction>\\n\\nPassages:\\n[1] ...\\n[N]
...\\n\\nQuery: <q>`` (the authors' QA instruction), so that the query is the last text and the
only part that differs between the two passes. Attention weights need the eager attention
implementation; the model is switched to it for the query pass and switched back afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragkit.generation.base import GeneratorLike, metered
from ragkit.generation.prompts import QuestionPromptTemplate
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["ICRReranker", "CALIBRATION_QUERY", "ICR_INSTRUCTION", "icr_template", "calibrated_passage_scores",
           "passage_layout", "encode_with_spans"]

logger = logging.getLogger(__name__)

CALIBRATION_QUERY = "N/A"
"""The content-free query of the calibration pass (the authors' choice)."""
ICR_INSTRUCTION = ("Here are some paragraphs. Please answer the following question based on the information "
                   "in the paragraphs.")


def icr_template(base: Any) -> QuestionPromptTemplate:
    """ICR's plain layout with ``base``'s passage format: instruction, passages, then ``Query:`` and the query."""
    return QuestionPromptTemplate(name="icr", instruction=ICR_INSTRUCTION, use_chat_template=False,
                                  passage_format=getattr(base, "passage_format", "[{index}] {title}: {text}"),
                                  untitled_format=getattr(base, "untitled_format", "[{index}] {text}"),
                                  answer_cue="Query:")


def calibrated_passage_scores(a_query: np.ndarray, a_null: np.ndarray, spans: Sequence[Sequence[int]],
                              n_std: float = 2.0) -> np.ndarray:
    """``s_i = Σ_{t ∈ T_i} c(t) 1[c(t) > mean(c_i) − n_std · std(c_i)]`` with ``c = a_query − a_null``.

    ``spans[i]`` lists the prompt-token indices ``T_i`` of passage ``i``; ``std`` is the sample
    standard deviation (``ddof=1``; a one-token passage keeps its token). A passage with no token
    (cut away by the context window) scores ``-inf``.
    """
    c = np.asarray(a_query, dtype=np.float64) - np.asarray(a_null, dtype=np.float64)
    out = np.full(len(spans), -np.inf)
    for i, toks in enumerate(spans):
        if len(toks) == 0:
            continue
        ci = c[np.asarray(toks, dtype=np.int64)]
        if ci.size > 1:
            ci = ci[ci > ci.mean() - n_std * ci.std(ddof=1)]
        out[i] = float(ci.sum())
    return out


class ICRReranker(Reranker):
    """Rank passages by calibrated query-to-passage attention (ICR; module docstring).

    Parameters
    ----------
    generator
        A local :class:`ragkit.generation.Generator` (attention weights need the model itself; a
        server-backed generator cannot give them).
    calibration_query
        The content-free query of the calibration pass.
    n_std
        Tokens whose calibrated score falls below ``mean − n_std · std`` of their passage are dropped.

    Notes
    -----
    Each ranking's ``info`` holds ``generator_calls = 2`` (the query and the calibration rows) and
    the forward passes and prefilled tokens of the call.
    """

    name = "icr"

    def __init__(self, generator: GeneratorLike, calibration_query: str = CALIBRATION_QUERY,
                 n_std: float = 2.0) -> None:
        if generator is None:
            raise ValueError("the 'icr' reranker needs a generator; pass a ragkit.generation.Generator")
        if getattr(generator, "model", None) is None or not hasattr(generator.model, "set_attn_implementation"):
            raise ValueError("the 'icr' reranker reads attention weights and needs a local Hugging Face model; "
                             f"{type(generator).__name__} has none (use a local --model, not a server URL)")
        if not calibration_query.strip():
            raise ValueError("calibration_query must be a non-empty string such as 'N/A'")
        self.generator = generator
        self.calibration_query = calibration_query
        self.n_std = float(n_std)
        self.template = icr_template(getattr(generator, "template", None))

    # ------------------------------------------------------------------ inputs
    def layout(self, question: str, passages: Sequence[Passage]) -> tuple[str, list[tuple[int, int]]]:
        """The prompt (ending with ``"Query:"``) and each passage line's character span in it."""
        return passage_layout(self.generator, self.template, question, passages,
                              continuations=[question, self.calibration_query])

    def encode(self, question: str, passages: Sequence[Passage]
               ) -> tuple[list[int], list[int], list[int], list[list[int]]]:
        """``(prompt_ids, query_ids, null_ids, spans)``: token ids and each passage's prompt-token indices."""
        prompt, char_spans = self.layout(question, passages)
        p_ids, (q_ids, n_ids), spans = encode_with_spans(self.generator, prompt, char_spans,
                                                         [question, self.calibration_query])
        return p_ids, q_ids, n_ids, spans

    # ------------------------------------------------------------------ attention
    def token_attention(self, prompt_ids: Sequence[int], query_rows: Sequence[Sequence[int]],
                        per_head: bool = False) -> np.ndarray:
        """``a_x(t)`` for every prompt token ``t`` and each query row ``x``: ``(rows, |prompt|)``.

        The prompt is prefilled once (its cache shared by the rows); the rows run in one forward
        with eager attention, right-padded, and the attention of each row's own tokens is averaged.
        ``per_head`` keeps the layers and heads apart instead of summing them:
        ``(rows, layers, heads, |prompt|)``.
        """
        import torch
        from transformers import DynamicCache

        from ragkit.generation.handle import forward_logits, forward_output, handle_of

        gen = self.generator
        h = handle_of(gen, "the 'icr' reranker")
        model = h.model
        dev = h.device
        # ICR reads attention weights, never logits: one position's logits (keep=1) instead of the prompt's.
        # Both forwards are prefills on the ledger (the prompt, then the query rows), whatever their width.
        n_p = len(prompt_ids)
        rows = len(query_rows)
        width = max(len(r) for r in query_rows)
        pad = int(getattr(gen.tokenizer, "pad_token_id", None) or 0)
        ids = torch.full((rows, width), pad, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for r, row in enumerate(query_rows):
            ids[r, : len(row)] = torch.tensor(list(row), dtype=torch.long)
            mask[r, : len(row)] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        prev = getattr(model.config, "_attn_implementation", None)
        with torch.inference_mode():
            p = torch.tensor([list(prompt_ids)], dtype=torch.long, device=dev)
            _, cache = forward_logits(h, p, torch.ones_like(p), torch.arange(n_p, device=dev)[None, :],
                                      past=DynamicCache(config=model.config), keep=1, prefill=True)
            cache.batch_repeat_interleave(rows)
            try:
                if prev != "eager":
                    model.set_attn_implementation("eager")
                full_mask = torch.cat([torch.ones((rows, n_p), dtype=torch.long, device=dev), mask], dim=1)
                pos = (n_p + torch.arange(width, device=dev))[None, :].expand(rows, -1)
                out2 = forward_output(h, ids, full_mask, pos, past=cache, keep=1, output_attentions=True,
                                      prefill=True)
            finally:
                if prev is not None and prev != "eager":
                    model.set_attn_implementation(prev)
            att = out2.attentions
            if not att or att[0] is None:  # pragma: no cover - an architecture that cannot return them
                raise RuntimeError(f"{type(model).__name__} returned no attention weights; ICR needs them")
            w = mask.float()
            if per_head:  # (layers, rows, heads, width, n_p) -> (rows, layers, heads, n_p)
                stacked = torch.stack([a[:, :, :, :n_p].float() for a in att])
                a = ((stacked * w[None, :, None, :, None]).sum(3) / w.sum(1)[None, :, None, None]).permute(1, 0, 2, 3)
            else:
                total = torch.stack([a[:, :, :, :n_p].float() for a in att]).sum(dim=(0, 2))  # (rows, width, n_p)
                a = (total * w[:, :, None]).sum(1) / w.sum(1, keepdim=True)
        return a.double().cpu().numpy()

    def scores_one(self, question: str, passages: Sequence[Passage]) -> np.ndarray:
        """``s_i`` of every passage for one question (two passes; module docstring)."""
        p_ids, q_ids, n_ids, spans = self.encode(question, passages)
        a = self.token_attention(p_ids, [q_ids, n_ids])
        return calibrated_passage_scores(a[0], a[1], spans, self.n_std)

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        del scores  # ICR ranks by attention alone; ties keep the retriever order
        with metered() as cost:
            scores_ = [self.scores_one(q.text, p).tolist() for q, p in zip(queries, passages)]
        return [RankedList.from_scores(p, s, q, info=RankInfo(
            generator_calls=2, forward_passes=cost.forward_passes, tokens_prefilled=cost.tokens_prefilled))
            for q, p, s in zip(queries, passages, scores_)]


def passage_layout(generator: Any, template: Any, question: str, passages: Sequence[Passage],
                   continuations: Sequence[str] = ()) -> tuple[str, list[tuple[int, int]]]:
    """A passages-then-continuation prompt and each passage line's character span in it.

    ``template`` is a :class:`~ragkit.generation.prompts.QuestionPromptTemplate` (its suffix starts
    with the passage block); passage bodies are fitted as the generator fits them
    (``passage_max_tokens``, the context window). The room kept after the prompt is the
    generator's ``answer_reserve`` or, when longer, the longest of ``continuations`` (the texts
    scored after the prompt, e.g. a long question) plus two tokens for the joint tokenisation.
    """
    from ragkit.generation.fitting import encode_texts, fit_passages

    reserve = int(getattr(generator, "answer_reserve", 32))
    if continuations:
        longest = max(len(t) for t in encode_texts(generator.tokenizer, [" " + c.strip() for c in continuations]))
        reserve = max(reserve, longest + 2)
    texts = fit_passages(generator.tokenizer, template, question, list(passages), max_length=generator.max_length,
                         answer_reserve=reserve, passage_max_tokens=getattr(generator, "passage_max_tokens", None))
    prefix, suffix = template.split(question, list(passages), generator.tokenizer, texts)
    spans: list[tuple[int, int]] = []
    pos = len(prefix)
    for i, (p, t) in enumerate(zip(passages, texts)):
        line = template.format_passage(i, p, t)
        if suffix[pos - len(prefix):pos - len(prefix) + len(line)] != line:  # pragma: no cover - layout bug
            raise RuntimeError("prompt layout: a passage line is not where it was expected")
        spans.append((pos, pos + len(line)))
        pos += len(line) + 1  # the "\n" between passage lines
    return prefix + suffix, spans


def encode_with_spans(generator: Any, prompt: str, char_spans: Sequence[tuple[int, int]],
                      continuations: Sequence[str]) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """``(prompt_ids, continuation_ids, spans)``: the prompt's tokens (the same before every
    continuation), each continuation's tokens, and the prompt-token indices of each character span."""
    from ragkit.generation.fitting import answer_text, encode_answers

    tok = generator.tokenizer
    p_ids, a_ids = encode_answers(tok, [prompt] * len(continuations), [answer_text(prompt, c) for c in continuations])
    if any(p != p_ids[0] for p in p_ids):  # pragma: no cover - a tokenizer merging across the boundary
        raise RuntimeError("the prompt tokenises differently before its continuations")
    for c, a in zip(continuations, a_ids):
        if not a:
            raise ValueError(f"the text {c!r} tokenises to nothing; pass a non-empty question")
    starts = _token_char_starts(tok, prompt, len(p_ids[0]))
    spans = [[t for t, s in enumerate(starts) if lo <= s < hi] for lo, hi in char_spans]
    room = generator.max_length - max(len(a) for a in a_ids)
    if len(p_ids[0]) > room:
        raise ValueError(f"a prompt of {len(p_ids[0])} tokens plus its continuation does not fit the context window "
                         f"({generator.max_length}); cut passages with passage_max_tokens (--passage-max-tokens) "
                         "or pass fewer candidates")
    return p_ids[0], a_ids, spans


def _token_char_starts(tokenizer: Any, prompt: str, n: int) -> list[int]:
    """Character start of each of the prompt's first ``n`` tokens (special tokens: -1)."""
    from ragkit.generation.fitting import _starts_with_bos

    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the 'icr' reranker needs a fast tokenizer (character offsets of the passage tokens)")
    enc = tokenizer(prompt, add_special_tokens=not _starts_with_bos(tokenizer, prompt), return_offsets_mapping=True)
    offs = list(enc["offset_mapping"])[:n]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    starts = [(-1 if tid in special or e <= s else int(s)) for tid, (s, e) in zip(enc["input_ids"], offs)]
    return starts + [-1] * (n - len(starts))
