"""The causal-LM generator every other part of ragkit uses: a facade over prompts, scoring and decoding.

:class:`Generator` holds the model handle (:class:`~ragkit.generation.handle.ModelHandle`: model,
tokenizer, pad/EOS ids, cache arguments, counters) and the prompt settings, and delegates each job
to its module: passage fitting and tokenisation (:mod:`ragkit.generation.fitting`), prompt layout
(:mod:`ragkit.generation.layout`), teacher-forced scoring with shared-prefix key/value reuse
(:mod:`ragkit.generation.scoring`), decoding (:mod:`ragkit.generation.decoding`); those modules
take the handle and never import this facade. Answers are read from completions by the one extractor
:func:`ragkit.text.extract_answer`. Its contract toward the rest of ragkit is
:class:`ragkit.generation.base.GeneratorLike`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ragkit.generation import decoding, scoring
from ragkit.generation.base import CandidateFn, OrderingRun, ScoreResult
from ragkit.generation.fitting import answer_text, encode_answers, encode_prompts, encode_texts, fit_passages
from ragkit.generation.handle import ModelHandle
from ragkit.generation.prompts import PromptTemplate, get_template
from ragkit.text import extract_answer
from ragkit.types import Passage, as_passages

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = ["Generator", "ScoreResult", "OrderingRun"]

_DEFAULT_MAX_LENGTH_CAP = 4096


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
    decode_batch_size
        Rows per greedy decoding step (``None``: ``batch_size``). Greedy generation and
        :meth:`run_orderings` prefill ``batch_size`` rows at a time and then decode several such
        batches together, their key/value caches stacked, up to this many rows. A decoding step
        reads every weight once for all its rows, so its time grows far more slowly with the rows
        than a prefill's: on 2 CPU cores, Qwen2.5-0.5B at a 600-token cache took 0.54 s a step for
        8 rows and 1.0 s for 32, and its position sweep ran 1.07-1.33x faster with 32 than with 8
        (``batch_size=8``; ``benchmarks/sweep_prefix.py --decode-batch-size 32``), with the same
        answers. The price is memory: the caches of that many rows are held at once (for
        :meth:`run_orderings` with candidates, until they are scored).
        Sampled generation (``temperature > 0``) decodes each prefill batch alone, so a seed's
        draws do not depend on this setting.
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
        decode_batch_size: int | None = None,
    ) -> None:
        from ragkit.models import DEFAULT_GENERATOR, load_generator

        hf_model, tokenizer = load_generator(model, device=device, dtype=dtype)
        self._setup(hf_model, tokenizer, name=model or DEFAULT_GENERATOR, template=template,
                    batch_size=batch_size, max_length=max_length,
                    passage_max_tokens=passage_max_tokens, show_progress=show_progress,
                    decode_batch_size=decode_batch_size)

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
        decode_batch_size: int | None = None,
    ) -> Generator:
        """Wrap an already-loaded Hugging Face causal LM and its tokenizer (no copy is made).

        The model is used in whatever mode it is in; call ``model.eval()`` for deterministic
        scores. A tokenizer without a pad token gets its EOS token as pad token.
        """
        obj = cls.__new__(cls)
        obj._setup(model, tokenizer, name=name or getattr(model.config, "_name_or_path", "") or "model",
                   template=template, batch_size=batch_size, max_length=max_length,
                   passage_max_tokens=passage_max_tokens, show_progress=show_progress,
                   decode_batch_size=decode_batch_size)
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
        decode_batch_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        _check_decode_batch_size(decode_batch_size)
        if passage_max_tokens is not None and passage_max_tokens < 1:
            raise ValueError(f"passage_max_tokens must be >= 1 or None, got {passage_max_tokens}")
        self.name = str(name)
        self.passage_max_tokens = passage_max_tokens
        cfg = model.config
        text_cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
        if max_length is None:
            mpe = getattr(text_cfg, "max_position_embeddings", None) or 2048
            max_length = min(int(mpe), _DEFAULT_MAX_LENGTH_CAP)
        if max_length < self.answer_reserve + 8:
            raise ValueError(f"max_length={max_length} is too small; use at least {self.answer_reserve + 8}")
        self.handle = ModelHandle.wrap(model, tokenizer, batch_size=batch_size, max_length=max_length,
                                       show_progress=show_progress, decode_batch_size=decode_batch_size)
        self.template = get_template(template, tokenizer)

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The Hugging Face causal LM."""
        return self.handle.model

    @property
    def tokenizer(self) -> Any:
        """Its tokenizer."""
        return self.handle.tokenizer

    @property
    def batch_size(self) -> int:
        """Sequences per forward pass."""
        return self.handle.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if int(value) < 1:
            raise ValueError(f"batch_size must be >= 1, got {value}")
        self.handle.batch_size = int(value)

    @property
    def decode_batch_size(self) -> int:
        """Rows per greedy decoding step (at least ``batch_size``; see the class docstring)."""
        from ragkit.generation.decoding import decode_rows

        return decode_rows(self.handle)

    @decode_batch_size.setter
    def decode_batch_size(self, value: int | None) -> None:
        _check_decode_batch_size(value)
        self.handle.decode_batch_size = None if value is None else int(value)

    @property
    def max_length(self) -> int:
        """Context window in tokens."""
        return self.handle.max_length

    @property
    def show_progress(self) -> bool | None:
        """Progress bars (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set)."""
        return self.handle.show_progress

    @show_progress.setter
    def show_progress(self, value: bool | None) -> None:
        self.handle.show_progress = value

    @property
    def counters(self) -> dict[str, int]:
        """Token counters: ``prefill_tokens``, ``decode_tokens``, ``forwards`` (see :meth:`reset_counters`)."""
        return self.handle.counters

    @property
    def device(self) -> str:
        """The device of the model's parameters, e.g. ``"cpu"`` or ``"cuda:0"``."""
        return self.handle.device

    def __repr__(self) -> str:
        return (f"Generator(name={self.name!r}, device={self.device!r}, template={self.template.name!r}, "
                f"batch_size={self.batch_size}, max_length={self.max_length})")

    def reset_counters(self) -> dict[str, int]:
        """Return the token counters (``prefill_tokens``, ``decode_tokens``, ``forwards``) and zero them."""
        old = dict(self.counters)
        for k in self.counters:
            self.counters[k] = 0
        return old

    # ------------------------------------------------------------------ tokenisation
    def _encode_prompts(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_prompts(self.tokenizer, texts)

    def _encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_texts(self.tokenizer, texts)

    @staticmethod
    def _answer_text(prompt: str, answer: str, i: int) -> str:
        return answer_text(prompt, answer, i)

    def encode_answers(self, prompts: Sequence[str], answers: Sequence[str]) -> tuple[list[list[int]], list[list[int]]]:
        """``(prompt_ids, answer_ids)``: each prompt and its answer tokenised together, split by offsets.

        A space is put before an answer that follows a non-space prompt end (as :meth:`score`
        does); ``prompt_ids + answer_ids`` are the tokens the model reads (see
        :func:`ragkit.generation.fitting.encode_answers`).
        """
        prompts, answers = list(prompts), list(answers)
        if len(prompts) != len(answers):
            raise ValueError(f"got {len(prompts)} prompts but {len(answers)} answers; pass one answer per prompt")
        texts = [answer_text(p, a, i) for i, (p, a) in enumerate(zip(prompts, answers))]
        return encode_answers(self.tokenizer, prompts, texts)

    # ------------------------------------------------------------------ prompts
    def _fit_passages(self, question: str, passages: Sequence[Passage]) -> list[str]:
        return fit_passages(self.tokenizer, self.template, question, passages, max_length=self.max_length,
                            answer_reserve=self.answer_reserve, passage_max_tokens=self.passage_max_tokens)

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

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: Sequence[str], answers: Sequence[str]) -> ScoreResult:
        """Teacher-forced ``log p(answer | prompt)`` for aligned prompts and answers.

        Prompt and answer are tokenised together and the answer's tokens found by character
        offsets (a space is put before the answer when the prompt ends in a non-space
        character), so the scored tokens are those the model reads after the prompt. Log-probs
        come from the model's own forward at the answer positions only (``logits_to_keep``).

        Raises
        ------
        ValueError
            When the lengths differ or an answer is empty.
        """
        return scoring.score(self.handle, prompts, answers)

    def score_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        answers: Sequence[str | Sequence[str]],
        template: PromptTemplate | None = None,
    ) -> list[ScoreResult]:
        """Score answers under several passage orderings per question, reusing the shared prefix.

        For query ``q`` with orderings ``π_1..π_M`` the prompts ``x_m = prefix(q) + suffix(q, π_m)``
        share their leading tokens. Those tokens (the longest common token prefix of the ``M``
        prompts, at least the instruction + question) run through the model once; their key/value
        cache is gathered along the batch dimension to every ordering, and only each ordering's
        suffix + answer tokens are computed. The result equals
        ``score([build_prompt(q, [p[i] for i in π_m])], [answer_m])`` up to float error.

        Parameters
        ----------
        questions
            One question per query.
        passages
            Per query, the passages in retriever order.
        orderings
            Per query, ``M`` orderings; ``order[j]`` is the index of the passage at slot ``j``. An
            ordering may hold any subset of distinct indices (``[]``: a prompt without passages).
        answers
            Per query, one answer for all orderings or a list of ``M`` answers (one per ordering).
        template
            Lay the prompts out with this template instead of the generator's own (the
            ``question`` outcome scores the question with :func:`ragkit.generation.question_template`).

        Returns
        -------
        list[ScoreResult]
            One result per query with ``M`` entries (in ordering order).
        """
        return scoring.score_orderings(self.handle, self, questions, passages, orderings, answers, template)

    def run_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        candidates: CandidateFn | None = None,
        max_new_tokens: int = 16,
        stop: Sequence[str] | None = None,
        min_new_tokens: int = 0,
    ) -> list[OrderingRun]:
        """One prefill per ordering: each ordering's greedy answer, then candidates scored from its cache.

        Per query the shared prefix runs once, each ordering's suffix once; greedy decoding
        continues from that cache (stop strings: the template's). ``candidates(q, answers)`` then
        names the answers to score under every ordering of query ``q`` (rounds: one string for all
        orderings or one per ordering, ``""`` to skip); each is scored as a continuation of the
        ordering's cached prompt (no new prefill), and an answer that is the ordering's own greedy
        output takes the decode step's log-probs. Answers equal
        ``[clean_answer(a) for a in generate(prompts, max_new_tokens, stop)]`` and scores equal
        :meth:`score_orderings` up to float error. ``min_new_tokens`` forbids EOS for the first steps
        (``1``: the answers of :meth:`answer`, which never stops before its first token).
        """
        return scoring.run_orderings(self.handle, self, questions, passages, orderings, candidates, max_new_tokens,
                                     stop, min_new_tokens)

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
        return decoding.generate(self.handle, prompts, max_new_tokens=max_new_tokens, stop=stop,
                                 temperature=temperature, n=n, seed=seed, top_p=top_p, min_new_tokens=min_new_tokens)

    def answer(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        max_new_tokens: int = 32,
        drafts: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Greedy short answers: build each prompt, generate, keep the first line, trim stop strings.

        EOS is forbidden as the first token (small models otherwise often stop at once).
        ``drafts`` (optional, one per question, e.g. MoI's consensus answer) are checked in one
        forward each (:func:`ragkit.generation.decoding.verify_drafts`, greedy speculative
        decoding): a draft that greedy decoding would produce is returned without decoding; the
        others are generated as usual. The answers are the same either way.
        """
        questions = list(questions)
        if len(questions) != len(passages):
            raise ValueError(f"answer() got {len(questions)} questions but {len(passages)} passage lists; "
                             "pass one passage list per question")
        if drafts is not None and len(drafts) != len(questions):
            raise ValueError(f"answer() got {len(questions)} questions but {len(drafts)} drafts; pass one per question")
        prompts = [self.build_prompt(q, ps) for q, ps in zip(questions, passages)]
        stops = list(self.template.stop)
        outs: list[str | None] = [None] * len(prompts)
        if drafts is not None:
            outs = decoding.verify_drafts(self.handle, prompts, drafts, max_new_tokens, stops, min_new_tokens=1)
        todo = [i for i, o in enumerate(outs) if o is None]
        if todo:
            gen = self.generate([prompts[i] for i in todo], max_new_tokens=max_new_tokens, stop=stops,
                                min_new_tokens=1)
            for i, o in zip(todo, gen):
                outs[i] = str(o)
        return [self.clean_answer(str(o)) for o in outs]

    @staticmethod
    def clean_answer(text: str) -> str:
        """The answer inside a completion: :func:`ragkit.text.extract_answer` (first non-empty line,
        without lead-ins such as ``"Answer:"``, ``"The answer is:"``, ``"[3]"`` and surrounding quotes)."""
        return extract_answer(text)


def _check_decode_batch_size(value: int | None) -> None:
    if value is not None and int(value) < 1:
        raise ValueError(f"decode_batch_size must be >= 1 or None, got {value}")
