"""``LLMReranker``: a causal LM as a pointwise reranker, by its yes/no relevance logit.

Each (query, document) pair is put to the model as a question through its chat template, and
the score is the log-odds of "yes" against "no" at the first answer token:

``s(q, d) = z_yes - z_no``,  ``P(relevant | q, d) = softmax(z_no, z_yes)_yes = sigmoid(s)``

(``z``: the next-token logits after the prompt). This is the pointwise rule of monoT5 (Nogueira
et al., "Document Ranking with a Pretrained Sequence-to-Sequence Model", Findings of EMNLP
2020, arXiv 2003.06713; "true"/"false") and of Qwen3-Reranker (Zhang et al., "Qwen3 Embedding:
Advancing Text Embedding and Reranking Through Foundation Models", arXiv 2506.05176; the
system prompt, the ``<Instruct>/<Query>/<Document>`` layout and the "yes"/"no" tokens used
here). A model without a chat template gets monoT5's plain layout ``Query: q Document: d
Relevant:``. Because ``sigmoid(s)`` is a probability the model states, ``ragkit serve`` reports it
as the relevance score as it is.

Pairs are scored in length-bucketed batches, padded on the right, each row's logits read at its
own last token (no position shift from left padding); long documents follow the reranker's
:class:`~ragkit.debias.long_docs.LongDocs` rule within ``max_length`` tokens.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ragkit.batching import length_buckets
from ragkit.debias.long_docs import CutPairs, LongDocs, cut_pairs
from ragkit.io import progress
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["LLMReranker", "DEFAULT_INSTRUCTION", "SYSTEM_PROMPT"]

logger = logging.getLogger(__name__)

SYSTEM_PROMPT = ("Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
                 'Note that the answer can only be "yes" or "no".')
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class LLMReranker(Reranker):
    """Rerank with a causal LM's yes/no relevance logit (see the module docstring).

    Parameters
    ----------
    model, tokenizer
        A Hugging Face causal LM and its tokenizer (:meth:`from_pretrained` loads both).
    instruction
        The task line of the prompt.
    batch_size
        Most pairs per forward.
    max_length
        Most tokens per prompt; documents are cut to fit (``long_docs``).
    long_docs
        The long-document rule (:class:`~ragkit.debias.long_docs.LongDocs`).
    max_batch_tokens, forward_cost_tokens
        Length buckets (:func:`ragkit.batching.length_buckets`).
    show_progress
        Progress bar over the batches.

    Attributes
    ----------
    forward_passes
        Prompts scored so far.

    What the long-document rule did to each query's documents is returned with its ranking, in
    ``info.details["long_docs"]`` (:meth:`ragkit.debias.long_docs.CutPairs.details`), not kept on the
    reranker, so that concurrent callers each see their own counts.
    """

    name = "llm"
    pointwise = True

    def __init__(self, model: Any, tokenizer: Any, instruction: str = DEFAULT_INSTRUCTION, batch_size: int = 8,
                 max_length: int = 1024, long_docs: LongDocs | None = None, max_batch_tokens: int | None = 8192,
                 forward_cost_tokens: int = 64, show_progress: bool | None = None) -> None:
        if batch_size < 1 or max_length < 16:
            raise ValueError(f"batch_size must be >= 1 and max_length >= 16, got {batch_size}, {max_length}")
        self.model = model
        self.tokenizer = tokenizer
        self.instruction = instruction
        self.batch_size = batch_size
        self.max_length = max_length
        self.long_docs = long_docs or LongDocs()
        self.max_batch_tokens = max_batch_tokens
        self.forward_cost_tokens = forward_cost_tokens
        self.show_progress = show_progress
        self.yes_id = self._token_id("yes")
        self.no_id = self._token_id("no")
        if self.yes_id == self.no_id:
            raise ValueError("the tokenizer maps 'yes' and 'no' to the same first token; it cannot be used as a "
                             "yes/no reranker")
        self._head, self._tail = self._template()
        self.forward_passes = 0

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str = "auto", dtype: str | None = "auto",
                        **kwargs: Any) -> LLMReranker:
        """Load a causal LM (folder or hub id) as a yes/no reranker; ``kwargs`` go to the constructor."""
        from ragkit.models import load_generator

        model, tok = load_generator(name_or_path, device=device, dtype=dtype)
        return cls(model, tok, **kwargs)

    def _token_id(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if not ids:
            raise ValueError(f"the tokenizer encodes {word!r} as no token")
        return int(ids[0])

    # ------------------------------------------------------------------ prompts
    def prompt(self, query: str, document: str) -> str:
        """The full prompt of one pair (what :meth:`score_texts` runs)."""
        return self._head + self._user(query, document) + self._tail

    def _user(self, query: str, document: str) -> str:
        if self._chat:
            return f"<Instruct>: {self.instruction}\n<Query>: {query}\n<Document>: {document}"
        return f"Query: {query} Document: {document}"

    def _template(self) -> tuple[str, str]:
        """The text before and after the user turn, from the chat template (or monoT5's plain layout)."""
        self._chat = bool(getattr(self.tokenizer, "chat_template", None))
        if not self._chat:
            return "", " Relevant:"
        marker = "\x00RAGKIT_PAIR\x00"
        text = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": marker}],
            tokenize=False, add_generation_prompt=True)
        head, sep, tail = str(text).partition(marker)
        if not sep:
            raise ValueError("the chat template dropped the user message; pass a tokenizer whose template renders it")
        return head, tail

    # ------------------------------------------------------------------ scoring
    def score_texts(self, prompts: list[str]) -> np.ndarray:
        """``z_yes - z_no`` after each prompt (one forward per length bucket)."""
        import torch

        if not prompts:
            return np.zeros(0, dtype=np.float32)
        enc = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if bos is not None and getattr(self.tokenizer, "add_bos_token", False):
            enc = [[bos, *e] if not e or e[0] != bos else e for e in enc]
        enc = [e[-self.max_length :] for e in enc]
        lengths = [len(e) for e in enc]
        out = np.zeros(len(prompts), dtype=np.float32)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        device = next(self.model.parameters()).device
        buckets = length_buckets(lengths, self.batch_size, self.max_batch_tokens, self.forward_cost_tokens)
        with torch.inference_mode():
            for b in progress(buckets, bool(self.show_progress), desc="llm reranker batches", unit="batch"):
                width = max(lengths[k] for k in b)
                ids = torch.full((len(b), width), pad, dtype=torch.long)
                mask = torch.zeros((len(b), width), dtype=torch.long)
                for row, k in enumerate(b):
                    ids[row, : lengths[k]] = torch.tensor(enc[k])
                    mask[row, : lengths[k]] = 1
                logits = self.model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
                last = torch.tensor([lengths[k] - 1 for k in b], device=logits.device)
                z = logits[torch.arange(len(b), device=logits.device), last].float()
                out[b] = (z[:, self.yes_id] - z[:, self.no_id]).cpu().numpy()
        self.forward_passes += len(prompts)
        return out

    def _rank_many(self, queries: list[Query], passages: list[list[Passage]],
                   scores: list[list[float] | None]) -> list[RankedList]:
        index: dict[tuple[str, str], int] = {}
        rows = [[index.setdefault((q.text, p.contents), len(index)) for p in ps] for q, ps in zip(queries, passages)]
        pairs = list(index)
        overhead = len(self.tokenizer.encode(self.prompt("", ""), add_special_tokens=False)) + 1
        if getattr(self.tokenizer, "is_fast", False):
            cut = cut_pairs(self.tokenizer, pairs, max(16, self.max_length - overhead), self.long_docs)
        else:  # no token offsets to cut text at: the prompt is cut at max_length tokens instead
            cut = CutPairs(pairs, [0] * len(pairs), [[i] for i in range(len(pairs))], [False] * len(pairs))
        units = self.score_texts([self.prompt(q, d) for q, d in cut.units])
        flat = np.asarray(cut.aggregate(units), dtype=np.float32)
        return [RankedList.from_scores(ps, flat[r].tolist(), q, RankInfo(forward_passes=len(cut.units),
                                                                           details={"long_docs": cut.details(r)}))
                for q, ps, r in zip(queries, passages, rows)]
