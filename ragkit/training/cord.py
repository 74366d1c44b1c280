"""CORD: consistency and rank distillation against passage-order bias (training).

Lee et al., "CORD: Balancing COnsistency and Rank Distillation for Robust Retrieval-Augmented
Generation", NAACL 2025, arXiv 2412.14581. The authors' code is not public; the details below
are the project's documented choices (see ``shared/specs/methods.md`` §2).

Each example has a question ``q``, passages in retriever order ``c`` with scores ``s`` and a
target answer ``y = y_1..y_T``. A perturbed ordering ``c'`` is drawn from the interpolation space
of :mod:`ragkit.training.perturb` (score-aware ``α``). Both prompts run through the model in ONE
forward pass (stacked along the batch dimension: rows ``0..B−1`` hold ``c``, rows ``B..2B−1``
hold ``c'``). Each row is ``prompt + answer`` with right padding; the prompts differ in length,
so the hidden state predicting answer token ``t`` of row ``r`` sits at index
``len(prompt_r) + t − 1`` and is gathered by index (only those ``T`` positions go through the LM
head). The answer tokens are identical in both rows of a pair, so the two answer-token
distributions ``p_c(· | t)`` and ``p_c'(· | t)`` are aligned token by token.

Losses (per example, averaged over its answer tokens, then over the batch)::

    CE(y | q, c)   = −(1/T) Σ_t log p_c(y_t | q, c, y_<t)

    shuffle:      L = CE(y | q, c')                                   (position-randomised training)
    consistency:  L = CE(y | q, c) + λ · (1/T) Σ_t JS(p_c(·|t) ‖ p_c'(·|t))
                  JS(P ‖ Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M),  M = ½ (P + Q)   (no teacher)
    cord:         L = CE(y | q, c) + λ · (1/T) Σ_t KL(sg[p_teacher(·|t)] ‖ p_student(·|t))
                  teacher = the ordering with the lower CE on y (adaptive teacher selection),
                  student = the other one, sg = stop-gradient
    ce:           L = CE(y | q, c)                                     (plain fine-tuning baseline)

``ce_on="both"`` replaces ``CE(y | q, c)`` by ``½ (CE(y | q, c) + CE(y | q, c'))``.

Training runs through :class:`CORDTrainer`, a ``transformers.Trainer`` subclass that overrides
``compute_loss``, so ``accelerate launch`` (DDP), DeepSpeed and FSDP work unchanged::

    accelerate launch -m ragkit.cli train cord --data-file train.jsonl --model HF_ID \\
        --loss cord --lora --output-dir runs/cord --max-steps 1000

Checkpoints are written every ``save_steps`` (model weights as safetensors; the Trainer's own
optimizer/scheduler/RNG state files are torch files that it reads back with ``weights_only=True``).
"""

from __future__ import annotations

import logging
import math
import os
import time
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.training.data import Example
from ragkit.training.perturb import OrderPerturbation, kendall_tau

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

    from ragkit.generation import Generator

__all__ = [
    "LOSSES",
    "CORDCollator",
    "CORDLossOutput",
    "CORDSettings",
    "answer_logprobs",
    "js_divergence",
    "kl_divergence",
    "make_trainer",
    "make_training_args",
    "pair_loss",
    "token_ce",
    "train_cord",
]

logger = logging.getLogger(__name__)

LOSSES: tuple[str, ...] = ("cord", "consistency", "shuffle", "ce")
"""Loss names: ``cord`` and ``consistency`` use both orderings; ``shuffle`` only the perturbed one,
``ce`` only the retriever order."""

PAIRED_LOSSES: tuple[str, ...] = ("cord", "consistency")


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
    """Per-example mean over answer tokens of ``KL(P ‖ Q) = Σ_v P(v) (log P(v) − log Q(v))``; ``(B,)``."""
    import torch

    m = mask.to(logp.dtype)
    kl = (torch.exp(logp) * (logp - logq)).sum(-1)
    return (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def js_divergence(logp: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean over answer tokens of the Jensen-Shannon divergence; ``(B,)``.

    ``JS(P ‖ Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M)`` with ``M = ½ (P + Q)``; symmetric, in ``[0, log 2]``.
    """
    import math as _m

    import torch

    logm = torch.logsumexp(torch.stack([logp, logq]), dim=0) - _m.log(2.0)
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
        ``"cord"``, ``"consistency"``, ``"shuffle"`` or ``"ce"`` (formulas in the module docstring).
    lam
        λ, weight of the KL / JS term.
    ce_on
        ``"original"``: CE on ``c`` only (the paper's form); ``"both"``: mean of both orderings' CE.
    """
    import torch

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; use one of {LOSSES}")
    if ce_on not in ("original", "both"):
        raise ValueError(f"ce_on must be 'original' or 'both', got {ce_on!r}")
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    if loss == "shuffle":
        if logp_pert is None:
            raise ValueError("the shuffle loss needs the perturbed ordering's log-probs")
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
    import torch

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


# ---------------------------------------------------------------------------------------- collator
class CORDCollator:
    """Builds stacked RAG prompts (retriever order + perturbed order) with the Generator's template.

    For a batch of ``B`` examples the output holds ``2B`` rows for the paired losses (rows
    ``0..B−1``: retriever order, ``B..2B−1``: perturbed) and ``B`` rows for ``ce`` (retriever order)
    and ``shuffle`` (perturbed order). Every row is ``prompt ids + answer ids``, right-padded;
    prompts and answers are tokenised exactly as :meth:`ragkit.generation.Generator.score` does.

    Output keys: ``input_ids``, ``attention_mask`` ``(R, L)``; ``answer_pos`` ``(R, T)`` (index of
    the hidden state predicting each answer token; padding repeats the first one); ``answer_ids``
    and ``answer_mask`` ``(B, T)``; ``alpha`` and ``kendall_tau`` ``(B,)`` of the perturbations.

    The perturbation of an example is drawn from a generator seeded with
    ``(seed, epoch, crc32(example id))``, so it does not depend on batch composition and is the
    same after a resume (:class:`_EpochCallback` keeps ``epoch`` in sync with the Trainer; use
    ``dataloader_num_workers=0`` or non-persistent workers).

    Parameters
    ----------
    generator
        A :class:`~ragkit.generation.Generator` (its template, tokenizer and passage truncation).
    loss
        One of :data:`LOSSES`.
    perturbation
        The ordering sampler (default: score-aware α with γ = 1).
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
        self.generator = generator
        self.loss = loss
        self.perturbation = perturbation or OrderPerturbation()
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
        import torch

        examples = list(examples)
        if not examples:
            raise ValueError("empty batch")
        gen = self.generator
        pert, alphas = self.orders(examples)
        ident = [np.arange(len(ex.passages)) for ex in examples]
        if self.loss in PAIRED_LOSSES:
            row_orders = ident + pert
        elif self.loss == "shuffle":
            row_orders = pert
        else:
            row_orders = ident
        row_ex = [examples[r % len(examples)] for r in range(len(row_orders))]
        prompts = [gen.build_prompt(ex.question, [ex.passages[int(i)] for i in o]) for ex, o in zip(row_ex, row_orders)]
        p_ids = gen._encode_prompts(prompts)
        ans_text = [gen._answer_text(prompts[i], ex.answer, i) for i, ex in enumerate(examples)]
        a_ids = [a[: self.max_answer_tokens] for a in gen._encode_texts(ans_text)]
        for i, a in enumerate(a_ids):
            if not a:
                raise ValueError(f"example {examples[i].id!r}: the answer tokenises to nothing")
        b = len(examples)
        t_max = max(len(a) for a in a_ids)
        rows = [p[: max(1, gen.max_length - len(a_ids[r % b]))] if len(p) + len(a_ids[r % b]) > gen.max_length
                else p for r, p in enumerate(p_ids)]
        if any(len(r_) != len(p) for r_, p in zip(rows, p_ids)):
            logger.warning("some prompts exceed the context window (%d tokens) and were cut", gen.max_length)
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


# ---------------------------------------------------------------------------------------- trainer
def _trainer_class() -> type[Trainer]:
    """``CORDTrainer`` is defined lazily so that importing this module does not import transformers."""
    global _CORD_TRAINER
    if _CORD_TRAINER is not None:
        return _CORD_TRAINER
    from transformers import Trainer, TrainerCallback

    class EpochCallback(TrainerCallback):
        """Keeps the collator's ``epoch`` (perturbation seed) in sync with the Trainer, also on resume."""

        def __init__(self, collator: CORDCollator) -> None:
            self.collator = collator

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.collator.epoch = int(math.floor(float(state.epoch or 0.0) + 1e-6))

    class CORDTrainer(Trainer):
        """``transformers.Trainer`` whose ``compute_loss`` is the CORD family (:func:`pair_loss`).

        Extra keyword arguments: ``cord_loss`` (one of :data:`LOSSES`), ``lam`` (λ) and ``ce_on``.
        The logged metrics add the mean CE of each ordering, the KL/JS term, the fraction of
        examples whose teacher was the retriever order, and the mean α / Kendall τ of the
        perturbations.
        """

        loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

        def __init__(self, *args: Any, cord_loss: str = "cord", lam: float = 1.0, ce_on: str = "original",
                     **kwargs: Any) -> None:
            if cord_loss not in LOSSES:
                raise ValueError(f"unknown loss {cord_loss!r}; use one of {LOSSES}")
            super().__init__(*args, **kwargs)
            self.cord_loss = cord_loss
            self.lam = float(lam)
            self.ce_on = ce_on
            self._sums: dict[str, float] = {}
            self._count = 0
            coll = self.data_collator
            if isinstance(coll, CORDCollator):
                if coll.loss != cord_loss:
                    raise ValueError(f"the collator builds rows for loss {coll.loss!r} but the trainer uses "
                                     f"{cord_loss!r}; pass the same loss to both")
                self.add_callback(EpochCallback(coll))

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            targets, mask = inputs["answer_ids"], inputs["answer_mask"]
            logp = answer_logprobs(model, inputs["input_ids"], inputs["attention_mask"], inputs["answer_pos"])
            b = targets.shape[0]
            if self.cord_loss in PAIRED_LOSSES:
                lo, lp_ = logp[:b], logp[b:]
            elif self.cord_loss == "shuffle":
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

    _CORD_TRAINER = CORDTrainer
    CORDTrainer.EpochCallback = EpochCallback  # type: ignore[attr-defined]
    return CORDTrainer


_CORD_TRAINER: Any = None


def __getattr__(name: str) -> Any:
    if name == "CORDTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------- settings
@dataclass
class CORDSettings:
    """Everything that defines a CORD run (saved as ``cord_settings.json`` in the output folder).

    Attributes
    ----------
    loss, lam, ce_on
        See :func:`pair_loss`.
    gamma, alpha
        Perturbation: score-aware ``α ~ U(0, 1 − tanh(γ·margin/std))`` or a fixed ``alpha``.
    template, passage_max_tokens, max_length, max_answer_tokens
        Prompt construction (the Generator's template; per-passage token cut).
    max_steps, batch_size, grad_accum, lr, weight_decay, warmup_ratio, save_steps, logging_steps, seed
        Optimisation (AdamW, linear decay).
    lora, lora_r, lora_alpha, lora_target, merge_lora
        LoRA through ``peft`` (dropout 0); the saved model has the adapter merged unless
        ``merge_lora`` is False (then the folder holds the adapter only).
    dtype, gradient_checkpointing
        Model dtype and activation checkpointing.
    """

    loss: str = "cord"
    lam: float = 1.0
    ce_on: str = "original"
    gamma: float = 1.0
    alpha: float | None = None
    template: str = "auto"
    passage_max_tokens: int | None = 60
    max_length: int | None = None
    max_answer_tokens: int = 32
    max_steps: int = 100
    batch_size: int = 2
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    save_steps: int = 50
    logging_steps: int = 10
    seed: int = 0
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_target: str = "all-linear"
    merge_lora: bool = True
    dtype: str = "float32"
    gradient_checkpointing: bool = False

    def validate(self) -> None:
        """Raise ``ValueError`` for an out-of-range setting."""
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; use one of {LOSSES}")
        for name in ("max_steps", "batch_size", "grad_accum", "save_steps", "logging_steps", "max_answer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.lam < 0 or self.gamma < 0:
            raise ValueError("lam and gamma must be >= 0")
        OrderPerturbation(gamma=self.gamma, alpha=self.alpha)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def make_training_args(output_dir: str | os.PathLike[str], st: CORDSettings, **overrides: Any) -> TrainingArguments:
    """``TrainingArguments`` for a CORD run (safetensors, no column removal, seeded data order)."""
    import dataclasses

    from transformers import TrainingArguments

    kw: dict[str, Any] = dict(
        output_dir=str(output_dir),
        max_steps=st.max_steps,
        per_device_train_batch_size=st.batch_size,
        gradient_accumulation_steps=st.grad_accum,
        learning_rate=st.lr,
        weight_decay=st.weight_decay,
        warmup_ratio=st.warmup_ratio,
        lr_scheduler_type="linear",
        save_strategy="steps",
        save_steps=st.save_steps,
        logging_steps=st.logging_steps,
        seed=st.seed,
        data_seed=st.seed,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        report_to=[],
        dataloader_pin_memory=_cuda(),
        disable_tqdm=bool(os.environ.get("RAGKIT_NO_PROGRESS")),
    )
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    if st.gradient_checkpointing:  # renamed activation_checkpointing in transformers 5
        kw["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = True
    if "save_safetensors" in fields:  # transformers < 5; v5 always writes safetensors
        kw["save_safetensors"] = True
    kw.update(overrides)
    return TrainingArguments(**{k: v for k, v in kw.items() if k in fields})


def load_model_for_training(
    model: str | None, st: CORDSettings
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the causal LM (train mode) and tokenizer; wrap it with LoRA when ``st.lora``."""
    from ragkit.models import load_generator

    hf, tok = load_generator(model, device="cpu", dtype=st.dtype)
    hf.train()
    if getattr(hf.config, "use_cache", None):
        hf.config.use_cache = False
    if st.lora:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=st.lora_r, lora_alpha=st.lora_alpha, lora_dropout=0.0,
                         target_modules=st.lora_target, task_type="CAUSAL_LM")
        hf = get_peft_model(hf, cfg)
        if st.gradient_checkpointing:
            hf.enable_input_require_grads()
    return hf, tok


def make_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    output_dir: str | os.PathLike[str],
    st: CORDSettings,
    **arg_overrides: Any,
) -> Trainer:
    """A ready :class:`CORDTrainer` with the collator, dataset and arguments of ``st``."""
    from ragkit.generation import Generator
    from ragkit.training.data import CORDDataset

    st.validate()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gen = Generator.from_components(base, tokenizer, template=st.template, max_length=st.max_length,
                                    passage_max_tokens=st.passage_max_tokens, show_progress=False)
    collator = CORDCollator(gen, loss=st.loss, perturbation=OrderPerturbation(gamma=st.gamma, alpha=st.alpha),
                            seed=st.seed, max_answer_tokens=st.max_answer_tokens)
    args = make_training_args(output_dir, st, **arg_overrides)
    cls = _trainer_class()
    return cls(model=model, args=args, train_dataset=CORDDataset(examples), data_collator=collator,
               processing_class=tokenizer, cord_loss=st.loss, lam=st.lam, ce_on=st.ce_on)


def train_cord(
    examples: Sequence[Example],
    model: str | None,
    output_dir: str | os.PathLike[str],
    settings: CORDSettings | None = None,
    resume: str | bool | None = None,
    **arg_overrides: Any,
) -> dict[str, Any]:
    """Train with a CORD-family loss and save the final model to ``output_dir`` (HF folder).

    Parameters
    ----------
    examples
        Training examples (:func:`ragkit.training.data.load_examples`).
    model
        Model name / path for :func:`ragkit.models.load_generator` (``None``: embedded SmolLM2).
    output_dir
        Checkpoints (``checkpoint-N/``), the final model (``config.json``, ``model.safetensors``,
        tokenizer files), ``cord_settings.json`` and ``cord_summary.json``.
    settings
        :class:`CORDSettings`.
    resume
        ``"last"`` / ``True``: the newest ``checkpoint-N`` in ``output_dir`` (fresh start when there
        is none); a path: that checkpoint; ``None`` / ``False``: fresh start.

    Returns
    -------
    dict
        Summary: settings, steps, final loss, seconds, the log history, the resumed checkpoint.
    """
    from ragkit.io import write_json
    from ragkit.training.checkpoint import resolve_resume, save_final_model

    st = settings or CORDSettings()
    st.validate()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "cord_settings.json", asdict(st))
    ckpt = resolve_resume(resume, out)
    hf, tok = load_model_for_training(model, st)
    trainer = make_trainer(hf, tok, examples, out, st, **arg_overrides)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=ckpt)
    seconds = time.perf_counter() - t0
    if trainer.is_world_process_zero():
        save_final_model(trainer.model, tok, out, merge_lora=st.merge_lora)
    summary = {
        "settings": asdict(st),
        "model": str(model),
        "n_examples": len(examples),
        "global_step": int(trainer.state.global_step),
        "train_loss": float(result.training_loss),
        "seconds": seconds,
        "resumed_from": ckpt,
        "log_history": trainer.state.log_history,
    }
    if trainer.is_world_process_zero():
        write_json(out / "cord_summary.json", summary)
    return summary
