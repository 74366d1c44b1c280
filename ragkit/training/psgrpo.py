"""PS-GRPO: GRPO with group similarity rewards over paraphrase sets, on TRL's ``GRPOTrainer``.

Hamman et al., "Improving Consistency in Retrieval-Augmented Systems with Group Similarity
Rewards", NeurIPS 2025, arXiv 2510.04392.

For every paraphrase set (``n`` wordings of one question, :mod:`ragkit.paraphrase`)
the policy samples ``g`` answers per wording; a rollout's reward is its mean similarity to
the rollouts of the *other* wordings (:mod:`ragkit.training.rewards`, exact or the unbiased
``kappa``/``s`` approximation), plus ``w * F1(answer, gold)``. Advantages are normalised within
each wording's ``g`` rollouts, and the policy is updated with the GRPO clipped surrogate plus a
k3 KL penalty to the frozen reference::

    A_ij  = (r_ij - mean_j' r_ij') / (std_j' r_ij' + 1e-4)
    L     = -1/|y| sum_t [ min(rho_t A_ij, clip(rho_t, 1-eps, 1+eps) A_ij)
                           - beta (exp(d_t) - d_t - 1) ],   d_t = log pi_ref - log pi_theta,
    rho_t = pi_theta(y_t | ...) / pi_old(y_t | ...)

How it maps onto TRL 1.16.0
---------------------------
* One dataset row per (set, wording): columns ``prompt`` (the Generator template with the
  wording and its passages), ``set_id``, ``member``, ``answers``. TRL passes the extra columns
  to reward functions as keyword lists aligned with the completions.
* :class:`ParaphraseSetSampler` replaces TRL's ``RepeatSampler`` (``_get_train_sampler``): it
  shuffles *sets*, never rows, and yields each wording ``g`` times in a row, so every set's
  ``n * g`` rollouts are in the same generation batch (and, on several processes, on the same
  process: the per-process generation batch must be a multiple of ``n * g``).
* TRL's advantage code groups ``num_generations = g`` consecutive rewards: exactly one wording's
  rollouts, i.e. "normalise within each paraphrase" (``scale_rewards="group"``).
* ``loss_type="grpo"`` (per-sequence token mean), ``beta`` (k3 KL to the reference) and
  ``epsilon`` are set explicitly in the :class:`~trl.GRPOConfig`; every other GRPO option we
  rely on is set explicitly too (:func:`make_grpo_config`).
* With ``beta > 0`` and no LoRA, TRL rebuilds the reference model from
  ``model.config._name_or_path``, so the policy is always loaded from a folder on disk (the
  embedded SmolLM2's safetensors cache from ``ragkit.models.resolve_generator_path(None)``, a
  hub id, or a checkpoint). With LoRA the reference is the base model with the adapter off.

GPU use (same code; vLLM for rollouts, accelerate/DeepSpeed for the update)::

    # one GPU, vLLM colocated with training
    ragkit train psgrpo --data-file train.jsonl --model HuggingFaceTB/SmolLM2-360M-Instruct \\
        --paraphrases 4 --generations 4 --output-dir runs/psgrpo --max-steps 500 --use-vllm
    # several GPUs (sets_per_batch * n * g must divide the per-process generation batch)
    accelerate launch --num_processes 4 -m ragkit.cli train psgrpo ... --use-vllm --vllm-mode colocate
"""

from __future__ import annotations

import logging
import math
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Sampler

from ragkit.paraphrase import ParaphraseSet
from ragkit.similarity import get_similarity
from ragkit.text import extract_answer
from ragkit.training.rewards import (
    approx_group_similarity_rewards,
    gold_f1,
    group_similarity_rewards,
)
from ragkit.types import Passage, QARecord

if TYPE_CHECKING:  # pragma: no cover
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import GRPOConfig, GRPOTrainer

    from ragkit.generation import Generator

logger = logging.getLogger(__name__)

__all__ = [
    "ParaphraseSetSampler",
    "ParaphraseSetReward",
    "PSGRPOSettings",
    "build_grpo_dataset",
    "clean_completion",
    "load_policy",
    "newline_token_ids",
    "make_grpo_config",
    "make_trainer",
    "select_passages",
    "train_psgrpo",
    "load_training_records",
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


def load_training_records(path: str | os.PathLike[str], limit: int | None = None) -> list[QARecord] | list[ParaphraseSet]:
    """Read a training file: HotpotQA JSONL, ragkit QA JSONL, or paraphrase-set JSONL.

    The format is detected from the first line: ``paraphrases`` -> :class:`ParaphraseSet`
    (``ParaphraseSet.to_dict`` lines, e.g. paraphrases taken from the data); ``context`` +
    ``supporting_facts`` -> HotpotQA distractor format; otherwise ``{id, question, answers,
    passages?, gold_ids?}`` with passages as ``Passage.to_dict`` records.
    """
    from ragkit.datasets import hotpotqa_record
    from ragkit.io import read_jsonl

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"training data file {p} does not exist")
    rows = read_jsonl(p)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise ValueError(f"{p} has no records")
    first = rows[0]
    if "paraphrases" in first:
        return [ParaphraseSet.from_dict(r) for r in rows]
    if "context" in first and "supporting_facts" in first:
        return [hotpotqa_record(r) for r in rows]
    out = []
    for i, r in enumerate(rows):
        if "question" not in r:
            raise ValueError(f"{p} line {i + 1} has no 'question'; expected HotpotQA, QA or paraphrase-set JSONL")
        ans = r.get("answers", r.get("answer", ()))
        out.append(QARecord(id=str(r.get("id", i)), question=r["question"],
                            answers=tuple([ans] if isinstance(ans, str) else ans),
                            passages=tuple(Passage.from_dict(x) for x in r.get("passages", ())),
                            gold_ids=tuple(r.get("gold_ids", ()))))
    return out


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
        import torch

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
        import torch

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
def clean_completion(text: str, stops: Sequence[str] = ("\n", "Question:", "Passages:")) -> str:
    """The answer inside a sampled completion, read exactly as evaluation reads it:
    :func:`ragkit.text.extract_answer` with the template's stop strings."""
    return extract_answer(text, stops)


class ParaphraseSetReward:
    """TRL reward function: group similarity within each ``set_id`` (+ ``w`` gold F1).

    Called by ``GRPOTrainer`` with the completions of one generation batch (per process) and
    the dataset columns ``set_id``, ``member`` and ``answers`` as aligned lists. Completions are
    grouped by set and member into ``n x g`` rollout tables and scored with
    :func:`~ragkit.training.rewards.group_similarity_rewards` (``kappa=None`` or
    ``kappa >= n-1``) or :func:`~ragkit.training.rewards.approx_group_similarity_rewards`.
    Empty answers never count as agreement (their similarities are 0), so the policy cannot
    win by saying nothing.

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
    """

    def __init__(self, sim: str = "bleu2", kappa: int | None = 3, s: int = 1, gold_weight: float = 0.5,
                 seed: int = 0, stops: Sequence[str] = ("\n", "Question:", "Passages:"),
                 encoder: Any = None) -> None:
        self.sim_name = sim if isinstance(sim, str) else getattr(sim, "__name__", "custom")
        self.sim = get_similarity(sim, encoder=encoder)
        self.kappa = kappa
        self.s = int(s)
        self.gold_weight = float(gold_weight)
        self.rng = np.random.default_rng(seed)
        self.stops = tuple(stops)
        self.__name__ = f"psgrpo_{self.sim_name}"
        self.comparisons = 0
        self.calls = 0
        self.last: dict[str, float] = {}

    def __call__(self, prompts: list[Any], completions: list[Any], set_id: list[str], member: list[int],
                 answers: list[list[str]] | None = None, **kwargs: Any) -> list[float]:
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]  # conversational too
        ans = [clean_completion(t, self.stops) for t in texts]
        rewards = np.zeros(len(ans))
        golds = answers if answers is not None else [[] for _ in ans]
        by_set: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        for k, (sid, m) in enumerate(zip(set_id, member)):
            by_set[str(sid)][int(m)].append(k)
        sims: list[float] = []
        incomplete = 0
        for sid, mem in by_set.items():
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
            self.comparisons += cnt
            sims.append(float(np.mean(r)))
            if self.gold_weight and gold:
                r = r + self.gold_weight * gold_f1([y for row in table for y in row], gold).reshape(r.shape)
            for pos, row in zip(positions, r):
                rewards[pos] = row
        if incomplete:
            logger.warning("%d paraphrase set(s) arrived incomplete in a batch; they got only the gold reward. "
                           "Use PSGRPO's ParaphraseSetSampler.", incomplete)
        self.calls += 1
        self.last = {"consistency": float(np.mean(sims)) if sims else float("nan"),
                     "gold_f1": float(np.mean([gold_f1([a], list(g or []))[0] for a, g in zip(ans, golds)])),
                     "empty_rate": float(np.mean([not a for a in ans]))}
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            for k, v in self.last.items():
                if not math.isnan(v):
                    log_metric(f"psgrpo/{k}", v)
        return rewards.tolist()


# ----------------------------------------------------------------------------- model + config
def newline_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids of every vocabulary token whose text contains a newline (one batched decode).

    Added to the policy's EOS ids so that rollouts end with the short answer's line, as
    ``Generator.answer`` does at evaluation time.
    """
    ids = list(range(len(tokenizer)))
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return [i for i, t in zip(ids, texts) if "\n" in t]


def load_policy(model: str | None, device: str = "auto", dtype: str = "auto",
                stop_at_newline: bool = True) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """Load the policy from a folder on disk (what TRL needs to rebuild the reference model).

    ``model`` is resolved with ``ragkit.models.resolve_generator_path`` (``None``: the embedded
    SmolLM2 safetensors cache). With ``stop_at_newline`` the newline tokens join the model's
    ``generation_config.eos_token_id`` (the original is kept in
    ``model.generation_config.ragkit_original_eos``).

    Returns
    -------
    (model, tokenizer, path)
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragkit.models import resolve_device, resolve_dtype, resolve_generator_path

    path = resolve_generator_path(model)
    dev = resolve_device(device)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    m = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, dev)).to(dev)
    if stop_at_newline:
        eos = m.generation_config.eos_token_id
        eos_list = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        if tok.eos_token_id is not None and tok.eos_token_id not in eos_list:
            eos_list.insert(0, tok.eos_token_id)
        m.generation_config.ragkit_original_eos = eos
        m.generation_config.eos_token_id = eos_list + [i for i in newline_token_ids(tok) if i not in eos_list]
    return m, tok, path


@dataclass
class PSGRPOSettings:
    """Every knob of a PS-GRPO run (the CLI maps onto these one to one).

    Defaults: n=4 wordings (original + 3 rewrites), g=4 rollouts, BLEU-2 similarity with the
    kappa=3, s=1 approximation (exact when kappa >= n-1), gold weight 0.5, beta=0.04,
    epsilon=0.2, temperature 1.0, 16 new tokens, lr 1e-6 (full) / 1e-4 (LoRA);
    ``gradient_checkpointing=None`` turns it on with CUDA (memory) and off on CPU (speed: it
    recomputes every layer's forward in the backward pass, and CPU RAM is rarely the limit).
    """

    n: int = 4
    g: int = 4
    sets_per_batch: int = 1
    max_steps: int = 50
    beta: float = 0.04
    epsilon: float = 0.2
    kappa: int | None = 3
    s: int = 1
    reward: str | Any = "bleu2"
    gold_weight: float = 0.5
    learning_rate: float | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 16
    num_iterations: int = 1
    gradient_accumulation_steps: int = 1
    lora_r: int = 0
    lora_alpha: int = 16
    seed: int = 0
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    save_steps: int = 50
    logging_steps: int = 1
    bf16: bool = False
    gradient_checkpointing: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.n < 2:
            raise ValueError(f"paraphrase sets need n >= 2 members, got {self.n}")
        if self.g < 2:
            raise ValueError(f"GRPO needs g >= 2 rollouts per prompt (advantages are within-group), got {self.g}")
        if self.beta < 0 or self.epsilon <= 0:
            raise ValueError(f"need beta >= 0 and epsilon > 0, got beta={self.beta}, epsilon={self.epsilon}")
        if self.kappa is not None and self.kappa < 1:
            raise ValueError(f"kappa must be >= 1 or None (exact), got {self.kappa}")
        if self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")


def make_grpo_config(output_dir: str | os.PathLike[str], st: PSGRPOSettings) -> GRPOConfig:
    """A ``trl.GRPOConfig`` with every option PS-GRPO depends on set explicitly.

    One optimisation step uses one generation batch of ``sets_per_batch * n * g`` rollouts
    (``per_device_train_batch_size = sets_per_batch * n * g``, ``steps_per_generation =
    gradient_accumulation_steps``).
    """
    from trl import GRPOConfig

    st.validate()
    per_step = st.sets_per_batch * st.n * st.g
    lr = st.learning_rate if st.learning_rate is not None else (1e-4 if st.lora_r else 1e-6)
    kw: dict[str, Any] = dict(
        output_dir=str(output_dir),
        # batch geometry: one generation batch = whole paraphrase sets
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=st.gradient_accumulation_steps,
        steps_per_generation=st.gradient_accumulation_steps,
        num_generations=st.g,
        num_iterations=st.num_iterations,
        shuffle_dataset=True,
        remove_unused_columns=False,  # keep set_id / member / answers for the reward
        # sampling
        max_completion_length=st.max_completion_length,
        temperature=st.temperature,
        top_p=st.top_p,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        # objective
        loss_type="grpo",
        beta=st.beta,
        epsilon=st.epsilon,
        epsilon_high=st.epsilon,
        delta=None,
        importance_sampling_level="token",
        scale_rewards="group",
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=[1.0],
        mask_truncated_completions=False,
        sync_ref_model=False,
        top_entropy_quantile=1.0,
        disable_dropout=True,
        # optimisation
        learning_rate=lr,
        max_steps=st.max_steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=st.seed,
        data_seed=st.seed,
        bf16=st.bf16,
        gradient_checkpointing=_cuda() if st.gradient_checkpointing is None else st.gradient_checkpointing,
        # generation backend
        use_vllm=st.use_vllm,
        vllm_mode=st.vllm_mode,
        # bookkeeping
        logging_steps=st.logging_steps,
        save_steps=st.save_steps,
        save_strategy="steps",
        save_total_limit=2,
        report_to=[],
        log_completions=False,
        dataloader_num_workers=0,
        use_cpu=not _cuda(),
    )
    kw.update(st.extra)
    return GRPOConfig(**kw)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_trainer(model: PreTrainedModel | str, tokenizer: PreTrainedTokenizerBase, dataset: Dataset,
                 config: GRPOConfig, reward: ParaphraseSetReward, n: int, lora_r: int = 0,
                 lora_alpha: int = 16) -> GRPOTrainer:
    """Build the PS-GRPO trainer: TRL's ``GRPOTrainer`` with the set-preserving sampler."""
    from trl import GRPOTrainer

    g = config.num_generations

    class PSGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` whose train sampler keeps paraphrase sets whole (see module docstring)."""

        def _get_train_sampler(self, dataset: Any = None) -> Sampler[int]:
            ds = self.train_dataset if dataset is None else dataset
            return ParaphraseSetSampler.from_dataset(
                ds, g=self.num_generations,
                sets_per_batch=self.args.generation_batch_size // (n * self.num_generations),
                repeat_count=self.num_iterations * self.args.steps_per_generation,
                shuffle=self.shuffle_dataset, seed=self.args.seed)

    procs = max(int(getattr(config, "world_size", 1) or 1), 1)
    local = config.generation_batch_size // procs
    if local % (n * g):
        raise ValueError(
            f"per-process generation batch {local} is not a multiple of n*g = {n * g}: a paraphrase set "
            "would be split across processes; change sets_per_batch or the number of processes")
    peft_config = None
    if lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    return PSGRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=dataset,
                         processing_class=tokenizer, peft_config=peft_config)


def train_psgrpo(
    sets: Sequence[ParaphraseSet],
    model: str | None,
    output_dir: str | os.PathLike[str],
    settings: PSGRPOSettings,
    template: str = "auto",
    passage_max_tokens: int | None = None,
    resume: bool = False,
    device: str = "auto",
) -> dict[str, Any]:
    """Run PS-GRPO end to end and save the trained model to ``output_dir/final`` (atomically).

    Parameters
    ----------
    sets
        Paraphrase sets, all of size ``settings.n``.
    model
        Policy name or folder (``None``: embedded SmolLM2, loaded from its safetensors cache).
    output_dir
        Checkpoints (``checkpoint-*``), ``final/`` and ``psgrpo_summary.json`` go here.
    settings
        All hyper-parameters.
    template, passage_max_tokens
        Prompt layout (``ragkit.generation.Generator`` options).
    resume
        Continue from the last ``checkpoint-*`` in ``output_dir`` when there is one.

    Returns
    -------
    dict
        Summary: settings, steps, train loss, reward/consistency history, wall time, tokens/s.
    """
    import time

    from ragkit.generation import Generator
    from ragkit.io import atomic_dir, check_writable_dir, write_json

    settings.validate()
    bad = [s.set_id for s in sets if len(s) != settings.n]
    if bad:
        raise ValueError(f"{len(bad)} set(s) (e.g. {bad[0]!r}) do not have n={settings.n} members; "
                         "rebuild them with build_paraphrase_sets(..., n=settings.n - 1)")
    out = Path(output_dir)
    check_writable_dir(out / "final", "model")  # before any training, not after it
    out.mkdir(parents=True, exist_ok=True)
    policy, tok, path = load_policy(model, device=device)
    gen = Generator.from_components(policy, tok, name=path, template=template,
                                    passage_max_tokens=passage_max_tokens, show_progress=False)
    dataset = build_grpo_dataset(sets, gen)
    reward = ParaphraseSetReward(sim=settings.reward, kappa=settings.kappa, s=settings.s,
                                 gold_weight=settings.gold_weight, seed=settings.seed,
                                 stops=tuple(gen.template.stop))
    config = make_grpo_config(out, settings)
    trainer = make_trainer(policy, tok, dataset, config, reward, n=settings.n,
                           lora_r=settings.lora_r, lora_alpha=settings.lora_alpha)
    ckpt = None
    if resume:
        ckpts = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        ckpt = str(ckpts[-1]) if ckpts else None
        logger.info("resuming from %s", ckpt or "scratch (no checkpoint found)")
    t0 = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=ckpt)
    wall = time.perf_counter() - t0
    history = [h for h in trainer.state.log_history if "reward" in h]
    final_model = trainer.model
    if settings.lora_r:
        final_model = final_model.merge_and_unload()
    orig = getattr(final_model.generation_config, "ragkit_original_eos", None)
    if orig is not None:
        final_model.generation_config.eos_token_id = orig
    with atomic_dir(out / "final", kind="model", overwrite=False) as tmp:
        final_model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    tokens = sum(float(h.get("completions/mean_length", 0.0)) * settings.sets_per_batch * settings.n * settings.g
                 for h in history)
    summary = {
        "method": "psgrpo",
        "citation": "Hamman et al., NeurIPS 2025, arXiv 2510.04392",
        "model": path,
        "settings": {k: (v if not callable(v) else getattr(v, "__name__", "custom"))
                     for k, v in settings.__dict__.items() if k != "extra"},
        "num_sets": len(sets),
        "steps": int(trainer.state.global_step),
        "train_loss": float(result.training_loss),
        "wall_s": wall,
        "rollout_tokens": tokens,
        "history": history,
        "reward_comparisons": reward.comparisons,
        "final_dir": str(out / "final"),
    }
    write_json(out / "psgrpo_summary.json", summary)
    return summary
