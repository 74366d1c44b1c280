"""PS-GRPO: GRPO with group similarity rewards over paraphrase sets, on TRL's ``GRPOTrainer``.

Hamman et al., "Improving Consistency in Retrieval-Augmented Systems with Group Similarity
Rewards", NeurIPS 2025, arXiv 2510.04392. GRPO: Shao et al., "DeepSeekMath", arXiv 2402.03300.

For every paraphrase set (``n`` wordings of one question, :mod:`ragkit.paraphrase`) the policy
samples ``g`` answers per wording; a rollout's reward is ``c`` times its mean similarity to the
rollouts of the *other* wordings (:mod:`ragkit.training.rewards`, exact or the unbiased
``kappa``/``s`` approximation), plus ``w * F1(answer, gold)``. ``c = 1`` is the paper's reward;
``c = 0``, ``w > 0`` is GRPO with the accuracy reward alone, the baseline for the consistency term.
:class:`PSGRPOConfig` defaults to that baseline (``c = 0``, ``w = 1``): a pre-registered
confirmation (``experiments/psgrpo``: Qwen2.5-Coder-0.5B-Instruct, LoRA, 48 steps, two seeds, 100
dev sets of real paraphrases) found no rise of consistency across wordings from the consistency
term, over the base model or over the accuracy reward alone, so its rule keeps the term off.
Advantages are normalised within each wording's ``g`` rollouts, and the policy is updated with
the GRPO clipped surrogate plus a KL penalty to the frozen reference::

    A_ij  = (r_ij - mean_j' r_ij') / (std_j' r_ij' + 1e-4)
    L     = -1/|y| sum_t [ min(rho_t A_ij, clip(rho_t, 1-eps, 1+eps) A_ij) - beta * k3_t ]
    rho_t = pi_theta(y_t | ...) / pi_old(y_t | ...)
    k3_t  = exp(d_t) - d_t - 1,   d_t = log pi_ref(y_t | ...) - log pi_theta(y_t | ...)

The KL term is the plain k3 estimator of KL(pi_theta || pi_ref) (Schulman, "Approximating KL
divergence", 2020): :class:`PSGRPOConfig` sets ``use_bias_correction_kl=False``. TRL 1.16's
default (``True``) would multiply ``k3_t`` by ``rho_t`` (the DeepSeek-V3.2 bias-corrected KL),
which is not the estimator the method specifies.

How it maps onto TRL 1.16.0
---------------------------
* Every knob is one field of :class:`PSGRPOConfig`, a ``trl.GRPOConfig``; every GRPO option the
  method relies on is set there explicitly (loss ``grpo`` = per-sequence token mean, ``beta``,
  ``epsilon`` = ``epsilon_high``, ``scale_rewards="group"``, token-level importance sampling,
  no top-k / min-p / repetition penalty, ...), so a TRL release that changes a default does
  not change ragkit's objective.
* One dataset row per (set, wording): columns ``prompt`` (the Generator template with the
  wording and its passages), ``set_id``, ``member``, ``answers``. TRL passes the extra columns
  to reward functions as keyword lists aligned with the completions.
* Prompts are tokenised as evaluation tokenises them (:class:`PSGRPOTrainer` overrides
  ``_tokenize_prompts`` with :func:`ragkit.generation.fitting.encode_prompts`): a chat-templated
  prompt already starts with BOS, and TRL's own ``tokenizer(text=prompts)`` would add a second
  one on Llama / Gemma / Mistral tokenizers.
* :class:`ParaphraseSetSampler` replaces TRL's ``RepeatSampler`` (``_get_train_sampler``): it
  shuffles *sets*, never rows, and yields each wording ``g`` times in a row, so every set's
  ``n * g`` rollouts are in the same generation batch (and, on several processes, on the same
  process: the per-process generation batch must be a multiple of ``n * g``).
* TRL's advantage code groups ``num_generations = g`` consecutive rewards: exactly one wording's
  rollouts, i.e. "normalise within each paraphrase" (``scale_rewards="group"``).
* With ``beta > 0`` and no LoRA, TRL rebuilds the reference model from
  ``model.config._name_or_path``, so the policy is always loaded from a folder on disk (the
  embedded SmolLM2's safetensors cache, a hub id, or a checkpoint). With LoRA the reference is
  the base model with the adapter off.

GPU use (same code; vLLM for rollouts, accelerate/DeepSpeed for the update)::

    ragkit train psgrpo --config psgrpo.yaml --use_vllm
    accelerate launch --num_processes 4 -m ragkit.cli train psgrpo --config psgrpo.yaml --use_vllm
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch.utils.data import Sampler
from trl import GRPOConfig, GRPOTrainer

from ragkit.datasets import load_records
from ragkit.generation.fitting import encode_prompts
from ragkit.io import write_json
from ragkit.paraphrase import ParaphraseSet
from ragkit.similarity import get_similarity
from ragkit.text import extract_answer
from ragkit.training.checkpoint import SettingsCallback, check_resume, prepare_run_dir, save_final_model
from ragkit.training.config import RagkitConfigMixin, check_warmup_ratio, warn_inert
from ragkit.training.rewards import (
    approx_group_similarity_rewards,
    gold_f1,
    group_similarity_rewards,
)
from ragkit.types import Passage, QARecord

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset

    from ragkit.generation import Generator

logger = logging.getLogger(__name__)

__all__ = [
    "GRPO_OPTIONS",
    "PSGRPOConfig",
    "PSGRPOTrainer",
    "ParaphraseSetReward",
    "ParaphraseSetSampler",
    "RewardBreakdown",
    "build_grpo_dataset",
    "build_training_sets",
    "check_step_memory",
    "estimate_step_memory",
    "make_trainer",
    "select_passages",
    "train_psgrpo",
]


# ----------------------------------------------------------------------------- data
def select_passages(record: QARecord, max_passages: int | None) -> tuple[Passage, ...]:
    """Passages put in a training prompt: all, or at most ``max_passages`` with the gold ones kept.

    Choice: gold passages are always kept (so the answer is answerable), the rest are filled
    with distractors in the dataset order, and the dataset order is preserved in the prompt.
    """
    ps = record.passages
    if max_passages is None or len(ps) <= max_passages:
        return ps
    gold = set(record.gold_ids)
    keep = {p.id for p in ps if p.id in gold}
    for p in ps:
        if len(keep) >= max_passages:
            break
        keep.add(p.id)
    return tuple(p for p in ps if p.id in keep)[: max(max_passages, len(gold & {p.id for p in ps}))]


def build_grpo_dataset(sets: Sequence[ParaphraseSet], generator: Generator) -> Dataset:
    """One row per (set, member): ``prompt``, ``set_id``, ``member``, ``answers``.

    Prompts are ``generator.build_prompt(question, passages)`` (the Generator's template), so
    training and evaluation see the same layout. Rows of a set are contiguous, members in order.
    """
    from datasets import Dataset

    if not sets:
        raise ValueError("no paraphrase sets to train on")
    sizes = {len(s) for s in sets}
    if len(sizes) != 1:
        raise ValueError(f"all paraphrase sets must have the same size, got sizes {sorted(sizes)}")
    ids = [s.set_id for s in sets]
    if len(set(ids)) != len(ids):
        raise ValueError("set_id values must be unique (they key the group reward)")
    rows: dict[str, list[Any]] = {"prompt": [], "set_id": [], "member": [], "answers": []}
    for s in sets:
        for i, q in enumerate(s.questions):
            rows["prompt"].append(generator.build_prompt(q, s.passages_for(i)))
            rows["set_id"].append(str(s.set_id))
            rows["member"].append(i)
            rows["answers"].append(list(s.answers))
    return Dataset.from_dict(rows)


# ----------------------------------------------------------------------------- sampler
class ParaphraseSetSampler(Sampler[int]):
    """Yield dataset rows so that every paraphrase set is whole inside one generation batch.

    The dataset holds ``n`` contiguous rows per set (:func:`build_grpo_dataset`). Sets are
    shuffled (seeded), grouped ``sets_per_batch`` at a time (an incomplete last group is
    dropped, as TRL's ``RepeatSampler`` does) and every group is emitted ``repeat_count`` times
    as::

        set a: row a0 x g, row a1 x g, ..., row a(n-1) x g, set b: ...

    ``repeat_count = num_iterations * steps_per_generation`` mirrors TRL (the trainer consumes
    one generation batch per ``steps_per_generation`` optimisation steps).

    Parameters
    ----------
    set_rows
        Row indices of each set (all the same length ``n``).
    g
        Rollouts per row (TRL's ``num_generations``).
    sets_per_batch
        Sets per generation batch (``generation_batch_size = sets_per_batch * n * g``).
    repeat_count
        Times each group of sets is re-emitted.
    shuffle
        Shuffle the sets.
    seed
        Seed of the shuffle (one ``torch.Generator``; the same on every process).
    """

    def __init__(self, set_rows: Sequence[Sequence[int]], g: int, sets_per_batch: int = 1,
                 repeat_count: int = 1, shuffle: bool = True, seed: int = 0) -> None:
        if not set_rows:
            raise ValueError("ParaphraseSetSampler needs at least one set")
        sizes = {len(r) for r in set_rows}
        if len(sizes) != 1:
            raise ValueError(f"all sets must have the same number of rows, got {sorted(sizes)}")
        if g < 1 or sets_per_batch < 1 or repeat_count < 1:
            raise ValueError("g, sets_per_batch and repeat_count must be >= 1")
        self.set_rows = [list(r) for r in set_rows]
        self.n = sizes.pop()
        self.g = int(g)
        self.sets_per_batch = int(sets_per_batch)
        self.repeat_count = int(repeat_count)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.generator = torch.Generator()
        self.generator.manual_seed(self.seed)

    @classmethod
    def from_dataset(cls, dataset: Any, g: int, **kw: Any) -> ParaphraseSetSampler:
        """Group the rows of a dataset with a ``set_id`` column (rows of a set must be contiguous)."""
        ids = list(dataset["set_id"])
        groups: list[list[int]] = []
        seen: set[str] = set()
        for i, sid in enumerate(ids):
            if groups and ids[groups[-1][0]] == sid:
                groups[-1].append(i)
            else:
                if sid in seen:
                    raise ValueError(f"rows of set {sid!r} are not contiguous; build the dataset "
                                     "with build_grpo_dataset")
                seen.add(sid)
                groups.append([i])
        return cls(groups, g, **kw)

    def __iter__(self) -> Iterator[int]:
        order = (torch.randperm(len(self.set_rows), generator=self.generator).tolist()
                 if self.shuffle else list(range(len(self.set_rows))))
        chunks = [order[i:i + self.sets_per_batch] for i in range(0, len(order), self.sets_per_batch)]
        for chunk in chunks:
            if len(chunk) < self.sets_per_batch:
                continue
            for _ in range(self.repeat_count):
                for s in chunk:
                    for row in self.set_rows[s]:
                        for _ in range(self.g):
                            yield row

    def __len__(self) -> int:
        return (len(self.set_rows) // self.sets_per_batch) * self.sets_per_batch * self.n * self.g * self.repeat_count


# ----------------------------------------------------------------------------- reward
@dataclass(frozen=True)
class RewardBreakdown:
    """What :meth:`ParaphraseSetReward.score` computed for one generation batch.

    Attributes
    ----------
    rewards
        One reward per completion, in the batch's order.
    consistency
        Mean group similarity over the complete sets (NaN when none): the consistency term before
        its weight, so a run with ``consistency_weight = 0`` still shows how much its answers agree.
    gold_f1
        Mean F1 of the answers to their gold answers.
    empty_rate
        Share of empty answers.
    comparisons
        Similarity evaluations made.
    incomplete
        Sets that arrived incomplete (scored by the gold term only).
    """

    rewards: list[float]
    consistency: float
    gold_f1: float
    empty_rate: float
    comparisons: int
    incomplete: int

    def metrics(self) -> dict[str, float]:
        """The per-batch diagnostics logged as ``psgrpo/<name>``."""
        return {"consistency": self.consistency, "gold_f1": self.gold_f1, "empty_rate": self.empty_rate}


class ParaphraseSetReward:
    """TRL reward function: ``c`` × group similarity within each ``set_id`` + ``w`` × gold F1.

    Called by ``GRPOTrainer`` with the completions of one generation batch (per process) and
    the dataset columns ``set_id``, ``member`` and ``answers`` as aligned lists. Completions are
    grouped by set and member into ``n x g`` rollout tables and scored with
    :func:`~ragkit.training.rewards.group_similarity_rewards` (``kappa=None`` or
    ``kappa >= n-1``) or :func:`~ragkit.training.rewards.approx_group_similarity_rewards`.
    Empty answers never count as agreement (their similarities are 0), so the policy cannot
    win by saying nothing. The reward of rollout ``y`` is ``c * sim(y) + w * F1(y, gold)``;
    ``c = 0`` with ``w > 0`` is GRPO with the accuracy reward alone (the baseline that isolates
    what the consistency term adds), ``c = 1`` PS-GRPO.

    A set that arrives incomplete (fewer than 2 members, or members with different rollout
    counts) only gets the gold term, and a warning is logged: that means the sampler was
    bypassed.

    Parameters
    ----------
    sim
        ``"bleu2"``, ``"rougel"``, ``"f1"``, ``"cosine"`` or a batched callable.
    kappa, s
        Approximation parameters (``kappa=None``: exact).
    gold_weight
        ``w`` of ``F1(answer, gold)``.
    seed
        Seed of the approximation's draws (advanced on every call).
    stops
        Stop strings used to cut completions (the template's).
    encoder
        Encoder for ``sim="cosine"`` (``None``: embedded MiniLM).
    consistency_weight
        ``c`` of the group similarity.
    """

    def __init__(self, sim: str = "bleu2", kappa: int | None = 3, s: int = 1, gold_weight: float = 0.5,
                 seed: int = 0, stops: Sequence[str] = ("\n", "Question:", "Passages:"),
                 encoder: Any = None, consistency_weight: float = 1.0) -> None:
        if consistency_weight < 0 or gold_weight < 0:
            raise ValueError(f"reward weights must be >= 0, got consistency_weight={consistency_weight}, "
                             f"gold_weight={gold_weight}")
        self.sim_name = sim if isinstance(sim, str) else getattr(sim, "__name__", "custom")
        self.sim = get_similarity(sim, encoder=encoder)
        self.kappa = kappa
        self.s = int(s)
        self.gold_weight = float(gold_weight)
        self.consistency_weight = float(consistency_weight)
        self.rng = np.random.default_rng(seed)
        self.stops = tuple(stops)
        self.__name__ = f"psgrpo_{self.sim_name}"
        self.comparisons = 0
        self.calls = 0

    def score(self, completions: Sequence[Any], set_id: Sequence[str], member: Sequence[int],
              answers: Sequence[Sequence[str]] | None = None) -> RewardBreakdown:
        """The rewards of one generation batch with their diagnostics (nothing is stored on ``self``
        except the approximation's random state)."""
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # conversational too
        ans = [extract_answer(t, self.stops) for t in texts]  # the one extractor, as evaluation reads answers
        rewards = np.zeros(len(ans))
        golds = answers if answers is not None else [[] for _ in ans]
        by_set: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        for k, (sid, m) in enumerate(zip(set_id, member)):
            by_set[str(sid)][int(m)].append(k)
        sims: list[float] = []
        incomplete = 0
        comparisons = 0
        for mem in by_set.values():
            members = sorted(mem)
            counts = {len(mem[m]) for m in members}
            positions = [mem[m] for m in members]
            gold = list(golds[positions[0][0]] or [])
            if len(members) < 2 or len(counts) != 1:
                incomplete += 1
                for pos in positions:
                    rewards[pos] = self.gold_weight * gold_f1([ans[k] for k in pos], gold)
                continue
            table = [[ans[k] for k in pos] for pos in positions]
            n = len(table)
            if self.kappa is None or (self.kappa >= n - 1 and self.s >= len(table[0])):
                r, cnt = group_similarity_rewards(table, sim=self.sim, return_count=True)  # type: ignore[misc]
            else:
                r, cnt = approx_group_similarity_rewards(table, kappa=self.kappa, s=self.s, rng=self.rng,
                                                         sim=self.sim)
            comparisons += cnt
            sims.append(float(np.mean(r)))
            r = self.consistency_weight * np.asarray(r, dtype=float)
            if self.gold_weight and gold:
                r = r + self.gold_weight * gold_f1([y for row in table for y in row], gold).reshape(r.shape)
            for pos, row in zip(positions, r):
                rewards[pos] = row
        return RewardBreakdown(
            rewards=rewards.tolist(), consistency=float(np.mean(sims)) if sims else float("nan"),
            gold_f1=(float(np.mean([gold_f1([a], list(g or []))[0] for a, g in zip(ans, golds)]))
                     if ans else float("nan")),
            empty_rate=float(np.mean([not a for a in ans])) if ans else float("nan"),
            comparisons=int(comparisons), incomplete=incomplete)

    def __call__(self, prompts: list[Any], completions: list[Any], set_id: list[str], member: list[int],
                 answers: list[list[str]] | None = None, **kwargs: Any) -> list[float]:
        b = self.score(completions, set_id, member, answers)
        if b.incomplete:
            logger.warning("%d paraphrase set(s) arrived incomplete in a batch; they got only the gold reward. "
                           "Use PSGRPO's ParaphraseSetSampler.", b.incomplete)
        self.calls += 1
        self.comparisons += b.comparisons  # the run's total, reported in train_psgrpo's summary
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for k, v in b.metrics().items():
                if not math.isnan(v):
                    log_metric(f"psgrpo/{k}", v)
        return b.rewards


# ----------------------------------------------------------------------------- config
GRPO_OPTIONS: dict[str, Any] = {
    "loss_type": "grpo",  # per-sequence token mean, as in the GRPO paper
    "scale_rewards": "group",  # advantage = (r - mean) / std within one wording's g rollouts
    "use_bias_correction_kl": False,  # plain k3 KL (TRL's default multiplies it by the IS ratio)
    "importance_sampling_level": "token",
    "multi_objective_aggregation": "sum_then_normalize",
    "reward_weights": [1.0],
    "num_iterations": 1,
    "delta": None,  # no two-sided clipping
    "top_k": 0,
    "min_p": None,
    "repetition_penalty": 1.0,
    "mask_truncated_completions": False,
    "sync_ref_model": False,
    "top_entropy_quantile": 1.0,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "off_policy_mask_threshold": None,
    "disable_dropout": True,  # the policy, the old policy and the reference see the same network
    "shuffle_dataset": True,
    "remove_unused_columns": False,  # set_id / member / answers reach the reward
    "lr_scheduler_type": "constant",
}
"""GRPO options PS-GRPO depends on, as :class:`PSGRPOConfig` sets them by default (tested one by one)."""


def _help(text: str, **extra: Any) -> dict[str, Any]:
    return {"help": text, **extra}


@dataclass
class PSGRPOConfig(RagkitConfigMixin, GRPOConfig):
    """Every setting of a PS-GRPO run: the method's knobs plus all of ``trl.GRPOConfig``.

    The GRPO options the method relies on (:data:`GRPO_OPTIONS`) are given explicit defaults;
    the batch geometry is derived: ``per_device_train_batch_size = sets_per_batch *
    paraphrases * num_generations`` (one generation batch = whole paraphrase sets) and
    ``steps_per_generation = gradient_accumulation_steps``. ``gradient_checkpointing`` defaults to
    on, CPU included: a step back-propagates through all ``paraphrases * num_generations``
    rollouts at once, and without it the embedded SmolLM2-135M's activations alone were about
    1.4 GB per 716-token rollout (attention weights grow with the square of the prompt), 23 GB
    for the 16 rollouts of the README's run; with it they are a few hundred MB, for about a third
    more compute. ``bf16`` defaults to off.
    """

    # -- data and paraphrases
    model: str | None = field(default=None, metadata=_help(
        "Policy: hub id, folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)."))
    data_file: str | None = field(default=None, metadata=_help(
        "Training data: HotpotQA JSONL, ragkit QA JSONL {id, question, answers, passages} or paraphrase-set JSONL."))
    limit: int | None = field(default=None, metadata=_help("Use the first N questions of the data file."))
    paraphrases: int = field(default=4, metadata=_help("Members per paraphrase set n, the original included."))
    paraphraser: Literal["rule", "llm"] = field(default="rule", metadata=_help(
        "How rewrites are made when the data file has none: rule-based or by the policy model."))
    max_passages: int | None = field(default=None, metadata=_help(
        "Passages per prompt (gold kept, distractors fill up; default all)."))
    passage_max_tokens: int | None = field(default=60, metadata=_help(
        "Cut each passage to this many tokens (0 = no cut; the default keeps a 16-rollout step of 10 HotpotQA "
        "paragraphs within a 24 GB machine, as CORD's default does)."))
    template: str = field(default="auto", metadata=_help(
        "Prompt template: auto|short|chat|plain (auto = chat when the model has one)."))
    sets_per_batch: int = field(default=1, metadata=_help("Paraphrase sets per optimisation step."))
    # -- reward
    reward: Literal["bleu2", "rougel", "f1", "cosine"] = field(default="bleu2", metadata=_help(
        "Similarity of two answers in the group reward."))
    kappa: int = field(default=3, metadata=_help(
        "Other members drawn per member for the approximate reward; 0 = exact."))
    s: int = field(default=1, metadata=_help("Rollouts drawn per drawn member (approximate reward)."))
    gold_weight: float = field(default=1.0, metadata=_help("Weight w of F1(answer, gold) in the reward."))
    consistency_weight: float = field(default=0.0, metadata=_help(
        "Weight c of the group similarity in the reward: 1 is PS-GRPO as the paper specifies it; the default 0 "
        "(with gold_weight > 0) is GRPO with the accuracy reward alone, because ragkit's pre-registered "
        "confirmation found no consistency gain from the term (experiments/psgrpo)."))
    # -- model
    dtype: str = field(default="auto", metadata=_help(
        "Policy dtype: auto (bf16 on CUDA, fp32 on CPU)|float32|bfloat16|float16."))
    lora_r: int = field(default=0, metadata=_help("LoRA rank (0 = full fine-tuning)."))
    lora_alpha: int = field(default=16, metadata=_help("LoRA alpha."))
    stop_at_newline: bool = field(default=True, metadata=_help(
        "Rollouts stop at the end of the answer line, as evaluation's decoding does."))
    warmup_ratio: float = field(default=0.0, metadata=_help(
        "Warm-up as a fraction of the training steps: ceil(ratio * steps) steps (transformers 5 has no "
        "warmup_ratio of its own)."))
    # -- GRPOConfig / TrainingArguments fields with PS-GRPO's explicit defaults
    output_dir: str | None = field(default=None, metadata=_help(
        "Run folder: checkpoints, final/ model, psgrpo_settings.json, psgrpo_summary.json (required)."))
    num_generations: int | None = field(default=4, metadata=_help(
        "Rollouts g per wording (GRPO group size)."))
    max_completion_length: int | None = field(default=16, metadata=_help("New tokens per rollout."))
    temperature: float = field(default=1.0, metadata=_help("Rollout sampling temperature."))
    top_p: float = field(default=1.0, metadata=_help("Rollout nucleus sampling (1 = off)."))
    beta: float = field(default=0.04, metadata=_help("KL coefficient (k3 estimator) to the frozen reference."))
    epsilon: float = field(default=0.2, metadata=_help("PPO clip range (both sides unless epsilon_high is set)."))
    epsilon_high: float | None = field(default=None, metadata=_help(
        "Upper clip range (default: epsilon, the symmetric GRPO clip)."))
    loss_type: str = field(default=GRPO_OPTIONS["loss_type"], metadata=_help(
        "TRL loss aggregation; PS-GRPO uses 'grpo' (per-sequence token mean)."))
    scale_rewards: str = field(default=GRPO_OPTIONS["scale_rewards"], metadata=_help(
        "Advantage scaling; PS-GRPO normalises within each wording's g rollouts ('group')."))
    use_bias_correction_kl: bool = field(default=GRPO_OPTIONS["use_bias_correction_kl"], metadata=_help(
        "Multiply the KL term by the importance ratio (TRL's default True); PS-GRPO uses the plain k3 KL."))
    importance_sampling_level: str = field(default=GRPO_OPTIONS["importance_sampling_level"], metadata=_help(
        "Importance ratios per 'token' (GRPO) or per 'sequence' (GSPO)."))
    multi_objective_aggregation: str = field(default=GRPO_OPTIONS["multi_objective_aggregation"], metadata=_help(
        "How several reward functions combine (PS-GRPO has one)."))
    reward_weights: list[float] | None = field(default_factory=lambda: list(GRPO_OPTIONS["reward_weights"]),
                                               metadata=_help("Weight of each reward function."))
    num_iterations: int = field(default=GRPO_OPTIONS["num_iterations"], metadata=_help(
        "Optimisation passes per generation batch (mu)."))
    delta: float | None = field(default=GRPO_OPTIONS["delta"], metadata=_help("Two-sided clipping bound (off)."))
    top_k: int = field(default=GRPO_OPTIONS["top_k"], metadata=_help("Rollout top-k (0 = off)."))
    min_p: float | None = field(default=GRPO_OPTIONS["min_p"], metadata=_help("Rollout min-p (off)."))
    repetition_penalty: float = field(default=GRPO_OPTIONS["repetition_penalty"], metadata=_help(
        "Rollout repetition penalty (1 = off)."))
    mask_truncated_completions: bool = field(default=GRPO_OPTIONS["mask_truncated_completions"], metadata=_help(
        "Drop truncated rollouts from the loss (off: short answers are cut by design)."))
    sync_ref_model: bool = field(default=GRPO_OPTIONS["sync_ref_model"], metadata=_help(
        "Move the reference toward the policy during training (off: a frozen reference)."))
    top_entropy_quantile: float = field(default=GRPO_OPTIONS["top_entropy_quantile"], metadata=_help(
        "Keep only the top-rho entropy tokens in the loss (1 = all tokens)."))
    entropy_coef: float = field(default=GRPO_OPTIONS["entropy_coef"], metadata=_help("Entropy bonus (off)."))
    use_adaptive_entropy: bool = field(default=GRPO_OPTIONS["use_adaptive_entropy"], metadata=_help(
        "Adaptive entropy control (off)."))
    off_policy_mask_threshold: float | None = field(default=GRPO_OPTIONS["off_policy_mask_threshold"],
                                                    metadata=_help("Off-policy sequence masking (off)."))
    disable_dropout: bool = field(default=GRPO_OPTIONS["disable_dropout"], metadata=_help(
        "Turn dropout off so policy, old policy and reference log-probs agree."))
    shuffle_dataset: bool | None = field(default=GRPO_OPTIONS["shuffle_dataset"], metadata=_help(
        "Shuffle the paraphrase sets (never the rows inside a set)."))
    remove_unused_columns: bool | None = field(default=GRPO_OPTIONS["remove_unused_columns"], metadata=_help(
        "Must stay False: set_id / member / answers reach the reward."))
    per_device_train_batch_size: int | None = field(default=None, metadata=_help(
        "Derived: sets_per_batch * paraphrases * num_generations (setting another value is an error)."))
    learning_rate: float = field(default=1e-6, metadata=_help(
        "Learning rate (TRL's GRPO default; about 1e-4 suits LoRA)."))
    lr_scheduler_type: str = field(default=GRPO_OPTIONS["lr_scheduler_type"], metadata=_help(
        "Learning-rate schedule."))
    max_steps: int = field(default=50, metadata=_help("Optimisation steps."))
    seed: int = field(default=0, metadata=_help("Seed of the set order, rollouts and reward approximation."))
    bf16: bool | None = field(default=False, metadata=_help("bfloat16 mixed precision."))
    gradient_checkpointing: bool | None = field(default=None, metadata=_help(
        "Activation checkpointing (default on: memory for about a third more compute; off is faster when "
        "the step fits).", nargs="?", const=True))
    logging_steps: float = field(default=1, metadata=_help("Log every N steps."))
    save_steps: float = field(default=50, metadata=_help("Save a checkpoint every N steps."))
    save_total_limit: int | None = field(default=2, metadata=_help("Keep at most this many checkpoints."))
    resume_from_checkpoint: str | None = field(default=None, metadata=_help(
        "Resume from this checkpoint folder, or 'last' (the newest checkpoint in output_dir; "
        "--resume alone means last). Refused when the saved settings differ.",
        nargs="?", const="last"))

    def __post_init__(self) -> None:
        if self.output_dir is None:
            raise ValueError("output_dir is required: pass --output_dir DIR (or set output_dir in --config)")
        if self.paraphrases < 2:
            raise ValueError(f"paraphrases must be >= 2 (the original plus at least one rewrite), "
                             f"got {self.paraphrases}")
        g = self.num_generations
        if g is None or g < 2:
            raise ValueError(f"GRPO needs num_generations >= 2 rollouts per wording (advantages are within-group), "
                             f"got {g}")
        if self.sets_per_batch < 1:
            raise ValueError(f"sets_per_batch must be >= 1, got {self.sets_per_batch}")
        per_step = self.sets_per_batch * self.paraphrases * g
        if self.per_device_train_batch_size is None:
            self.per_device_train_batch_size = per_step
        elif self.per_device_train_batch_size != per_step:
            raise ValueError(
                f"per_device_train_batch_size={self.per_device_train_batch_size} contradicts sets_per_batch * "
                f"paraphrases * num_generations = {per_step}; leave it unset (it is derived) or change sets_per_batch")
        if self.steps_per_generation is None:
            self.steps_per_generation = self.gradient_accumulation_steps
        # generation_batch_size is derived (per-device batch * processes * steps_per_generation); a value
        # carried over from an earlier build (dataclasses.replace, saved settings) is checked, not re-applied
        wanted_generation_batch, self.generation_batch_size = self.generation_batch_size, None
        if self.epsilon_high is None:
            self.epsilon_high = self.epsilon  # explicit symmetric clip (set epsilon_high for DAPO-style clipping)
        if self.gradient_checkpointing is None and self.activation_checkpointing is None:
            self.activation_checkpointing = True  # a 16-rollout step on CPU does not fit 24 GB without it
        if self.disable_tqdm is None and os.environ.get("RAGKIT_NO_PROGRESS"):
            self.disable_tqdm = True
        if self.data_seed is None:
            self.data_seed = self.seed
        check_warmup_ratio(self)
        super().__post_init__()
        if wanted_generation_batch is not None and wanted_generation_batch != self.generation_batch_size:
            raise ValueError(f"generation_batch_size={wanted_generation_batch} contradicts the derived "
                             f"{self.generation_batch_size} (whole paraphrase sets per process and step); leave it "
                             "unset and change sets_per_batch or gradient_accumulation_steps instead")
        if not torch.cuda.is_available():
            self.dataloader_pin_memory = False  # pinning needs an accelerator (and warns without one)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first out-of-range method setting."""
        if self.beta < 0 or self.epsilon <= 0:
            raise ValueError(f"need beta >= 0 and epsilon > 0, got beta={self.beta}, epsilon={self.epsilon}")
        if self.kappa < 0:
            raise ValueError(f"kappa must be >= 1, or 0 for the exact reward, got {self.kappa}")
        if self.consistency_weight < 0 or self.gold_weight < 0:
            raise ValueError(f"reward weights must be >= 0, got consistency_weight={self.consistency_weight}, "
                             f"gold_weight={self.gold_weight}")
        if self.consistency_weight == 0 and self.gold_weight == 0:
            raise ValueError("consistency_weight and gold_weight are both 0: the reward would always be 0; "
                             "set gold_weight > 0 (accuracy-only GRPO) or consistency_weight > 0")
        if self.s < 1:
            raise ValueError(f"s must be >= 1, got {self.s}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.remove_unused_columns:
            raise ValueError("remove_unused_columns must be False for PS-GRPO (the reward reads set_id / member)")
        if self.lora_r < 0:
            raise ValueError(f"lora_r must be >= 0 (0 = full fine-tuning), got {self.lora_r}")
        warn_inert(self, [
            (self.lora_r == 0, ("lora_alpha",), "lora_r = 0 (full fine-tuning)"),
            (self.kappa == 0, ("s",), "kappa = 0 computes the exact reward"),
            (self.consistency_weight == 0, ("reward", "kappa", "s"),
             "consistency_weight = 0 computes no group similarity (GRPO with the accuracy reward alone)"),
            (self.beta == 0, ("sync_ref_model",), "beta = 0 loads no reference model"),
        ])
        for name in ("limit", "max_passages"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 (or unset for all), got {v}")
        if self.passage_max_tokens is not None and self.passage_max_tokens < 0:
            raise ValueError(f"passage_max_tokens must be >= 0 (0 = no cut), got {self.passage_max_tokens}")

    @property
    def n(self) -> int:
        """Members per paraphrase set (``paraphrases``)."""
        return self.paraphrases

    @property
    def g(self) -> int:
        """Rollouts per wording (``num_generations``)."""
        return int(self.num_generations or 0)


# ----------------------------------------------------------------------------- trainer
class PSGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` that keeps paraphrase sets whole and tokenises prompts as evaluation does.

    Parameters
    ----------
    *args, **kwargs
        Those of ``trl.GRPOTrainer``; ``args`` must be a :class:`PSGRPOConfig`.
    settings
        The run's settings written into every checkpoint (default: ``args.settings()``).
    """

    def __init__(self, *args: Any, settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if not isinstance(config, PSGRPOConfig):
            raise TypeError(f"PSGRPOTrainer needs a PSGRPOConfig as args, got {type(config).__name__}")
        n, g = config.n, config.g
        procs = max(int(getattr(config, "world_size", 1) or 1), 1)
        local = config.generation_batch_size // procs
        if local % (n * g):
            raise ValueError(
                f"per-process generation batch {local} is not a multiple of n*g = {n * g}: a paraphrase set "
                "would be split across processes; change sets_per_batch or the number of processes")
        super().__init__(*args, **kwargs)
        self.add_callback(SettingsCallback(config.settings() if settings is None else settings))

    def _get_train_sampler(self, dataset: Any = None) -> Sampler[int]:
        ds = self.train_dataset if dataset is None else dataset
        n, g = self.args.n, self.num_generations
        return ParaphraseSetSampler.from_dataset(
            ds, g=g, sets_per_batch=self.args.generation_batch_size // (n * g),
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=self.shuffle_dataset, seed=self.args.seed)

    def _tokenize_prompts(self, prompts: list[Any]) -> tuple[list[list[int]], Any, dict[str, Any]]:
        """Text prompts are tokenised by :func:`ragkit.generation.fitting.encode_prompts`, the function
        evaluation's decoding uses (BOS added unless the text already starts with it); TRL's own
        ``tokenizer(text=prompts)`` would add a second BOS to a chat-templated prompt."""
        if prompts and all(isinstance(p, str) for p in prompts):
            return encode_prompts(self.processing_class, list(prompts)), None, {}
        return super()._tokenize_prompts(prompts)


def make_trainer(model: Any, tokenizer: Any, dataset: Dataset, config: PSGRPOConfig,
                 reward: ParaphraseSetReward, settings: dict[str, Any] | None = None) -> PSGRPOTrainer:
    """Build the PS-GRPO trainer (LoRA through TRL's ``peft_config`` when ``config.lora_r > 0``)."""
    peft_config = None
    if config.lora_r:
        from ragkit.training.models import lora_config

        peft_config = lora_config(config.lora_r, config.lora_alpha)
    return PSGRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                         processing_class=tokenizer, peft_config=peft_config, settings=settings)


def build_training_sets(config: PSGRPOConfig, generator: Generator | None = None) -> list[ParaphraseSet]:
    """The paraphrase sets of ``config.data_file``: the file's own, or built with ``config.paraphraser``.

    ``generator`` is the model that writes LLM paraphrases (``paraphraser="llm"``; default: the
    policy model loaded through :class:`~ragkit.generation.Generator`); its samples are screened by
    :class:`~ragkit.paraphrase.RewriteFilter`, and the rule paraphraser fills in for rejected ones.
    """
    from ragkit.paraphrase import LLMParaphraser, RewriteFilter, RuleParaphraser, build_paraphrase_sets

    if not config.data_file:
        raise ValueError("no training data: pass --data_file FILE (or set data_file in --config)")
    data: Any = load_records(config.data_file, limit=config.limit)
    n = config.paraphrases
    if data and isinstance(data[0], ParaphraseSet):
        sets = [s for s in data if len(s) == n]
        if not sets:
            raise ValueError(f"no set in {config.data_file} has {n} members; set --paraphrases to their size")
        if len(sets) < len(data):
            logger.warning("dropped %d sets whose size is not %d", len(data) - len(sets), n)
        warn_inert(config, [(True, ("paraphraser", "max_passages"),
                             f"{config.data_file} holds paraphrase sets with their own wordings and passages")])
        return sets
    if config.paraphraser == "llm":
        if generator is None:
            from ragkit.generation import Generator

            generator = Generator(config.model, device=str(config.device.type))
        # screened: a small rewriter's unscreened samples often copy, answer or re-ask the question
        # (RewriteFilter), and a set that asks different questions teaches agreement across them
        para: Any = LLMParaphraser(generator, seed=config.seed, rewrite_filter=RewriteFilter())
    else:
        para = RuleParaphraser(seed=config.seed)
    mp = config.max_passages
    return build_paraphrase_sets(data, para, n=n - 1,
                                 passage_filter=(lambda r: select_passages(r, mp)) if mp else None)


def estimate_step_memory(model: Any, rollouts: int, seq_len: int, completion_len: int, checkpointing: bool,
                         lora: bool, reference: bool) -> dict[str, float]:
    """Estimated peak memory (GB) of one PS-GRPO step, before it runs: a step that cannot fit is refused early.

    With ``P`` parameters of ``e`` bytes, ``B`` rollouts of ``S`` tokens, ``L`` layers of width
    ``h``, MLP width ``i``, ``a`` heads, ``a_kv`` key/value heads and vocabulary ``V``:

    * weights and optimiser: ``P e`` (policy) ``+ P e`` (gradients) ``+ 8 P`` (Adam's two fp32
      moments) ``+ P e`` (the frozen reference when ``beta > 0``); LoRA: the policy only (its
      adapters are small and the reference is the policy with them off);
    * activations kept for the backward pass: ``B S L e (4h + 1.5i + 1.5aS)`` without
      checkpointing, ``B S L e h + B S e (4h + 1.5i + 1.5aS)`` with it (one layer recomputed at a
      time); the ``aS`` term is the attention weights, quadratic in the prompt length;
    * rollout KV cache ``2 B S L a_kv (h / a) e``, completion logits ``3 B C V e``, 1 GB of runtime.

    The activation constants were fitted to one measurement (SmolLM2-135M, float32, CPU, SDPA
    attention: 4 rollouts of 716 tokens peaked at 6.2 GB RSS) and are an estimate, not a bound:
    for the README's 16 checkpointed rollouts it gives 5.5 GB where 9.5 GB was measured, so the
    refusal errs on the side of running; without checkpointing it gives 22.4 GB, where the run was
    killed at 21.0 GB.
    """
    cfg = getattr(model, "config", model)
    h, layers = int(cfg.hidden_size), int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * h)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    vocab = int(cfg.vocab_size)
    params = sum(p.numel() for p in model.parameters()) if hasattr(model, "parameters") else 0
    e = next(model.parameters()).element_size() if hasattr(model, "parameters") else 4
    gb = 1024.0 ** 3
    per_token_layer = e * (4 * h + 1.5 * inter + 1.5 * heads * seq_len)
    if checkpointing:
        act = rollouts * seq_len * (layers * e * h + per_token_layer)
    else:
        act = rollouts * seq_len * layers * per_token_layer
    weights = params * e * (1 if lora else 2 + (1 if reference else 0)) + (0 if lora else 8 * params)
    kv = 2 * rollouts * seq_len * layers * kv_heads * (h // heads) * e
    logits = 3 * rollouts * (completion_len + 1) * vocab * e
    out = {"weights_and_optimizer": weights / gb, "activations": act / gb, "kv_cache": kv / gb,
           "logits": logits / gb, "runtime": 1.0}
    out["total"] = sum(out.values())
    return out


def _memory_budget(device: str) -> tuple[float, float, str]:
    """``(total GB, available GB, what)`` of the device a step runs on (RAM, or the GPU's memory)."""
    gb = 1024.0 ** 3
    if device.startswith("cuda") and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return total / gb, free / gb, f"GPU {torch.cuda.get_device_name()}"
    import psutil

    vm = psutil.virtual_memory()
    total, avail = vm.total, vm.available
    try:  # a container's memory limit (cgroup v2) is the real budget
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total, avail = min(total, int(limit)), min(avail, int(limit))
    except OSError:
        pass
    return total / gb, avail / gb, "RAM"


def check_step_memory(estimate: dict[str, float], config: PSGRPOConfig, seq_len: int) -> None:
    """Refuse a run whose estimated step (:func:`estimate_step_memory`) exceeds 90% of the machine's memory.

    The error gives the numbers and the settings that shrink a step; a step that fits the memory
    but not what is free now gets a warning. ``RAGKIT_SKIP_MEMORY_CHECK=1`` skips the check.
    """
    if os.environ.get("RAGKIT_SKIP_MEMORY_CHECK"):
        return
    total, avail, what = _memory_budget(str(config.device))
    need = estimate["total"]
    parts = ", ".join(f"{k} {v:.1f}" for k, v in estimate.items() if k != "total")
    shape = (f"{config.per_device_train_batch_size} rollouts (paraphrases {config.paraphrases} x num_generations "
             f"{config.num_generations} x sets_per_batch {config.sets_per_batch}) of up to {seq_len} tokens")
    if need > 0.9 * total:
        raise ValueError(
            f"a PS-GRPO step of {shape} needs about {need:.1f} GB ({parts}) but the {what} holds {total:.1f} GB; "
            "shrink it: --passage_max_tokens 40, --max_passages 5, --num_generations 2 or --paraphrases 3"
            + ("" if config.gradient_checkpointing else ", or turn --gradient_checkpointing on")
            + " (RAGKIT_SKIP_MEMORY_CHECK=1 runs it anyway)")
    if need > avail:
        logger.warning("a PS-GRPO step of %s needs about %.1f GB but only %.1f GB of %s is free now",
                       shape, need, avail, what)
    else:
        logger.info("a PS-GRPO step of %s needs about %.1f GB (%s); %.1f GB free", shape, need, parts, avail)


def train_psgrpo(
    sets: Sequence[ParaphraseSet] | None,
    config: PSGRPOConfig,
    similarity: Callable[[Sequence[str], Sequence[str]], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Run PS-GRPO end to end and save the trained model to ``output_dir/final`` (atomically).

    Parameters
    ----------
    sets
        Paraphrase sets, all of size ``config.paraphrases`` (``None``: :func:`build_training_sets`).
    config
        :class:`PSGRPOConfig`; ``resume_from_checkpoint`` ``"last"`` or a checkpoint folder.
    similarity
        A batched similarity ``f(hyps, refs) -> array`` replacing ``config.reward`` (library use;
        the summary records its name).

    Returns
    -------
    dict
        Summary: settings, steps, train loss, reward/consistency history, wall time, rollout tokens.
    """
    from ragkit.generation import Generator
    from ragkit.training.models import load_for_training

    if sets is None and config.data_file and not Path(config.data_file).is_file():
        raise FileNotFoundError(f"training data file {config.data_file} does not exist")
    out = prepare_run_dir(config.output_dir, kind="psgrpo-run", legacy_files=("psgrpo_summary.json",))
    settings = config.settings()
    if similarity is not None:
        settings["reward"] = getattr(similarity, "__name__", "custom")
    resume = check_resume(config.resume_from_checkpoint, out, settings, settings_file="psgrpo_settings.json")
    done = resume.finished_summary("psgrpo_summary.json", config.max_steps)
    if done is not None:
        logger.info("%s already finished %d steps; keeping its summary", out, config.max_steps)
        return done
    if sets is None and config.paraphraser != "llm":
        sets = build_training_sets(config)  # before the model loads: bad data is reported at once
    policy, tok, path = load_for_training(config.model, dtype=config.dtype, device="cpu",
                                          stop_at_newline=config.stop_at_newline)
    gen = Generator.from_components(policy, tok, name=path, template=config.template,
                                    passage_max_tokens=config.passage_max_tokens or None, show_progress=False)
    if sets is None:
        sets = build_training_sets(config, generator=gen)
    bad = [s.set_id for s in sets if len(s) != config.n]
    if bad:
        raise ValueError(f"{len(bad)} set(s) (e.g. {bad[0]!r}) do not have paraphrases={config.n} members; "
                         "rebuild them with build_paraphrase_sets(..., n=paraphrases - 1)")
    dataset = build_grpo_dataset(sets, gen)
    longest = max(len(ids) for ids in encode_prompts(tok, list(dataset["prompt"])))
    seq_len = longest + int(config.max_completion_length or 0)
    check_step_memory(estimate_step_memory(policy, config.per_device_train_batch_size, seq_len,
                                           int(config.max_completion_length or 0),
                                           bool(config.gradient_checkpointing), bool(config.lora_r),
                                           config.beta > 0), config, seq_len)
    reward = ParaphraseSetReward(sim=similarity or config.reward, kappa=config.kappa or None, s=config.s,
                                 gold_weight=config.gold_weight, seed=config.seed, stops=tuple(gen.template.stop),
                                 consistency_weight=config.consistency_weight)
    write_json(out / "psgrpo_settings.json", settings)
    trainer = make_trainer(policy, tok, dataset, config, reward, settings=settings)
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=resume.checkpoint)
    wall = time.perf_counter() - t0
    history = [h for h in trainer.state.log_history if "reward" in h]
    final_dir = out / "final"
    if trainer.is_world_process_zero():
        save_final_model(trainer.model, tok, final_dir, merge_lora=True)
    tokens = sum(float(h.get("completions/mean_length", 0.0)) * config.per_device_train_batch_size
                 for h in history)
    steps_run = int(trainer.state.global_step) - resume.step
    summary = {
        "method": "psgrpo",
        "citation": "Hamman et al., NeurIPS 2025, arXiv 2510.04392",
        "model": path,
        "settings": settings,
        "num_sets": len(sets),
        "global_step": int(trainer.state.global_step),
        "steps": int(trainer.state.global_step),
        "steps_this_run": steps_run,
        "train_loss": float(result.training_loss) if steps_run > 0 else resume.logged_train_loss(trainer.state),
        "wall_s": wall,
        "rollout_tokens": tokens,
        "history": history,
        "reward_comparisons": reward.comparisons,
        "resumed_from": resume.checkpoint,
        "final_dir": str(final_dir),
    }
    if trainer.is_world_process_zero():
        write_json(out / "psgrpo_summary.json", summary)
    return summary
