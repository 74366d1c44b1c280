"""The causal-LM generator every other part of ragkit uses: prompts, scoring and decoding.

Scoring is teacher forcing: for a prompt ``x`` and an answer ``y = y_1..y_T``

    log p(y | x) = Σ_t log softmax(W h_{|x|+t-1})[y_t]

where ``h`` are the decoder's last hidden states and ``W`` the LM head. Only the ``T`` hidden
states that predict answer tokens go through the LM head, so no ``(batch, length, vocab)``
tensor is ever materialised.

For many orderings of the same passages (Mixture-of-Intervention, Lee et al., "Inference
Scaling for Bridging Retrieval and Augmented Generation", NAACL Findings 2025,
arXiv 2412.10684) the prompt is laid out so that its prefix (instruction + question) is
shared: :meth:`Generator.score_orderings` runs that prefix once per question and reuses its
key/value cache for every ordering.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.generation.prompts import PromptTemplate, get_template
from ragkit.io import progress
from ragkit.types import Passage, as_passages

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = ["Generator", "ScoreResult"]

_DEFAULT_MAX_LENGTH_CAP = 4096


@dataclass(frozen=True)
class ScoreResult:
    """Teacher-forced log-probabilities of ``n`` answers.

    Attributes
    ----------
    sum
        ``(n,)`` total log-probability ``log p(y | x)`` of each answer.
    mean
        ``(n,)`` mean per-token log-probability (``sum / num_tokens``).
    token_logprobs
        ``n`` arrays with the log-probability of every answer token.
    num_tokens
        ``(n,)`` number of answer tokens.
    """

    sum: np.ndarray
    mean: np.ndarray
    token_logprobs: list[np.ndarray]
    num_tokens: np.ndarray

    @classmethod
    def from_token_logprobs(cls, token_logprobs: Sequence[np.ndarray]) -> ScoreResult:
        """Build a result from per-answer token log-probability arrays."""
        tl = [np.asarray(t, dtype=np.float64) for t in token_logprobs]
        num = np.array([len(t) for t in tl], dtype=np.int64)
        s = np.array([float(t.sum()) for t in tl], dtype=np.float64)
        mean = np.where(num > 0, s / np.maximum(num, 1), 0.0)
        return cls(sum=s, mean=mean, token_logprobs=tl, num_tokens=num)

    def __len__(self) -> int:
        return len(self.token_logprobs)


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


class Generator:
    """A causal LM with RAG prompts, batched answer scoring and batched generation.

    Parameters
    ----------
    model
        ``None`` (the embedded SmolLM2-135M-Instruct), a hub id, a local folder or a ``.gguf``
        path; loaded by :func:`ragkit.models.load_generator`.
    device
        ``"auto"`` (CUDA with bf16 when present, else CPU fp32) or a torch device string.
    dtype
        ``"auto"`` or a dtype name / ``torch.dtype``.
    template
        Prompt template name (``"auto"``: chat template when the tokenizer has one, else ``"short"``;
        ``"short"``, ``"chat"``, ``"plain"``) or a :class:`PromptTemplate`.
    batch_size
        Sequences per forward pass.
    max_length
        Context window in tokens (default: the model's ``max_position_embeddings`` capped at 4096).
    passage_max_tokens
        Truncate each passage body to this many tokens (``None``: no per-passage limit).
    show_progress
        Progress bars (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).

    Examples
    --------
    >>> gen = Generator()                                  # doctest: +SKIP
    >>> gen.answer(["Who wrote Hamlet?"], [[Passage("1", "Hamlet is a play by Shakespeare.")]])  # doctest: +SKIP
    ['Shakespeare']
    """

    answer_reserve: int = 32
    """Tokens kept free for the answer when passages are truncated to fit the context window."""

    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str | Any = "auto",
        template: str | PromptTemplate = "auto",
        batch_size: int = 8,
        max_length: int | None = None,
        passage_max_tokens: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        from ragkit.models import DEFAULT_GENERATOR, load_generator

        hf_model, tokenizer = load_generator(model, device=device, dtype=dtype)
        self._setup(hf_model, tokenizer, name=model or DEFAULT_GENERATOR, template=template,
                    batch_size=batch_size, max_length=max_length,
                    passage_max_tokens=passage_max_tokens, show_progress=show_progress)

    @classmethod
    def from_components(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str | None = None,
        template: str | PromptTemplate = "auto",
        batch_size: int = 8,
        max_length: int | None = None,
        passage_max_tokens: int | None = None,
        show_progress: bool | None = None,
    ) -> Generator:
        """Wrap an already-loaded Hugging Face causal LM and its tokenizer (no copy is made).

        The model is used in whatever mode it is in; call ``model.eval()`` for deterministic
        scores. A tokenizer without a pad token gets its EOS token as pad token.
        """
        obj = cls.__new__(cls)
        obj._setup(model, tokenizer, name=name or getattr(model.config, "_name_or_path", "") or "model",
                   template=template, batch_size=batch_size, max_length=max_length,
                   passage_max_tokens=passage_max_tokens, show_progress=show_progress)
        return obj

    def _setup(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        template: str | PromptTemplate,
        batch_size: int,
        max_length: int | None,
        passage_max_tokens: int | None,
        show_progress: bool | None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if passage_max_tokens is not None and passage_max_tokens < 1:
            raise ValueError(f"passage_max_tokens must be >= 1 or None, got {passage_max_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = str(name)
        self.template = get_template(template, tokenizer)
        self.batch_size = int(batch_size)
        self.passage_max_tokens = passage_max_tokens
        self.show_progress = show_progress
        cfg = model.config
        text_cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        if max_length is None:
            mpe = getattr(text_cfg, "max_position_embeddings", None) or 2048
            max_length = min(int(mpe), _DEFAULT_MAX_LENGTH_CAP)
        if max_length < self.answer_reserve + 8:
            raise ValueError(f"max_length={max_length} is too small; use at least {self.answer_reserve + 8}")
        self.max_length = int(max_length)
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
            tokenizer.pad_token = tokenizer.eos_token
        self._pad_id = int(tokenizer.pad_token_id)
        eos: set[int] = set()
        for src in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(e) for e in src)
        self._eos_ids = sorted(eos)
        self._softcap = getattr(text_cfg, "final_logit_softcapping", None)
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if decoder is None or decoder is model or head is None:
            logger.info("%s exposes no separate decoder/LM head; scoring uses full logits", self.name)
            decoder = head = None
        self._decoder = decoder
        self._lm_head = head

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> str:
        """The device of the model's parameters, e.g. ``"cpu"`` or ``"cuda:0"``."""
        return str(next(self.model.parameters()).device)

    def __repr__(self) -> str:
        return (f"Generator(name={self.name!r}, device={self.device!r}, template={self.template.name!r}, "
                f"batch_size={self.batch_size}, max_length={self.max_length})")

    # ------------------------------------------------------------------ tokenisation
    def _encode_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of prompts; special tokens are added unless the text already starts with BOS."""
        bos = self.tokenizer.bos_token
        out: list[list[int]] = [[] for _ in texts]
        for special in (True, False):
            idx = [i for i, t in enumerate(texts) if special != bool(bos and t.startswith(bos))]
            if idx:
                enc = self.tokenizer([texts[i] for i in idx], add_special_tokens=special)["input_ids"]
                for i, ids in zip(idx, enc):
                    out[i] = list(ids)
        for i, ids in enumerate(out):
            if not ids:
                if self.tokenizer.bos_token_id is None:
                    raise ValueError(f"prompt {i} is empty and the tokenizer has no BOS token; "
                                     "pass a non-empty prompt")
                out[i] = [int(self.tokenizer.bos_token_id)]
        return out

    def _encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(x) for x in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    @staticmethod
    def _answer_text(prompt: str, answer: str, i: int) -> str:
        """The answer as it continues the prompt: a space is inserted after a non-space prompt end."""
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"answer {i} is empty; every scored answer needs at least one non-space character")
        if prompt and not prompt[-1].isspace() and not answer[0].isspace():
            return " " + answer
        return answer

    # ------------------------------------------------------------------ prompts
    def _fit_passages(self, question: str, passages: Sequence[Passage]) -> list[str]:
        """Passage bodies cut to ``passage_max_tokens`` and, if needed, to fit the context window.

        Over-long prompts are fixed by cutting the longest passages first ("water-filling": all
        passages longer than a cap ``c`` are cut to ``c`` tokens, with the largest ``c`` that
        fits). The result does not depend on the passage order.
        """
        texts = [p.text for p in passages]
        if not texts:
            return texts
        ids = self._encode_texts(texts)
        if self.passage_max_tokens is not None:
            n = self.passage_max_tokens
            texts = [self.tokenizer.decode(t[:n]) if len(t) > n else s for t, s in zip(ids, texts)]
            ids = [t[:n] for t in ids]
        limit = self.max_length - self.answer_reserve
        total = len(self._encode_prompts([self.template.build(question, passages, self.tokenizer, texts)])[0])
        if total <= limit:
            return texts
        lens = np.array([len(t) for t in ids])
        margin = 0
        for _ in range(4):
            excess = total - limit + margin
            lo, hi = 0, int(lens.max())  # largest cap c with sum(max(0, l - c)) >= excess
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if np.maximum(lens - mid, 0).sum() >= excess:
                    lo = mid
                else:
                    hi = mid - 1
            cap = lo
            cut = [self.tokenizer.decode(t[:cap]) if len(t) > cap else s for t, s in zip(ids, texts)]
            new_total = len(self._encode_prompts([self.template.build(question, passages, self.tokenizer, cut)])[0])
            if new_total <= limit or cap == 0:
                logger.warning(
                    "prompt of %d tokens exceeds the context window (%d tokens incl. %d for the answer); "
                    "passages longer than %d tokens were truncated (now %d tokens)",
                    total, self.max_length, self.answer_reserve, cap, new_total)
                return cut
            margin += max(8, new_total - limit)
        return cut

    def split_prompt(self, question: str, passages: Sequence[Passage | str]) -> tuple[str, str]:
        """``(prefix, suffix)``: the prefix (instruction + question) is the same for every ordering.

        ``prefix + suffix == build_prompt(question, passages)``.
        """
        ps = as_passages(passages)
        return self.template.split(question, ps, self.tokenizer, self._fit_passages(question, ps))

    def build_prompt(self, question: str, passages: Sequence[Passage | str]) -> str:
        """The full prompt; it ends exactly where the answer begins.

        Instruction and question come before the numbered passages, the question is repeated
        after them, then the answer cue (``"Answer:"`` or the chat assistant turn).
        """
        prefix, suffix = self.split_prompt(question, passages)
        return prefix + suffix

    # ------------------------------------------------------------------ forward helpers
    def _hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """Last hidden states ``(B, L, H)`` of the decoder (no LM head) and the cache."""
        assert self._decoder is not None
        out = self._decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past, use_cache=use_cache)
        return out.last_hidden_state, getattr(out, "past_key_values", None)

    def _head_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``log softmax(W h)[target]`` for gathered hidden states ``(N, H)`` and targets ``(N,)``."""
        import torch

        assert self._lm_head is not None
        logits = self._lm_head(hidden).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]

    def _score_rows(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        starts: Sequence[int],
        answers: Sequence[Sequence[int]],
        past: Any = None,
    ) -> list[np.ndarray]:
        """Answer-token log-probs for a right-padded batch.

        Row ``r``'s answer token ``t`` sits at input position ``starts[r] + t`` and is predicted by
        the hidden state at ``starts[r] + t - 1`` (``starts[r] >= 1``).
        """
        import torch

        dev = input_ids.device
        rows = torch.tensor([r for r, a in enumerate(answers) for _ in a], device=dev, dtype=torch.long)
        pos = torch.tensor([s - 1 + t for s, a in zip(starts, answers) for t in range(len(a))],
                           device=dev, dtype=torch.long)
        tgt = torch.tensor([x for a in answers for x in a], device=dev, dtype=torch.long)
        if self._decoder is not None:
            hidden, _ = self._hidden(input_ids, attention_mask, position_ids, past=past, use_cache=past is not None)
            lp = self._head_logprobs(hidden[rows, pos], tgt)
        else:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past, use_cache=past is not None)
            logits = out.logits[rows, pos].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, tgt[:, None])[:, 0]
        flat = lp.double().cpu().numpy()
        out_rows: list[np.ndarray] = []
        offset = 0
        for a in answers:
            out_rows.append(flat[offset:offset + len(a)])
            offset += len(a)
        return out_rows

    def _pad_right(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[r, : len(s)] = 1
        dev = self.device
        return ids.to(dev), mask.to(dev)

    def _fit_prompt_ids(self, p: list[int], room: int, what: str) -> list[int]:
        if len(p) > room:
            logger.warning("%s has %d tokens but only %d fit the context window (%d); keeping its last %d",
                           what, len(p), room, self.max_length, room)
            return p[-room:]
        return p

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: Sequence[str], answers: Sequence[str]) -> ScoreResult:
        """Teacher-forced ``log p(answer | prompt)`` for aligned prompts and answers.

        Prompt and answer are tokenised separately and their ids concatenated (so every path
        sees identical tokens); a space is put before the answer when the prompt ends in a
        non-space character. Sequences are sorted by length, batched with right padding, and
        only the answer positions go through the LM head.

        Raises
        ------
        ValueError
            When the lengths differ or an answer is empty.
        """
        import torch

        prompts, answers = list(prompts), list(answers)
        if len(prompts) != len(answers):
            raise ValueError(f"score() got {len(prompts)} prompts but {len(answers)} answers; pass one answer per prompt")
        if not prompts:
            return ScoreResult.from_token_logprobs([])
        ans_texts = [self._answer_text(p, a, i) for i, (p, a) in enumerate(zip(prompts, answers))]
        p_ids = self._encode_prompts(prompts)
        a_ids = self._encode_texts(ans_texts)
        for i, a in enumerate(a_ids):
            if not a:
                raise ValueError(f"answer {i} ({answers[i]!r}) tokenises to nothing; pass a non-empty answer")
            if len(a) >= self.max_length:
                raise ValueError(f"answer {i} has {len(a)} tokens, more than the context window {self.max_length}")
            p_ids[i] = self._fit_prompt_ids(p_ids[i], self.max_length - len(a), f"prompt {i}")
        order = sorted(range(len(prompts)), key=lambda i: -(len(p_ids[i]) + len(a_ids[i])))
        result: list[np.ndarray] = [np.empty(0)] * len(prompts)
        batches = list(_chunks(len(order), self.batch_size))
        with torch.inference_mode():
            for b in progress(batches, show=self.show_progress, desc="score", leave=False):
                idx = [order[j] for j in b]
                ids, mask = self._pad_right([p_ids[i] + a_ids[i] for i in idx])
                pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
                rows = self._score_rows(ids, mask, pos, [len(p_ids[i]) for i in idx], [a_ids[i] for i in idx])
                for i, r in zip(idx, rows):
                    result[i] = r
        return ScoreResult.from_token_logprobs(result)

    def score_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        answers: Sequence[str | Sequence[str]],
    ) -> list[ScoreResult]:
        """Score answers under several passage orderings per question, reusing the shared prefix.

        For query ``q`` with orderings ``π_1..π_M`` the prompts ``x_m = prefix(q) + suffix(q, π_m)``
        share their leading tokens. Those tokens (the longest common token prefix of the ``M``
        prompts, at least the instruction + question) run through the model once; their key/value
        cache is gathered along the batch dimension to every ordering, and only each ordering's
        suffix + answer tokens are computed. Several questions are batched together: their
        prefixes are right-padded and the padding is masked out. The result equals
        ``score([build_prompt(q, [p[i] for i in π_m])], [answer_m])`` up to float error.

        Parameters
        ----------
        questions
            One question per query.
        passages
            Per query, the passages in retriever order.
        orderings
            Per query, ``M`` orderings; ``order[j]`` is the index of the passage at slot ``j``.
        answers
            Per query, one answer for all orderings or a list of ``M`` answers (one per ordering).

        Returns
        -------
        list[ScoreResult]
            One result per query with ``M`` entries (in ordering order).
        """
        import torch

        n = len(questions)
        if not (len(passages) == len(orderings) == len(answers) == n):
            raise ValueError(
                f"score_orderings() got {n} questions, {len(passages)} passage lists, {len(orderings)} "
                f"ordering lists and {len(answers)} answers; pass one of each per query")
        prompts: list[list[str]] = []
        ans: list[list[str]] = []
        for q in range(n):
            ps = as_passages(passages[q])
            orders = [list(map(int, o)) for o in orderings[q]]
            if not orders:
                raise ValueError(f"query {q} has no orderings; pass at least one ordering")
            for m, o in enumerate(orders):
                if any(i < 0 or i >= len(ps) for i in o) or len(set(o)) != len(o):
                    raise ValueError(f"ordering {m} of query {q} ({o}) must list distinct passage indices "
                                     f"in [0, {len(ps)})")
            texts = self._fit_passages(questions[q], ps)
            prompts.append([self.template.build(questions[q], [ps[i] for i in o], self.tokenizer,
                                                [texts[i] for i in o]) for o in orders])
            a = answers[q]
            if isinstance(a, str):
                ans.append([a] * len(orders))
            else:
                a = list(a)
                if len(a) != len(orders):
                    raise ValueError(f"query {q} has {len(orders)} orderings but {len(a)} answers; "
                                     "pass one answer string or one answer per ordering")
                ans.append(a)
        flat_p = [p for ps_ in prompts for p in ps_]
        flat_a = [self._answer_text(p, a, i) for i, (p, a) in enumerate(zip(flat_p, [a for as_ in ans for a in as_]))]
        if not self._cache_ok():
            logger.info("model cache layout does not allow prefix reuse; scoring orderings without it")
            res = self.score(flat_p, [a for as_ in ans for a in as_])
            out, off = [], 0
            for ps_ in prompts:
                out.append(ScoreResult.from_token_logprobs(res.token_logprobs[off:off + len(ps_)]))
                off += len(ps_)
            return out
        p_ids_flat = self._encode_prompts(flat_p)
        a_ids_flat = self._encode_texts(flat_a)
        # regroup per query
        p_ids: list[list[list[int]]] = []
        a_ids: list[list[list[int]]] = []
        off = 0
        for ps_ in prompts:
            p_ids.append(p_ids_flat[off:off + len(ps_)])
            a_ids.append(a_ids_flat[off:off + len(ps_)])
            off += len(ps_)
        prefix_len: list[int] = []
        for q in range(n):
            for m, a in enumerate(a_ids[q]):
                if not a:
                    raise ValueError(f"answer {m} of query {q} tokenises to nothing; pass a non-empty answer")
                if len(a) >= self.max_length:
                    raise ValueError(f"answer {m} of query {q} is longer than the context window")
                p_ids[q][m] = self._fit_prompt_ids(p_ids[q][m], self.max_length - len(a), f"query {q} prompt {m}")
            prefix_len.append(self._common_prefix_len(p_ids[q]))

        # group queries: each group's orderings fill about one batch
        groups: list[list[int]] = []
        cur: list[int] = []
        rows_in_cur = 0
        for q in sorted(range(n), key=lambda q: -max(len(p) for p in p_ids[q])):
            mq = len(p_ids[q])
            if cur and rows_in_cur + mq > self.batch_size:
                groups.append(cur)
                cur, rows_in_cur = [], 0
            cur.append(q)
            rows_in_cur += mq
        if cur:
            groups.append(cur)

        results: list[list[np.ndarray]] = [[np.empty(0)] * len(p_ids[q]) for q in range(n)]
        with torch.inference_mode():
            for g in progress(groups, show=self.show_progress, desc="score orderings", leave=False):
                self._score_group(g, p_ids, a_ids, prefix_len, results)
        return [ScoreResult.from_token_logprobs(r) for r in results]

    @staticmethod
    def _common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
        """Longest common token prefix, leaving at least one prompt token in every suffix."""
        first = seqs[0]
        lcp = min(len(s) for s in seqs) - 1
        for s in seqs[1:]:
            k = 0
            while k < lcp and s[k] == first[k]:
                k += 1
            lcp = k
        return max(lcp, 1) if min(len(s) for s in seqs) > 1 else 0

    def _cache_ok(self) -> bool:
        """Prefix reuse needs a decoder with plain full-attention key/value layers."""
        if self._decoder is None:
            return False
        text_cfg = self.model.config.get_text_config(decoder=True) if hasattr(self.model.config, "get_text_config") \
            else self.model.config
        if getattr(text_cfg, "sliding_window", None) and getattr(text_cfg, "use_sliding_window", True):
            layer_types = getattr(text_cfg, "layer_types", None)
            if layer_types is None or any(t != "full_attention" for t in layer_types):
                return False
        return True

    def _score_group(
        self,
        group: Sequence[int],
        p_ids: list[list[list[int]]],
        a_ids: list[list[list[int]]],
        prefix_len: Sequence[int],
        results: list[list[np.ndarray]],
    ) -> None:
        """Prefix forward once for the group's queries, then suffix + answer for all their orderings."""
        import torch
        from transformers import DynamicCache

        dev = self.device
        with_prefix = [q for q in group if prefix_len[q] > 0]
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        pre_mask = None
        local = {q: j for j, q in enumerate(with_prefix)}
        if with_prefix:
            pre_ids, pre_mask = self._pad_right([p_ids[q][0][: prefix_len[q]] for q in with_prefix])
            pos = torch.arange(pre_ids.shape[1], device=pre_ids.device).expand_as(pre_ids)
            _, cache = self._hidden(pre_ids, pre_mask, pos, past=DynamicCache(config=self.model.config),
                                    use_cache=True)
            kv = [(layer.keys, layer.values) for layer in cache.layers]
        rows = [(q, m) for q in group for m in range(len(p_ids[q]))]
        # rows without a usable prefix (one-token prompts) are scored without the cache
        plain = [(q, m) for q, m in rows if prefix_len[q] == 0]
        cached = [(q, m) for q, m in rows if prefix_len[q] > 0]
        for b in _chunks(len(plain), self.batch_size):
            sel = [plain[j] for j in b]
            ids, mask = self._pad_right([p_ids[q][m] + a_ids[q][m] for q, m in sel])
            pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
            out = self._score_rows(ids, mask, pos, [len(p_ids[q][m]) for q, m in sel], [a_ids[q][m] for q, m in sel])
            for (q, m), r in zip(sel, out):
                results[q][m] = r
        for b in _chunks(len(cached), self.batch_size):
            sel = [cached[j] for j in b]
            idx = torch.tensor([local[q] for q, _ in sel], device=dev, dtype=torch.long)
            past = DynamicCache(ddp_cache_data=[(k.index_select(0, idx), v.index_select(0, idx)) for k, v in kv])
            ids, mask = self._pad_right([p_ids[q][m][prefix_len[q]:] + a_ids[q][m] for q, m in sel])
            assert pre_mask is not None
            full_mask = torch.cat([pre_mask.index_select(0, idx), mask], dim=1)
            offs = torch.tensor([prefix_len[q] for q, _ in sel], device=dev, dtype=torch.long)
            pos = offs[:, None] + torch.arange(ids.shape[1], device=dev)[None, :]
            starts = [len(p_ids[q][m]) - prefix_len[q] for q, m in sel]
            out = self._score_rows(ids, full_mask, pos, starts, [a_ids[q][m] for q, m in sel], past=past)
            for (q, m), r in zip(sel, out):
                results[q][m] = r

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 32,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        n: int = 1,
        seed: int = 0,
        top_p: float = 1.0,
        min_new_tokens: int = 0,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt; greedy when ``temperature == 0``, else nucleus sampling.

        Prompts are sorted by length and batched with left padding; decoding reuses the key/
        value cache and stops per row at EOS or at the first stop string (which is trimmed).
        Sampling draws from ``softmax(logits / temperature)`` restricted to the smallest token
        set with probability mass ``>= top_p`` (Holtzman et al., ICLR 2020), with a
        ``torch.Generator`` seeded by ``seed`` (reproducible for the same inputs and batch size).
        EOS is forbidden for the first ``min_new_tokens`` steps.

        Returns
        -------
        list[str] | list[list[str]]
            One string per prompt when ``n == 1``, else ``n`` strings per prompt.
        """
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
        p_ids = self._encode_prompts(prompts)
        room = self.max_length - max_new_tokens
        if room < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room in the context window {self.max_length}")
        p_ids = [self._fit_prompt_ids(p, room, f"prompt {i}") for i, p in enumerate(p_ids)]
        rows = [(i, s) for i in range(len(prompts)) for s in range(n)]
        order = sorted(range(len(rows)), key=lambda r: -len(p_ids[rows[r][0]]))
        texts: list[str] = [""] * len(rows)
        gen = torch.Generator(device=self.device).manual_seed(int(seed)) if temperature > 0 else None
        batches = list(_chunks(len(order), self.batch_size))
        with torch.inference_mode():
            for b in progress(batches, show=self.show_progress, desc="generate", leave=False):
                idx = [order[j] for j in b]
                outs = self._decode_batch([p_ids[rows[r][0]] for r in idx], max_new_tokens, stops,
                                          temperature, top_p, gen, min_new_tokens)
                for r, t in zip(idx, outs):
                    texts[r] = t
        if n == 1:
            return texts
        return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _decode_batch(
        self,
        seqs: Sequence[Sequence[int]],
        max_new_tokens: int,
        stops: Sequence[str],
        temperature: float,
        top_p: float,
        gen: torch.Generator | None,
        min_new_tokens: int = 0,
    ) -> list[str]:
        import torch

        dev = self.device
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        eos = torch.tensor(self._eos_ids or [-1], device=dev)
        done = torch.zeros(len(seqs), dtype=torch.bool, device=dev)
        new: list[list[int]] = [[] for _ in seqs]
        past: Any = None
        step_ids, step_mask, step_pos = ids, mask, pos
        from transformers import DynamicCache

        past = DynamicCache(config=self.model.config)
        for step in range(max_new_tokens):
            if self._decoder is not None:
                hidden, past = self._hidden(step_ids, step_mask, step_pos, past=past, use_cache=True)
                logits = self._lm_head(hidden[:, -1]).float()
                if self._softcap:
                    logits = torch.tanh(logits / self._softcap) * self._softcap
            else:
                out = self.model(input_ids=step_ids, attention_mask=step_mask, position_ids=step_pos,
                                 past_key_values=past, use_cache=True, logits_to_keep=1)
                past = out.past_key_values
                logits = out.logits[:, -1].float()
            if step < min_new_tokens and self._eos_ids:
                logits[:, eos] = float("-inf")
            nxt = self._pick(logits, temperature, top_p, gen)
            nxt = torch.where(done, torch.full_like(nxt, self._pad_id), nxt)
            is_eos = torch.isin(nxt, eos) & ~done
            nxt_list = nxt.tolist()
            done_list = done.tolist()
            eos_list = is_eos.tolist()
            for r in range(len(seqs)):
                if done_list[r] or eos_list[r]:
                    continue
                new[r].append(nxt_list[r])
                if stops and self._cut_at_stop(self.tokenizer.decode(new[r], skip_special_tokens=True),
                                               stops) is not None:
                    eos_list[r] = True
            done = done | torch.tensor(eos_list, device=dev)
            if bool(done.all()):
                break
            last_pos = step_pos[:, -1:]
            step_ids = nxt[:, None]
            step_pos = last_pos + 1
            mask = torch.cat([mask, torch.ones((len(seqs), 1), dtype=mask.dtype, device=dev)], dim=1)
            step_mask = mask
        outs = []
        for r in range(len(seqs)):
            text = self.tokenizer.decode(new[r], skip_special_tokens=True)
            cut = self._cut_at_stop(text, stops)
            outs.append(text if cut is None else text[:cut])
        return outs

    @staticmethod
    def _cut_at_stop(text: str, stops: Sequence[str]) -> int | None:
        """Index of the first stop string after the leading whitespace (``None``: no stop yet).

        Leading whitespace is skipped so that a ``"\\n"`` stop does not end an answer that starts
        on a new line before it has begun.
        """
        start = len(text) - len(text.lstrip())
        hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
        return min(hits) if hits else None

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> torch.Tensor:
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
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    def answer(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        max_new_tokens: int = 32,
    ) -> list[str]:
        """Greedy short answers: build each prompt, generate, keep the first line, trim stop strings.

        EOS is forbidden as the first token (small models otherwise often stop at once).
        """
        questions = list(questions)
        if len(questions) != len(passages):
            raise ValueError(f"answer() got {len(questions)} questions but {len(passages)} passage lists; "
                             "pass one passage list per question")
        prompts = [self.build_prompt(q, ps) for q, ps in zip(questions, passages)]
        outs = self.generate(prompts, max_new_tokens=max_new_tokens, stop=list(self.template.stop),
                             min_new_tokens=1)
        return [self.clean_answer(str(o)) for o in outs]

    @staticmethod
    def clean_answer(text: str) -> str:
        """The answer inside a completion: :func:`ragkit.text.extract_answer` (first non-empty line,
        without lead-ins such as ``"Answer:"``, ``"The answer is:"``, ``"[3]"``, quotes stripped)."""
        from ragkit.text import extract_answer

        return extract_answer(text)
