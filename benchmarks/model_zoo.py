"""Model zoo: ragkit's scoring, MoI, CORD and PS-GRPO on tiny random models of many architectures.

ragkit promises "any Hugging Face causal LM". For each architecture below a tiny random model
(2 layers, hidden 64) is built offline from its ``transformers`` config class, with a tokenizer
trained in-process (byte-level BPE with a chat template, or a Llama-2-style SentencePiece
Metaspace tokenizer that adds BOS), and the script checks:

* ``score``: ``max |Generator.score() - reference|`` over every answer token of a padded batch,
  where the reference is ONE plain full forward ``model(prompt_ids + answer_ids).logits`` (no
  cache, no mask, no ``logits_to_keep``) followed by ``log_softmax`` at the positions that
  predict the answer tokens. The ids are the generator's own joint encoding
  (:meth:`Generator.encode_answers`), which is itself checked: ``prompt_ids + answer_ids`` must
  equal ``tokenizer(prompt + answer)`` and the answer ids must decode to the answer (no
  spurious ``"▁"`` token).
* ``score_orderings`` (shared-prefix key/value reuse when the architecture allows it) and
  ``run_orderings`` (candidates scored from each ordering's decode cache): the same maximum
  against the same reference on every ordering's full prompt.
* ``naive_head_gap``: how far ``log_softmax(lm_head(h))`` (the LM head applied by hand, without
  the architecture's logit transform: Cohere's ``logit_scale``, Granite's ``logits_scaling``,
  Gemma 2's ``final_logit_softcapping``) is from the reference. Non-zero means a by-hand head
  would be wrong for that model, i.e. the ``score`` check above can fail there.
* MoI (:class:`ragkit.debias.MoI`, three designs, k = 3): utilities and outcomes finite.
* CORD: :meth:`CORDTrainer.compute_loss` on one batch built by :class:`CORDCollator` for the
  ``cord``, ``consistency`` and ``shuffle`` losses, finite loss and gradient; the retriever-order
  rows' answer log-probs must equal ``Generator.score`` (``cord_vs_score``).
* PS-GRPO: :func:`build_grpo_dataset` prompts tokenised as the trainer does
  (:func:`ragkit.generation.fitting.encode_prompts`, at most one BOS), sampled rollouts
  (``g`` per wording) and :class:`ParaphraseSetReward` (exact and ``kappa``-approximate): finite;
  the log-probs of the GRPO objective (:class:`PSGRPOTrainer`'s TRL ``_get_per_token_logps``
  at temperature 0.7, left-padded rows) against the reference divided by the temperature
  (``trl_logp_gap``).

A row passes when every log-prob gap is below ``--tol`` (1e-4), the answer tokenisation is
right and every method gives finite numbers.

Usage::

    python benchmarks/model_zoo.py --out benchmarks/results/model_zoo-cpu.json
    python benchmarks/model_zoo.py --archs llama granite --out /tmp/zoo.json
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):  # run as a script from anywhere, or loaded by a test
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

TOL = 1e-4

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "Arthur's Magazine was an American literary periodical published in Philadelphia.",
    "First for Women is a woman's magazine published by Bauer Media Group in the USA.",
    "Answer the question using the passages. Question: Which magazine was started first?",
    "Passage 1: Title. Text. Answer: yes no 1844 1989 the a an of in on at to is was",
    "0 1 2 3 4 5 6 7 8 9 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz .,;:!?'\"()[]-",
]

# (question, passages in retriever order, gold answer): hand-written, so the script needs no data files
QUESTIONS: list[tuple[str, list[str], str]] = [
    ("Which magazine was started first?",
     ["Arthur's Magazine was an American literary periodical published in Philadelphia in 1844.",
      "First for Women is a woman's magazine published by Bauer Media Group in the USA since 1989.",
      "The quick brown fox jumps over the lazy dog."],
     "Arthur's Magazine"),
    ("What is the capital of France?",
     ["Paris is the capital of France.", "Lyon is a city in France.", "Berlin is in Germany."],
     "Paris"),
    ("When was First for Women started?",
     ["Bauer Media Group publishes magazines.", "First for Women was started in 1989.",
      "Arthur's Magazine dates from 1844."],
     "1989"),
]


# ----------------------------------------------------------------------------- tokenizers
def build_tokenizer(kind: str) -> Any:
    """A tokenizer trained in-process (no download).

    ``"bpe"``: byte-level BPE (vocab 400) with a ChatML chat template (as ``tests/conftest.py``);
    ``"spm"``: Llama-2 / Mistral-v0.1-style SentencePiece BPE with a Metaspace pre-tokenizer
    (``▁`` prepended to the first word) that adds ``<s>`` to every text, no chat template.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bpe":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tk.train_from_iterator(_TRAIN_TEXT * 4, trainer=trainer)
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                      pad_token="<|endoftext|>", unk_token="<|endoftext|>")
        tok.chat_template = _CHAT_TEMPLATE
        return tok
    if kind == "spm":
        # trained on whitespace-split words (as sentencepiece does), then given the layout of
        # Llama-2's tokenizer.json: Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer
        tk = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=False))
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        alphabet = sorted(set("".join(_TRAIN_TEXT).replace(" ", "▁")) | {"▁"})
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                      initial_alphabet=alphabet, show_progress=False)
        tk.train_from_iterator(_TRAIN_TEXT * 4, trainer=trainer)
        tk.pre_tokenizer = None
        tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
        bos = tk.token_to_id("<s>")
        tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                          special_tokens=[("<s>", bos)])
        return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                       pad_token="<unk>")
    raise ValueError(f"unknown tokenizer kind {kind!r}; use 'bpe' or 'spm'")


# ----------------------------------------------------------------------------- architectures
@dataclass(frozen=True)
class Arch:
    """A tiny random configuration of one architecture."""

    config_class: str
    tokenizer: str = "bpe"
    extra: dict[str, Any] = field(default_factory=dict)


ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaConfig", "spm"),
    "qwen2": Arch("Qwen2Config"),
    "gemma2": Arch("Gemma2Config", "spm", {"head_dim": 16, "final_logit_softcapping": 2.0,
                                           "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 16,
                                           "sliding_window": 8}),
    "granite": Arch("GraniteConfig", "bpe", {"logits_scaling": 0.5, "embedding_multiplier": 2.0,
                                             "residual_multiplier": 0.5, "attention_multiplier": 0.25}),
    "cohere": Arch("CohereConfig", "bpe", {"logit_scale": 2.0}),
    "mistral": Arch("MistralConfig", "spm", {"sliding_window": 8}),
    "phi3": Arch("Phi3Config", "bpe", {"pad_token_id": None}),
    "gemma": Arch("GemmaConfig", "spm", {"head_dim": 16}),
    "qwen3": Arch("Qwen3Config", "bpe", {"head_dim": 16}),
    "olmo2": Arch("Olmo2Config"),
    "starcoder2": Arch("Starcoder2Config"),
    "stablelm": Arch("StableLmConfig"),
}
"""Architecture name -> tiny configuration. Extra settings make the post-head transforms bite
(Granite divides logits by 0.5, Cohere multiplies them by 2, Gemma 2 caps them at ±2; larger
factors only make float32 rounding of the large logits approach the tolerance) and make the
sliding window (8 tokens) shorter than the prompts."""


def build_model(name: str, tokenizer: Any, seed: int = 0) -> Any:
    """The tiny random model of ``name`` (eval mode, fp32, eager-free default attention)."""
    import torch
    import transformers

    arch = ARCHS[name]
    cls = getattr(transformers, arch.config_class)
    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
        initializer_range=0.2,  # large enough that log-probs spread well away from -log(V)
    )
    kw.update(arch.extra)
    cfg = cls(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.float().eval()


# ----------------------------------------------------------------------------- reference
def reference_logprobs(model: Any, p_ids: Sequence[int], a_ids: Sequence[int]) -> Any:
    """Answer-token log-probs from one plain full forward of ``p_ids + a_ids`` (float64 log_softmax)."""
    import torch

    ids = torch.tensor([list(p_ids) + list(a_ids)], dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0].double()
    lsm = torch.log_softmax(logits, dim=-1)
    n = len(p_ids)
    rows = torch.arange(n - 1, n - 1 + len(a_ids))
    return lsm[rows, torch.tensor(list(a_ids))].cpu().numpy()


def naive_head_logprobs(model: Any, p_ids: Sequence[int], a_ids: Sequence[int]) -> Any:
    """The same, with the LM head applied by hand to the decoder's last hidden states (no transform)."""
    import torch

    ids = torch.tensor([list(p_ids) + list(a_ids)], dtype=torch.long, device=next(model.parameters()).device)
    with torch.inference_mode():
        h = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(h)[0].double()
    lsm = torch.log_softmax(logits, dim=-1)
    n = len(p_ids)
    return lsm[torch.arange(n - 1, n - 1 + len(a_ids)), torch.tensor(list(a_ids))].cpu().numpy()


def _max_gap(got: Sequence[Any], ref: Sequence[Any]) -> float:
    import numpy as np

    gaps = []
    for g, r in zip(got, ref):
        g, r = np.asarray(g, dtype=np.float64), np.asarray(r, dtype=np.float64)
        if g.shape != r.shape:
            return math.inf
        gaps.append(float(np.max(np.abs(g - r))) if g.size else 0.0)
    return max(gaps) if gaps else math.inf


def _finite(x: Any) -> bool:
    import numpy as np

    try:
        return bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64))))
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- checks
def check_scoring(gen: Any) -> dict[str, Any]:
    """``score``, ``score_orderings`` and ``run_orderings`` against the plain full forward."""
    import numpy as np

    from ragkit.debias.designs import cyclic
    from ragkit.generation.handle import cache_ok
    from ragkit.types import Passage

    model, tok = gen.model, gen.tokenizer
    out: dict[str, Any] = {"template": gen.template.name, "prefix_reuse": bool(cache_ok(gen.handle))}
    # score: several prompts of different lengths in one padded batch, two answers each
    prompts, answers = [], []
    for q, ps, a in QUESTIONS:
        passages = [Passage(str(i), t) for i, t in enumerate(ps)]
        for ans in (a, "no"):
            prompts.append(gen.build_prompt(q, passages))
            answers.append(ans)
    prompts.append(gen.build_prompt(QUESTIONS[1][0], []))
    answers.append("Paris, France")
    res = gen.score(prompts, answers)
    p_ids, a_ids = gen.encode_answers(prompts, answers)
    ref = [reference_logprobs(model, p, a) for p, a in zip(p_ids, a_ids)]
    naive = [naive_head_logprobs(model, p, a) for p, a in zip(p_ids, a_ids)]
    out["score_gap"] = _max_gap(res.token_logprobs, ref)
    out["naive_head_gap"] = _max_gap(naive, ref)
    out["ref_mean_logprob"] = float(np.mean(np.concatenate(ref)))
    out["ref_min_logprob"] = float(np.min(np.concatenate(ref)))
    out["answer_tokens"] = int(sum(len(a) for a in a_ids))
    # the joint encoding is the tokenizer's own tokenisation of prompt + answer, and the answer
    # span decodes to the answer (no spurious leading "▁" token of a Metaspace tokenizer)
    tok_ok = True
    for p, a, pi, ai in zip(prompts, answers, p_ids, a_ids):
        text = gen._answer_text(p, a, 0)
        joint = tok(p + text, add_special_tokens=not (tok.bos_token and p.startswith(tok.bos_token)))["input_ids"]
        eos = tok.eos_token_id
        joint = [t for t in joint if t != eos] if joint and joint[-1] == eos else list(joint)
        dec = tok.decode(ai, skip_special_tokens=True)
        if list(pi) + list(ai) != list(joint) or dec.strip() != a.strip() or not ai:
            tok_ok = False
    out["answer_tokens_ok"] = tok_ok
    # score_orderings / run_orderings: every cyclic ordering of k = 3 passages
    qs = [q for q, _, _ in QUESTIONS]
    pss = [[Passage(str(i), t) for i, t in enumerate(ps)] for _, ps, _ in QUESTIONS]
    golds = [a for _, _, a in QUESTIONS]
    orders = [cyclic(len(ps)) + [[0, 2]] for ps in pss]
    so = gen.score_orderings(qs, pss, orders, golds)
    got, want = [], []
    for q in range(len(qs)):
        full = [gen.build_prompt(qs[q], [pss[q][i] for i in o]) for o in orders[q]]
        fp, fa = gen.encode_answers(full, [golds[q]] * len(full))
        want += [reference_logprobs(model, p, a) for p, a in zip(fp, fa)]
        got += list(so[q].token_logprobs)
    out["score_orderings_gap"] = _max_gap(got, want)
    runs = gen.run_orderings(qs, pss, orders, candidates=lambda q, ans: [golds[q], ans], max_new_tokens=4)
    got_run = [lp for q in range(len(qs)) for lp in runs[q].scores[0].token_logprobs]
    out["run_orderings_gap"] = _max_gap(got_run, want)
    # the second round scores each ordering's own greedy answer: through the decode step's log-probs
    own_got, own_want = [], []
    for q in range(len(qs)):
        full = [gen.build_prompt(qs[q], [pss[q][i] for i in o]) for o in orders[q]]
        for m, cand in enumerate(runs[q].candidates[1]):
            if cand.strip():
                fp, fa = gen.encode_answers([full[m]], [cand])
                own_want.append(reference_logprobs(model, fp[0], fa[0]))
                own_got.append(runs[q].scores[1].token_logprobs[m])
    out["run_orderings_own_gap"] = _max_gap(own_got, own_want) if own_got else 0.0
    return out


def check_moi(gen: Any) -> dict[str, Any]:
    """MoI with three designs / outcomes on k = 3 passages: finite utilities and outcomes."""
    from ragkit.debias import MoI, MoIReranker, PositionProfile
    from ragkit.types import Passage

    qs = [q for q, _, _ in QUESTIONS]
    pss = [[Passage(str(i), t) for i, t in enumerate(ps)] for _, ps, _ in QUESTIONS]
    golds = [[a] for _, _, a in QUESTIONS]
    out: dict[str, Any] = {}
    setups = {
        # permutation designs need a non-flat profile to separate passages (flat: every ordering
        # holds the same passages with equal weights)
        "cyclic/consensus": dict(design="cyclic", outcome="consensus", profile=PositionProfile.recency(3)),
        "prior/gold": dict(design="prior", budget=2, outcome="gold", profile=PositionProfile.recency(3)),
        "loo/confidence": dict(design="loo", outcome="confidence", profile=PositionProfile.flat(3)),
    }
    ok = True
    for name, kw in setups.items():
        moi = MoI.from_settings(gen, max_new_tokens=4, seed=0, **kw)
        res = moi.run_batch(qs, pss, answers_list=golds if kw["outcome"] == "gold" else None, generate_answer=True)
        fin = all(_finite(r.utilities) and _finite(r.outcomes) and sorted(r.order) == [0, 1, 2]
                  and (r.raw_utilities is None or _finite(r.raw_utilities)) for r in res)
        out[name] = {"finite": fin, "fallback": [bool(r.fallback) for r in res],
                     "raw_utilities": [None if r.raw_utilities is None
                                       else [round(float(u), 4) for u in r.raw_utilities] for r in res],
                     "outcomes_range": [round(float(r.outcomes.max() - r.outcomes.min()), 4) for r in res]}
        ok = ok and fin
    # the reranker a user builds first: default profile (none cached for this model: flat, with a
    # warning; nothing is calibrated or written), retriever scores as the ridge prior
    rr = MoIReranker(gen, design="prior", budget=2, max_new_tokens=4)
    ranked = rr.rank_many(qs, pss, scores=[[3.0, 2.0, 1.0]] * len(qs))
    fin = all(len(r.hits) == 3 and _finite([h.score for h in r.hits]) for r in ranked)
    out["MoIReranker prior/consensus"] = {"finite": fin, "profile": str(rr.profile_for(3).meta.get("kind", "?"))}
    ok = ok and fin
    out["ok"] = ok
    return out


def check_cord(gen: Any, tmp: str) -> dict[str, Any]:
    """``CORDTrainer.compute_loss`` on one collated batch per loss; retriever rows vs ``score``."""
    import torch

    from ragkit.training.cord import CORDCollator, CORDConfig, CORDTrainer, answer_logprobs
    from ragkit.training.data import CORDDataset, Example
    from ragkit.types import Passage

    examples = [Example(id=f"q{i}", question=q, passages=tuple(Passage(str(j), t) for j, t in enumerate(ps)),
                        answer=a, scores=(3.0, 2.0, 1.0)) for i, (q, ps, a) in enumerate(QUESTIONS)]
    model = gen.model
    out: dict[str, Any] = {}
    ok = True
    for loss in ("cord", "consistency", "shuffle"):
        cfg = CORDConfig(output_dir=os.path.join(tmp, f"cord-{loss}"), loss=loss, report_to=[], max_steps=1,
                         per_device_train_batch_size=len(examples), use_cpu=True, disable_tqdm=True)
        coll = CORDCollator(gen, loss=loss, perturbation=cfg.perturbation(), seed=0)
        trainer = CORDTrainer(model=model, args=cfg, train_dataset=CORDDataset(examples), data_collator=coll,
                              processing_class=gen.tokenizer)
        batch = coll(examples)
        model.zero_grad(set_to_none=True)
        model.train()
        try:
            value = trainer.compute_loss(model, batch)
            value.backward()
        finally:
            model.eval()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        gnorm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))) if grads else math.nan
        model.zero_grad(set_to_none=True)
        fin = _finite(float(value.detach())) and _finite(gnorm) and gnorm > 0
        out[loss] = {"loss": round(float(value.detach()), 6), "grad_norm": round(gnorm, 6), "finite": fin}
        ok = ok and fin
        if loss == "cord":  # rows 0..B-1 are the retriever order: their answer log-probs are Generator.score's
            with torch.inference_mode():
                lp = answer_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["answer_pos"])
            b = len(examples)
            tgt, mask = batch["answer_ids"], batch["answer_mask"]
            got = [lp[i].gather(-1, tgt[i][:, None])[:, 0][mask[i]].double().numpy() for i in range(b)]
            prompts = [gen.build_prompt(ex.question, list(ex.passages)) for ex in examples]
            ref = gen.score(prompts, [ex.answer for ex in examples]).token_logprobs
            out["cord_vs_score"] = _max_gap(got, ref)
    out["ok"] = ok
    return out


def check_psgrpo(gen: Any, tmp: str, g: int = 2) -> dict[str, Any]:
    """PS-GRPO prompts, tokenisation, sampled rollouts, the group similarity reward and TRL's log-probs."""
    from ragkit.generation.fitting import encode_prompts
    from ragkit.paraphrase import ParaphraseSet
    from ragkit.training.psgrpo import ParaphraseSetReward, build_grpo_dataset
    from ragkit.types import Passage

    sets = []
    for i, (q, ps, a) in enumerate(QUESTIONS[:2]):
        passages = tuple(Passage(str(j), t) for j, t in enumerate(ps))
        paras = (f"Tell me: {q[0].lower()}{q[1:]}", f"{q[:-1]}, please?")
        sets.append(ParaphraseSet(set_id=f"s{i}", original=q, paraphrases=paras, answers=(a,),
                                  passages=(passages,) * 3))
    ds = build_grpo_dataset(sets, gen)
    prompts = list(ds["prompt"])
    ids = encode_prompts(gen.tokenizer, prompts)  # what PSGRPOTrainer._tokenize_prompts returns
    bos = gen.tokenizer.bos_token_id
    one_bos = all(sum(1 for t in x[:2] if t == bos) <= 1 for x in ids) if bos is not None else True
    outs = gen.generate(prompts, max_new_tokens=6, temperature=1.0, n=g, seed=0)
    completions, set_id, member, answers, rep_prompts = [], [], [], [], []
    for row, comps in enumerate(outs):
        for c in comps:
            completions.append(c)
            set_id.append(ds[row]["set_id"])
            member.append(ds[row]["member"])
            answers.append(ds[row]["answers"])
            rep_prompts.append(prompts[row])
    out: dict[str, Any] = {"single_bos": one_bos}
    ok = one_bos
    for name, kw in {"exact": dict(kappa=None), "approx": dict(kappa=1, s=1)}.items():
        reward = ParaphraseSetReward(sim="bleu2", seed=0, **kw)
        r = reward(rep_prompts, completions, set_id=set_id, member=member, answers=answers)
        fin = len(r) == len(completions) and _finite(r)
        out[name] = {"mean_reward": round(float(sum(r) / len(r)), 6), "finite": fin}
        ok = ok and fin
    out["trl_logp_gap"] = _trl_logp_gap(gen, ds, completions[:: g], tmp)
    out["ok"] = ok
    return out


def _trl_logp_gap(gen: Any, ds: Any, completions: Sequence[str], tmp: str, temperature: float = 0.7) -> float:
    """``max |TRL policy log-prob - reference|`` of completions after the PS-GRPO prompts.

    The model is saved and loaded back (TRL builds the frozen reference from the folder), a
    :class:`PSGRPOTrainer` is built, and its ``_get_per_token_logps_and_entropies`` (the log-probs
    of the GRPO objective, at the rollout temperature) runs on left-padded prompt + completion rows
    whose prompts the trainer tokenised; the reference is the plain full forward with the logits
    divided by the temperature.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from ragkit.training.psgrpo import ParaphraseSetReward, PSGRPOConfig, make_trainer

    folder = os.path.join(tmp, "psgrpo-model")
    gen.model.save_pretrained(folder)
    gen.tokenizer.save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).float().eval()
    tok = gen.tokenizer
    n = len(ds) // len(set(ds["set_id"]))
    cfg = PSGRPOConfig(output_dir=os.path.join(tmp, "psgrpo-out"), paraphrases=n, num_generations=2, report_to=[],
                       use_cpu=True, max_completion_length=6, temperature=temperature, disable_tqdm=True)
    trainer = make_trainer(model, tok, ds, cfg, ParaphraseSetReward())
    prompts = list(ds["prompt"])
    p_ids, _, _ = trainer._tokenize_prompts(prompts)
    comps = [tok(c if c.strip() else " no", add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
             for c in completions]
    wp, wc = max(len(p) for p in p_ids), max(len(c) for c in comps)
    ids = torch.full((len(prompts), wp + wc), int(tok.pad_token_id), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, (p, c) in enumerate(zip(p_ids, comps)):
        ids[r, wp - len(p):wp] = torch.tensor(p)
        ids[r, wp:wp + len(c)] = torch.tensor(c)
        mask[r, wp - len(p):wp + len(c)] = 1
    with torch.inference_mode():
        lp = trainer._get_per_token_logps_and_entropies(model, ids, mask, wc)[0].double()
        gaps = []
        for r, (p, c) in enumerate(zip(p_ids, comps)):
            x = torch.tensor([list(p) + list(c)])
            lsm = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0].double() / temperature, dim=-1)
            ref = lsm[torch.arange(len(p) - 1, len(p) - 1 + len(c)), torch.tensor(c)]
            gaps.append(float((lp[r, :len(c)] - ref).abs().max()))
    return max(gaps)


# ----------------------------------------------------------------------------- driver
def run_arch(name: str, seed: int = 0, tol: float = TOL, tmp: str | None = None) -> dict[str, Any]:
    """Every check for one architecture; a failure is recorded in the row, never raised."""
    from ragkit.generation import Generator

    t0 = time.perf_counter()
    row: dict[str, Any] = {"arch": name, "config": ARCHS[name].config_class, "tokenizer": ARCHS[name].tokenizer}
    steps: list[tuple[str, Callable[[Any], dict[str, Any]]]] = []
    try:
        tok = build_tokenizer(ARCHS[name].tokenizer)
        model = build_model(name, tok, seed=seed)
        row["params"] = int(sum(p.numel() for p in model.parameters()))
        gen = Generator.from_components(model, tok, name=f"model-zoo/tiny-{name}", batch_size=4, show_progress=False)
    except Exception as e:  # noqa: BLE001 - recorded in the row
        row.update(error=f"build: {type(e).__name__}: {e}", passed=False, seconds=time.perf_counter() - t0)
        return row
    with tempfile.TemporaryDirectory(prefix="model-zoo-") as d:
        steps = [("scoring", check_scoring), ("moi", check_moi),
                 ("cord", lambda gen_: check_cord(gen_, tmp or d)),
                 ("psgrpo", lambda gen_: check_psgrpo(gen_, tmp or d))]
        errors = []
        for key, fn in steps:
            t1 = time.perf_counter()
            try:
                row[key] = fn(gen)
                row[key]["seconds"] = round(time.perf_counter() - t1, 2)
            except Exception as e:  # noqa: BLE001 - recorded in the row
                logging.getLogger(__name__).debug("%s/%s failed", name, key, exc_info=True)
                row[key] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                            "trace": traceback.format_exc(limit=-3)}
                errors.append(key)
    sc = row.get("scoring", {})
    gaps = [sc.get(k, math.inf) for k in ("score_gap", "score_orderings_gap", "run_orderings_gap",
                                          "run_orderings_own_gap")]
    gaps.append(row.get("cord", {}).get("cord_vs_score", math.inf))
    gaps.append(row.get("psgrpo", {}).get("trl_logp_gap", math.inf))
    row["max_gap"] = max(gaps)
    row["passed"] = bool(not errors and row["max_gap"] < tol and sc.get("answer_tokens_ok")
                         and all(row[k].get("ok") for k in ("moi", "cord", "psgrpo")))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def run_zoo(archs: Sequence[str], seed: int = 0, tol: float = TOL, show: bool = True) -> list[dict[str, Any]]:
    """Rows of :func:`run_arch` for ``archs`` (printed as they finish when ``show``)."""
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        raise ValueError(f"unknown architecture(s) {unknown}; choose from {sorted(ARCHS)}")
    rows = []
    for a in archs:
        row = run_arch(a, seed=seed, tol=tol)
        rows.append(row)
        if show:
            print(format_row(row), flush=True)
    return rows


HEADER = (f"{'arch':<11}{'tok':<5}{'tmpl':<6}{'reuse':<6}{'score':>9}{'orders':>9}{'run_ord':>9}{'cord/sc':>9}"
          f"{'trl':>9}{'naive':>9}{'ref_lp':>8}  {'MoI':<4}{'CORD':<5}{'GRPO':<5}{'pass':<5}{'s':>6}")


def _fmt(x: Any) -> str:
    return f"{x:9.1e}" if isinstance(x, float) and math.isfinite(x) else f"{'-':>9}"


def format_row(row: dict[str, Any]) -> str:
    """One line of the results table."""
    if "error" in row:
        return f"{row['arch']:<11}ERROR {row['error']}"
    sc = row.get("scoring", {})
    flag = {True: "ok", False: "FAIL", None: "-"}
    return (f"{row['arch']:<11}{row['tokenizer']:<5}{sc.get('template', '-'):<6}"
            f"{({True: 'yes', False: 'no'}).get(sc.get('prefix_reuse'), '-'):<6}"
            f"{_fmt(sc.get('score_gap'))}{_fmt(sc.get('score_orderings_gap'))}{_fmt(sc.get('run_orderings_gap'))}"
            f"{_fmt(row.get('cord', {}).get('cord_vs_score'))}{_fmt(row.get('psgrpo', {}).get('trl_logp_gap'))}"
            f"{_fmt(sc.get('naive_head_gap'))}"
            f"{sc.get('ref_mean_logprob', math.nan):8.2f}  "
            f"{flag[row['moi'].get('ok')]:<4}{flag[row['cord'].get('ok')]:<5}{flag[row['psgrpo'].get('ok')]:<5}"
            f"{'PASS' if row['passed'] else 'FAIL':<5}{row['seconds']:6.1f}")


def _json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``None`` (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def machine_info() -> dict[str, Any]:
    """The harness's machine info plus the tokenizers, ragkit and TRL versions."""
    import tokenizers

    import ragkit
    from ragkit.eval.harness import machine_info as base_info

    info = {**base_info("cpu"), "tokenizers": tokenizers.__version__, "ragkit": getattr(ragkit, "__version__", "?")}
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:  # pragma: no cover
        info["trl"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    from ragkit.eval.harness import gpu_epilog

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=gpu_epilog("benchmarks/model_zoo.py", None, note=(
                                     "GPU / hub model: not applicable. The zoo builds tiny random models offline (no "
                                     "download) and runs on CPU by design\n(the CORD and TRL checks use use_cpu=True): "
                                     "it checks ragkit's log-probs per architecture against a plain forward.\nA hub "
                                     "model on a GPU (cuda) is exercised by the MoI, CORD and PS-GRPO benchmarks' "
                                     "--model/--device; see benchmarks/README.md.")))
    ap.add_argument("--out", required=True, help="JSON file to write (atomically)")
    ap.add_argument("--archs", nargs="+", default=list(ARCHS), help=f"architectures (default: all of {list(ARCHS)})")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--tol", type=float, default=TOL, help="largest allowed log-prob gap")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: tiny models run fastest single-threaded on a shared machine)")
    args = ap.parse_args(argv)

    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from ragkit.eval.harness import write_result

    logging.basicConfig(level=logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    print(HEADER)
    rows = run_zoo(args.archs, seed=args.seed, tol=args.tol)
    n_pass = sum(r["passed"] for r in rows)
    print(f"{n_pass}/{len(rows)} architectures pass (tolerance {args.tol:g}); "
          "score/orders/run_ord/cord-sc/trl = max |ragkit (TRL for PS-GRPO) - full forward| log-prob; "
          "naive = by-hand LM head gap")
    write_result(args.out, _json_safe({
        "benchmark": "model_zoo",
        "what": "max |ragkit log-prob - plain full forward + log_softmax| per architecture (tiny random models), "
                "and whether MoI, CORD's loss and the PS-GRPO reward run with finite numbers",
        "command": "python benchmarks/model_zoo.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "tolerance": args.tol,
        "seed": args.seed,
        "machine": machine_info(),
        "seconds": round(time.perf_counter() - t0, 1),
        "passed": n_pass == len(rows),
        "rows": rows,
    }))
    return 0 if n_pass == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
