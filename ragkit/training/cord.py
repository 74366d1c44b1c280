"""CORD: consistency and rank distillation against passage-order bias (training).

Lee et al., "CORD: Balancing COnsistency and Rank Distillation for Robust Retrieval-Augmented
Generation", NAACL 2025, arXiv 2412.14581. The authors' code is not public; the details below
are the project's documented choices.

Each example has a question ``q``, passages in retriever order ``c`` with scores ``s`` and a
target answer ``y = y_1..y_T``. A perturbed ordering ``c'`` is drawn from the interpolation space
of :mod:`ragkit.training.perturb`. Both prompts run through the model in ONE forward pass
(stacked along the batch dimension: rows ``0..B−1`` hold ``c``, rows ``B..2B−1`` hold ``c'``).
Each row is ``prompt + answer`` with right padding; the prompts differ in length, so the hidden
state predicting answer token ``t`` of row ``r`` sits at index ``len(prompt_r) + t − 1`` and is
gathered by index (only those ``T`` positions go through the LM head). The answer tokens are
identical in both rows of a pair, so the two answer-token distributions ``p_c(· | t)`` and
``p_c'(· | t)`` are aligned token by token.

Losses (per example, averaged over its answer tokens, then over the batch)::

    CE(y | q, c)   = −(1/T) Σ_t log p_c(y_t | q, c, y_<t)

    cord:         L = CE(y | q, c) + λ · (1/T) Σ_t KL(sg[p_teacher(·|t)] ‖ p_student(·|t))
                  KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))     (forward KL: teacher first)
                  teacher = the ordering with the lower CE on y (adaptive teacher selection),
                  student = the other one, sg = stop-gradient; c' from the score-aware α
    consistency:  L = CE(y | q, c) + λ · (1/T) Σ_t JS(p_c(·|t) ‖ p_c'(·|t))
                  JS(P ‖ Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M),  M = ½ (P + Q)   (no teacher)
    shuffle:      L = CE(y | q, c'),  c' a UNIFORM random permutation (α = 1):
                  position-randomised training, the usual baseline
    score_aware:  L = CE(y | q, c'),  c' from the score-aware α (the mild perturbation CORD uses)
    ce:           L = CE(y | q, c)                                     (plain fine-tuning baseline)

``ce_on="both"`` replaces ``CE(y | q, c)`` by ``½ (CE(y | q, c) + CE(y | q, c'))``.

Every knob is one field of :class:`CORDConfig` (a ``transformers.TrainingArguments``), and
training runs through :class:`CORDTrainer`, a ``transformers.Trainer`` subclass that overrides
``compute_loss``, so ``accelerate launch`` (DDP), DeepSpeed and FSDP work unchanged::

    ragkit train cord --config run.yaml
    accelerate launch -m ragkit.cli train cord --config run.yaml

The output folder holds the checkpoints (``checkpoint-N/``), ``cord_settings.json``,
``cord_summary.json`` and the trained model in ``final/`` (written atomically). A resume
refuses a checkpoint trained with other settings (:func:`ragkit.training.checkpoint.check_resume`).
"""

from __future__ import annotations

import logging
import math
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from ragkit.generation.fitting import fit_prompt_ids
from ragkit.io import write_json
from ragkit.training.checkpoint import SettingsCallback, check_resume, prepare_run_dir, save_final_model
from ragkit.training.config import RagkitConfigMixin, check_warmup_ratio, warn_inert
from ragkit.training.data import Example
from ragkit.training.perturb import OrderPerturbation, kendall_tau

if TYPE_CHECKING:  # pragma: no cover
    from ragkit.generation import Generator
    from ragkit.training.models import LoadedModel

__all__ = [
    "LOSSES",
    "CORDCollator",
    "CORDConfig",
    "CORDLossOutput",
    "CORDTrainer",
    "answer_logprobs",
    "js_divergence",
    "kl_divergence",
    "load_model",
    "make_trainer",
    "pair_loss",
    "perturbation_for",
    "token_ce",
    "train_cord",
]

logger = logging.getLogger(__name__)

LOSSES: tuple[str, ...] = ("cord", "consistency", "shuffle", "score_aware", "ce")
"""Loss names: ``cord`` and ``consistency`` use both orderings; ``shuffle`` (uniform permutation)
and ``score_aware`` (score-aware α) only the perturbed one; ``ce`` only the retriever order."""

PAIRED_LOSSES: tuple[str, ...] = ("cord", "consistency")
PERTURBED_ONLY: tuple[str, ...] = ("shuffle", "score_aware")

# ---------------------------------------------------------------------------------------- losses
def token_ce(logp: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean cross-entropy ``−(1/T) Σ_t log p(y_t)``.

    Parameters
    ----------
    logp
        ``(B, T, V)`` log-probabilities at the answer positions.
    targets
        ``(B, T)`` answer token ids.
    mask
        ``(B, T)`` bool, True at real answer tokens.

    Returns
    -------
    torch.Tensor
        ``(B,)``.
    """
    m = mask.to(logp.dtype)
    nll = -logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return (nll * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean over answer tokens of ``KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))``; ``(B,)``.

    The first argument is the reference distribution ``P`` (CORD: the teacher), the second the
    approximation ``Q`` (the student): forward KL, mass-covering.
    """
    m = mask.to(logp.dtype)
    kl = (torch.exp(logp) * (logp - logq)).sum(-1)
    return (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def js_divergence(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean over answer tokens of the Jensen-Shannon divergence; ``(B,)``.

    ``JS(P ‖ Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M)`` with ``M = ½ (P + Q)``; symmetric, in ``[0, log 2]``.
    """
    logm = torch.logsumexp(torch.stack([logp, logq]), dim=0) - math.log(2.0)
    return 0.5 * kl_divergence(logp, logm, mask) + 0.5 * kl_divergence(logq, logm, mask)


@dataclass
class CORDLossOutput:
    """The loss and its parts (all ``(B,)`` tensors except ``loss``)."""

    loss: torch.Tensor
    ce_original: torch.Tensor | None
    ce_perturbed: torch.Tensor | None
    reg: torch.Tensor | None
    teacher_is_original: torch.Tensor | None


def pair_loss(
    logp_orig: torch.Tensor | None,
    logp_pert: torch.Tensor | None,
    targets: torch.Tensor,
    mask: torch.Tensor,
    loss: str = "cord",
    lam: float = 1.0,
    ce_on: str = "original",
) -> CORDLossOutput:
    """The CORD family of losses on aligned answer-token log-probabilities.

    Parameters
    ----------
    logp_orig, logp_pert
        ``(B, T, V)`` log-probabilities under the retriever order ``c`` and the perturbed order
        ``c'`` (one may be ``None`` for ``ce`` / ``shuffle``).
    targets, mask
        ``(B, T)`` answer ids and their mask (identical for both orderings).
    loss
        One of :data:`LOSSES` (formulas in the module docstring); ``shuffle`` and ``score_aware``
        differ only in how ``c'`` was drawn, so here both are ``CE(y | q, c')``.
    lam
        λ, weight of the KL / JS term.
    ce_on
        ``"original"``: CE on ``c`` only (the paper's form); ``"both"``: mean of both orderings' CE.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
    if ce_on not in ("original", "both"):
        raise ValueError(f"ce_on must be 'original' or 'both', got {ce_on!r}")
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if loss in PERTURBED_ONLY:
        if logp_pert is None:
            raise ValueError(f"the {loss} loss needs the perturbed ordering's log-probs")
        ce_p = token_ce(logp_pert, targets, mask)
        return CORDLossOutput(ce_p.mean(), None, ce_p, None, None)
    if logp_orig is None:
        raise ValueError(f"the {loss} loss needs the retriever order's log-probs")
    ce_o = token_ce(logp_orig, targets, mask)
    if loss == "ce":
        return CORDLossOutput(ce_o.mean(), ce_o, None, None, None)
    if logp_pert is None:
        raise ValueError(f"the {loss} loss needs both orderings' log-probs")
    ce_p = token_ce(logp_pert, targets, mask)
    ce = ce_o if ce_on == "original" else 0.5 * (ce_o + ce_p)
    if loss == "consistency":
        reg = js_divergence(logp_orig, logp_pert, mask)
        return CORDLossOutput((ce + lam * reg).mean(), ce_o, ce_p, reg, None)
    # cord: adaptive teacher = lower CE on y (decided without gradient), stop-gradient on the teacher
    teacher_orig = (ce_o.detach() <= ce_p.detach())
    sel = teacher_orig[:, None, None]
    teacher = torch.where(sel, logp_orig, logp_pert).detach()
    student = torch.where(sel, logp_pert, logp_orig)
    reg = kl_divergence(teacher, student, mask)
    return CORDLossOutput((ce + lam * reg).mean(), ce_o, ce_p, reg, teacher_orig)


def _is_right_padded(mask: torch.Tensor) -> bool:
    """True when every row's mask is ones followed by zeros (no left padding, no holes)."""
    m = mask.long()
    return bool((m[:, 1:] <= m[:, :-1]).all())


def answer_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, answer_pos: torch.Tensor,
    right_padded: bool = True,
) -> torch.Tensor:
    """``(R, T, V)`` log-softmax of the logits that predict the answer tokens.

    ``answer_pos[r, t]`` is the index of the hidden state that predicts answer token ``t`` of row
    ``r``. The positions go to the model as a 2-D ``logits_to_keep`` (only those rows of the hidden
    states reach the LM head); models without that argument fall back to full logits + gather.
    The model is called through its own ``forward`` so that DDP / FSDP wrappers see the call.
    With right padding (``right_padded``, checked on the mask) the mask is not passed: under causal
    attention the real tokens never attend to the trailing padding, so the result is the same and
    attention runs without a dense mask (about 2-3x less memory on CPU).
    """
    mask = attention_mask
    if right_padded and mask is not None and _is_right_padded(mask):
        # causal attention never lets a real token see the padding that follows it, so the mask
        # can be dropped: SDPA then takes its causal fast path instead of a dense (L x L) mask
        mask = None
    try:
        out = model(input_ids=input_ids, attention_mask=mask, logits_to_keep=answer_pos, use_cache=False)
        logits = out.logits
        if logits.shape[:2] != answer_pos.shape:
            raise TypeError("logits_to_keep ignored")
    except TypeError:
        out = model(input_ids=input_ids, attention_mask=mask, use_cache=False)
        logits = torch.take_along_dim(out.logits, answer_pos[..., None], dim=1)
    return torch.log_softmax(logits.float(), dim=-1)


# ---------------------------------------------------------------------------------------- perturbation
def perturbation_for(loss: str, gamma: float = 1.0, alpha: float | None = None) -> OrderPerturbation:
    """The ordering sampler of a loss.

    ``shuffle`` is a uniform random permutation (``α = 1``); the others draw the score-aware
    ``α ~ U(0, 1 − tanh(γ·margin/std))`` unless a fixed ``alpha`` is given (``ce`` never uses it).

    Raises
    ------
    ValueError
        ``shuffle`` with a fixed ``alpha`` other than 1 (use ``score_aware`` or ``cord`` for a
        milder perturbation).
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
    if loss == "shuffle":
        if alpha is not None and float(alpha) != 1.0:
            raise ValueError(f"the shuffle baseline is a uniform shuffle (alpha = 1), got alpha={alpha}; "
                             "use loss='score_aware' (or 'cord') for a partial perturbation")
        return OrderPerturbation(gamma=gamma, alpha=1.0)
    return OrderPerturbation(gamma=gamma, alpha=alpha)


def _is_uniform(p: OrderPerturbation) -> bool:
    return p.alpha == 1.0 and p.alpha_cap == 1.0


# ---------------------------------------------------------------------------------------- collator
class CORDCollator:
    """Builds stacked RAG prompts (retriever order + perturbed order) with the Generator's template.

    For a batch of ``B`` examples the output holds ``2B`` rows for the paired losses (rows
    ``0..B−1``: retriever order, ``B..2B−1``: perturbed) and ``B`` rows for ``ce`` (retriever order)
    and ``shuffle`` / ``score_aware`` (perturbed order). Every row is ``prompt ids + answer ids``,
    right-padded; prompt and answer are tokenised together and split by character offsets
    (:meth:`ragkit.generation.Generator.encode_answers`), exactly as
    :meth:`ragkit.generation.Generator.score` does, and an over-long prompt keeps its last tokens.

    Output keys: ``input_ids``, ``attention_mask`` ``(R, L)``; ``answer_pos`` ``(R, T)`` (index of
    the hidden state predicting each answer token; padding repeats the first one); ``answer_ids``
    and ``answer_mask`` ``(B, T)``; ``alpha`` and ``kendall_tau`` ``(B,)`` of the perturbations.

    The perturbation of an example is drawn from a generator seeded with
    ``(seed, epoch, crc32(example id))``, so it does not depend on batch composition and is the
    same after a resume (:class:`EpochCallback` keeps ``epoch`` in sync with the Trainer; use
    ``dataloader_num_workers=0`` or non-persistent workers).

    Parameters
    ----------
    generator
        A :class:`~ragkit.generation.Generator` (its template, tokenizer and passage truncation).
    loss
        One of :data:`LOSSES`.
    perturbation
        The ordering sampler (default: :func:`perturbation_for` ``(loss)``; ``shuffle`` accepts
        only a uniform one).
    seed
        Seed of the perturbations.
    max_answer_tokens
        Answers are cut to this many tokens.
    """

    def __init__(
        self,
        generator: Generator,
        loss: str = "cord",
        perturbation: OrderPerturbation | None = None,
        seed: int = 0,
        max_answer_tokens: int = 32,
    ) -> None:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
        if max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be >= 1, got {max_answer_tokens}")
        perturbation = perturbation or perturbation_for(loss)
        if loss == "shuffle" and not _is_uniform(perturbation):
            raise ValueError("the shuffle loss needs a uniform perturbation (alpha = 1, no cap); "
                             "use loss='score_aware' for a score-aware one")
        self.generator = generator
        self.loss = loss
        self.perturbation = perturbation
        self.seed = int(seed)
        self.max_answer_tokens = int(max_answer_tokens)
        self.epoch = 0

    def rng_for(self, example_id: str) -> np.random.Generator:
        """The generator that draws ``example_id``'s perturbation in the current epoch."""
        return np.random.default_rng([self.seed, self.epoch, zlib.crc32(example_id.encode("utf-8"))])

    def orders(self, examples: Sequence[Example]) -> tuple[list[np.ndarray], list[float]]:
        """The perturbed ordering and α of every example."""
        orders, alphas = [], []
        for ex in examples:
            o, a = self.perturbation.sample(ex.scores, k=len(ex.passages), rng=self.rng_for(ex.id))
            orders.append(o)
            alphas.append(a)
        return orders, alphas

    def __call__(self, examples: Sequence[Example]) -> dict[str, Any]:
        examples = list(examples)
        if not examples:
            raise ValueError("empty batch")
        gen = self.generator
        pert, alphas = self.orders(examples)
        ident = [np.arange(len(ex.passages)) for ex in examples]
        if self.loss in PAIRED_LOSSES:
            row_orders = ident + pert
        elif self.loss in PERTURBED_ONLY:
            row_orders = pert
        else:
            row_orders = ident
        row_ex = [examples[r % len(examples)] for r in range(len(row_orders))]
        prompts = [gen.build_prompt(ex.question, [ex.passages[int(i)] for i in o]) for ex, o in zip(row_ex, row_orders)]
        # prompt + answer tokenised together and split by offsets, exactly as Generator.score does
        p_ids, row_a = gen.encode_answers(prompts, [ex.answer for ex in row_ex])
        b = len(examples)
        for r, a in enumerate(row_a):
            if not a:
                raise ValueError(f"example {row_ex[r].id!r}: the answer tokenises to nothing")
            if a != row_a[r % b]:
                raise ValueError(f"example {row_ex[r].id!r}: the answer tokenises differently after the two "
                                 "orderings' prompts; the template must end the same way for every ordering")
        a_ids = [a[: self.max_answer_tokens] for a in row_a[:b]]
        t_max = max(len(a) for a in a_ids)
        rows = [fit_prompt_ids(list(p), gen.max_length - len(a_ids[r % b]), f"example {row_ex[r].id!r} prompt",
                               gen.max_length) for r, p in enumerate(p_ids)]
        seqs = [p + a_ids[r % b] for r, p in enumerate(rows)]
        width = max(len(s) for s in seqs)
        pad = int(gen.tokenizer.pad_token_id)
        input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        pos = torch.zeros((len(seqs), t_max), dtype=torch.long)
        for r, s in enumerate(seqs):
            input_ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
            attn[r, : len(s)] = 1
            n_a = len(a_ids[r % b])
            start = len(rows[r]) - 1
            pos[r, :n_a] = torch.arange(start, start + n_a)
            pos[r, n_a:] = start
        ans = torch.zeros((b, t_max), dtype=torch.long)
        amask = torch.zeros((b, t_max), dtype=torch.bool)
        for i, a in enumerate(a_ids):
            ans[i, : len(a)] = torch.tensor(a, dtype=torch.long)
            amask[i, : len(a)] = True
        return {
            "input_ids": input_ids,
            "attention_mask": attn,
            "answer_pos": pos,
            "answer_ids": ans,
            "answer_mask": amask,
            "alpha": torch.tensor(alphas, dtype=torch.float32),
            "kendall_tau": torch.tensor([kendall_tau(o) for o in pert], dtype=torch.float32),
        }


# ---------------------------------------------------------------------------------------- config
@dataclass
class CORDConfig(RagkitConfigMixin, TrainingArguments):
    """Every setting of a CORD run: the method's knobs plus all of ``transformers.TrainingArguments``.

    Saved as ``cord_settings.json`` in the output folder; ``ragkit train cord`` is generated from
    these fields (``--help`` lists them), and ``--config run.yaml`` / ``run.json`` sets them from a
    file. Defaults that differ from ``TrainingArguments``: ``learning_rate`` 1e-4, ``max_steps``
    100, ``per_device_train_batch_size`` 2, ``save_steps`` 50, ``logging_steps`` 10, ``seed`` 0,
    ``remove_unused_columns`` False (the collator needs the raw examples).
    """

    # -- what to train on
    model: str | None = field(default=None, metadata={
        "help": "Model to fine-tune: hub id, folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)."})
    data_file: str | None = field(default=None, metadata={
        "help": "Training data: HotpotQA JSONL (distractor), MS MARCO QnA JSON or NQ-open JSONL."})
    dataset: Literal["hotpotqa", "msmarco", "nq-open"] | None = field(default=None, metadata={
        "help": "Format of --data_file (default: detected from its content)."})
    limit: int | None = field(default=None, metadata={"help": "Use the first N records of the data file."})
    k: int | None = field(default=None, metadata={
        "help": "Keep the top k BM25-ranked passages of each question (default: all).", "aliases": ["-k"]})
    # -- the objective
    loss: Literal["cord", "consistency", "shuffle", "score_aware", "ce"] = field(default="cord", metadata={
        "help": "cord: CE + lambda * KL(teacher || student), lower-CE ordering as stop-gradient teacher; "
                "consistency: CE + lambda * symmetric JS; shuffle: CE on a uniformly shuffled order "
                "(position-randomised baseline); score_aware: CE on the score-aware perturbed order; "
                "ce: CE on the retriever order."})
    lam: float = field(default=1.0, metadata={"help": "lambda, weight of the KL / JS term."})
    ce_on: Literal["original", "both"] = field(default="original", metadata={
        "help": "CE on the retriever order only (the paper's form) or the mean over both orderings."})
    gamma: float = field(default=1.0, metadata={
        "help": "Score-aware perturbation: alpha ~ U(0, 1 - tanh(gamma * margin / std)) of the retriever scores."})
    alpha: float | None = field(default=None, metadata={
        "help": "Fixed interpolation alpha in [0, 1] instead of the score-aware draw (shuffle: always 1)."})
    # -- prompts
    template: str = field(default="auto", metadata={
        "help": "Prompt template: auto|short|chat|plain (auto = chat when the model has one)."})
    passage_max_tokens: int = field(default=60, metadata={
        "help": "Cut each passage to this many tokens (0 = no cut)."})
    max_length: int | None = field(default=None, metadata={
        "help": "Context window in tokens (default: the model's)."})
    max_answer_tokens: int = field(default=32, metadata={"help": "Cut each target answer to this many tokens."})
    # -- model
    dtype: str = field(default="float32", metadata={"help": "Model dtype: float32|bfloat16|float16|auto."})
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (peft) instead of all weights."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank r."})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA alpha (default: 2 * lora_r)."})
    lora_target: str = field(default="all-linear", metadata={"help": "LoRA target modules (peft syntax)."})
    merge_lora: bool = field(default=True, metadata={
        "help": "Save final/ with the adapter merged (a plain HF model); --no_merge_lora saves the adapter only."})
    warmup_ratio: float = field(default=0.0, metadata={
        "help": "Warm-up as a fraction of the training steps: ceil(ratio * steps) steps (transformers 5 has no "
                "warmup_ratio of its own)."})
    # -- TrainingArguments fields with CORD's defaults
    output_dir: str | None = field(default=None, metadata={
        "help": "Run folder: checkpoints, final/ model, cord_settings.json, cord_summary.json (required)."})
    learning_rate: float = field(default=1e-4, metadata={
        "help": "Peak learning rate of AdamW (linear decay); about 2e-4 suits LoRA, 2e-5 full fine-tuning."})
    per_device_train_batch_size: int = field(default=2, metadata={
        "help": "Examples per device step (rows = 2x for the paired losses)."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Gradient accumulation steps."})
    max_steps: int = field(default=100, metadata={"help": "Optimisation steps."})
    save_steps: float = field(default=50, metadata={"help": "Save a checkpoint every N steps."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N steps."})
    seed: int = field(default=0, metadata={"help": "Seed of the initialisation, data order and perturbations."})
    remove_unused_columns: bool = field(default=False, metadata={
        "help": "Must stay False: the collator builds the prompts from the raw examples."})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "Resume from this checkpoint folder, or 'last' (the newest checkpoint in output_dir; "
                "--resume alone means last). Refused when the saved settings differ.",
        "nargs": "?", "const": "last"})

    def __post_init__(self) -> None:
        if self.output_dir is None:
            raise ValueError("output_dir is required: pass --output_dir DIR (or set output_dir in --config)")
        if self.disable_tqdm is None and os.environ.get("RAGKIT_NO_PROGRESS"):
            self.disable_tqdm = True
        if self.data_seed is None:
            self.data_seed = self.seed
        check_warmup_ratio(self)
        super().__post_init__()
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator (and warns without one)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first out-of-range method setting."""
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; use one of {LOSSES}")
        if self.ce_on not in ("original", "both"):
            raise ValueError(f"ce_on must be 'original' or 'both', got {self.ce_on!r}")
        if self.remove_unused_columns:
            raise ValueError("remove_unused_columns must be False for CORD (the collator reads the raw examples)")
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_answer_tokens", "lora_r"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps < 1 and self.num_train_epochs <= 0:
            raise ValueError(f"max_steps must be >= 1 (or set num_train_epochs), got {self.max_steps}")
        for name in ("limit", "k"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 (or unset for all), got {v}")
        if self.passage_max_tokens < 0:
            raise ValueError(f"passage_max_tokens must be >= 0 (0 = no cut), got {self.passage_max_tokens}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.lam < 0 or self.gamma < 0:
            raise ValueError(f"lam and gamma must be >= 0, got lam={self.lam}, gamma={self.gamma}")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha}")
        perturbation_for(self.loss, self.gamma, self.alpha)
        warn_inert(self, [
            (self.loss == "ce", ("gamma", "alpha", "lam", "ce_on"), "loss='ce' uses the retriever order only"),
            (self.loss in PERTURBED_ONLY, ("lam", "ce_on"), f"loss={self.loss!r} has no KL/JS term"),
            (self.loss == "shuffle", ("gamma",), "loss='shuffle' is a uniform shuffle"),
            (not self.lora, ("lora_r", "lora_alpha", "lora_target", "merge_lora"), "lora is off"),
        ])

    @property
    def checkpointing(self) -> bool:
        """Activation (gradient) checkpointing requested under either of its names."""
        return bool(getattr(self, "activation_checkpointing", None) or getattr(self, "gradient_checkpointing", None))

    def perturbation(self) -> OrderPerturbation:
        """The ordering sampler of this run (:func:`perturbation_for`)."""
        return perturbation_for(self.loss, self.gamma, self.alpha)


# ---------------------------------------------------------------------------------------- trainer
class EpochCallback(TrainerCallback):
    """Keeps the collator's ``epoch`` (perturbation seed) in sync with the Trainer, also on resume."""

    def __init__(self, collator: CORDCollator) -> None:
        self.collator = collator

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.collator.epoch = int(math.floor(float(state.epoch or 0.0) + 1e-6))


class CORDTrainer(Trainer):
    """``transformers.Trainer`` whose ``compute_loss`` is the CORD family (:func:`pair_loss`).

    The loss, λ and ``ce_on`` come from ``args`` (a :class:`CORDConfig`). The logged metrics add
    the mean CE of each ordering, the KL/JS term, the fraction of examples whose teacher was the
    retriever order, and the mean α / Kendall τ of the perturbations. Every checkpoint also gets
    the run's settings (``ragkit_settings.json``) so that a resume can check them.
    """

    loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, CORDConfig):
            raise TypeError(f"CORDTrainer needs a CORDConfig as args, got {type(self.args).__name__}")
        self.cord_loss = self.args.loss
        self.lam = float(self.args.lam)
        self.ce_on = self.args.ce_on
        self._sums: dict[str, float] = {}
        self._count = 0
        coll = self.data_collator
        if isinstance(coll, CORDCollator):
            if coll.loss != self.cord_loss:
                raise ValueError(f"the collator builds rows for loss {coll.loss!r} but the config says "
                                 f"{self.cord_loss!r}; pass the same loss to both")
            self.add_callback(EpochCallback(coll))
        self.add_callback(SettingsCallback(self.args.settings()))

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        targets, mask = inputs["answer_ids"], inputs["answer_mask"]
        logp = answer_logprobs(model, inputs["input_ids"], inputs["attention_mask"], inputs["answer_pos"])
        b = targets.shape[0]
        if self.cord_loss in PAIRED_LOSSES:
            lo, lp_ = logp[:b], logp[b:]
        elif self.cord_loss in PERTURBED_ONLY:
            lo, lp_ = None, logp
        else:
            lo, lp_ = logp, None
        out = pair_loss(lo, lp_, targets, mask, loss=self.cord_loss, lam=self.lam, ce_on=self.ce_on)
        if model.training:
            self._track(out, inputs)
        return (out.loss, {"parts": out}) if return_outputs else out.loss

    def _track(self, out: CORDLossOutput, inputs: dict[str, Any]) -> None:
        vals = {
            "ce_original": out.ce_original, "ce_perturbed": out.ce_perturbed, "reg": out.reg,
            "teacher_is_original": out.teacher_is_original, "alpha": inputs.get("alpha"),
            "kendall_tau": inputs.get("kendall_tau"),
        }
        for k, v in vals.items():
            if v is not None and (k not in ("alpha", "kendall_tau") or self.cord_loss != "ce"):
                self._sums[k] = self._sums.get(k, 0.0) + float(v.detach().float().mean())
        self._count += 1

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self._count and "loss" in logs:
            for k, v in self._sums.items():
                logs[k] = round(v / self._count, 6)
            self._sums, self._count = {}, 0
        super().log(logs, *args, **kwargs)


def load_model(config: CORDConfig) -> LoadedModel:
    """Load ``config.model`` for training (dtype, LoRA, checkpointing from the config)."""
    from ragkit.training.models import load_for_training, lora_config

    lora = None
    if config.lora:
        lora = lora_config(config.lora_r, config.lora_alpha or 2 * config.lora_r, config.lora_target)
    return load_for_training(config.model, dtype=config.dtype, device="cpu", lora=lora,
                             gradient_checkpointing=config.checkpointing)


def make_trainer(model: Any, tokenizer: Any, examples: Sequence[Example], config: CORDConfig) -> CORDTrainer:
    """A ready :class:`CORDTrainer` with the collator and dataset of ``config``."""
    from ragkit.generation import Generator
    from ragkit.training.data import CORDDataset

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gen = Generator.from_components(base, tokenizer, template=config.template, max_length=config.max_length,
                                    passage_max_tokens=config.passage_max_tokens or None, show_progress=False)
    collator = CORDCollator(gen, loss=config.loss, perturbation=config.perturbation(), seed=config.seed,
                            max_answer_tokens=config.max_answer_tokens)
    return CORDTrainer(model=model, args=config, train_dataset=CORDDataset(examples), data_collator=collator,
                       processing_class=tokenizer)


def train_cord(examples: Sequence[Example] | None, config: CORDConfig) -> dict[str, Any]:
    """Train with a CORD-family loss; the model goes to ``output_dir/final`` (HF folder, atomic).

    Parameters
    ----------
    examples
        Training examples (``None``: :func:`ragkit.training.data.load_examples` of
        ``config.data_file`` with ``dataset``, ``limit`` and ``k``).
    config
        :class:`CORDConfig`. ``resume_from_checkpoint``: ``"last"`` the newest complete
        ``checkpoint-N`` in ``output_dir`` (fresh start when there is none), a path that checkpoint.

    Returns
    -------
    dict
        Summary: settings, steps, train loss (mean over the steps run by this call; a finished run
        that is resumed keeps its saved summary), seconds, the log history, the resumed checkpoint.
    """

    if examples is None:
        if not config.data_file:
            raise ValueError("no training data: pass --data_file FILE (or set data_file in --config)")
        if not Path(config.data_file).is_file():
            raise FileNotFoundError(f"training data file {config.data_file} does not exist")
    out = prepare_run_dir(config.output_dir, kind="cord-run", legacy_files=("cord_settings.json",))
    settings = config.settings()
    resume = check_resume(config.resume_from_checkpoint, out, settings, settings_file="cord_settings.json")
    done = resume.finished_summary("cord_summary.json", config.max_steps)
    if done is not None:
        logger.info("%s already finished %d steps; keeping its summary", out, config.max_steps)
        return done
    if examples is None:
        from ragkit.training.data import load_examples

        examples = load_examples(config.data_file, dataset=config.dataset, limit=config.limit, k=config.k)
    write_json(out / "cord_settings.json", settings)
    hf, tok, _ = load_model(config)
    trainer = make_trainer(hf, tok, examples, config)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume.checkpoint)
    seconds = time.perf_counter() - t0
    final_dir = out / "final"
    if trainer.is_world_process_zero():
        save_final_model(trainer.model, tok, final_dir, merge_lora=config.merge_lora)
    steps_run = int(trainer.state.global_step) - resume.step
    summary = {
        "method": "cord",
        "citation": "Lee et al., NAACL 2025, arXiv 2412.14581",
        "settings": settings,
        "model": str(config.model),
        "n_examples": len(examples),
        "global_step": int(trainer.state.global_step),
        "steps_this_run": steps_run,
        "train_loss": float(result.training_loss) if steps_run > 0 else resume.logged_train_loss(trainer.state),
        "seconds": seconds,
        "resumed_from": resume.checkpoint,
        "final_dir": str(final_dir),
        "log_history": trainer.state.log_history,
    }
    if trainer.is_world_process_zero():
        write_json(out / "cord_summary.json", summary)
    return summary
