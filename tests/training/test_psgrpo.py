"""PS-GRPO on TRL's GRPOTrainer: set-preserving sampler, set-keyed reward, tiny end-to-end run."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from ragkit.datasets import sample_records
from ragkit.paraphrase import RuleParaphraser, build_paraphrase_sets
from ragkit.text import extract_answer
from ragkit.training.psgrpo import (
    GRPO_OPTIONS,
    ParaphraseSetReward,
    ParaphraseSetSampler,
    PSGRPOConfig,
    build_training_sets,
    select_passages,
)

STOPS = ("\n", "Question:", "Passages:")


def _chunks(seq: list[int], size: int) -> list[list[int]]:
    return [seq[i:i + size] for i in range(0, len(seq), size)]


@pytest.mark.parametrize("sets_per_batch,repeat", [(1, 1), (2, 3)])
def test_sampler_never_splits_a_set(sets_per_batch: int, repeat: int) -> None:
    n, g, num_sets = 3, 4, 7
    set_rows = [[s * n + i for i in range(n)] for s in range(num_sets)]
    sampler = ParaphraseSetSampler(set_rows, g=g, sets_per_batch=sets_per_batch, repeat_count=repeat, seed=1)
    idx = list(sampler)
    assert len(idx) == len(sampler) == (num_sets // sets_per_batch) * sets_per_batch * n * g * repeat
    batch = sets_per_batch * n * g
    seen_sets: set[int] = set()
    for b in _chunks(idx, batch):
        sets_in_batch = Counter(r // n for r in b)
        # every set in a batch is complete: all n members, each exactly g times
        assert all(c == n * g for c in sets_in_batch.values())
        assert all(Counter(b)[r] == g for r in b)
        # each member's g rollouts are consecutive (TRL groups num_generations consecutive rewards)
        for grp in _chunks(b, g):
            assert len(set(grp)) == 1
        seen_sets |= set(sets_in_batch)
    assert len(seen_sets) == (num_sets // sets_per_batch) * sets_per_batch
    assert list(ParaphraseSetSampler(set_rows, g=g, sets_per_batch=sets_per_batch, repeat_count=repeat,
                                     seed=1)) == idx  # seeded


def test_sampler_from_dataset_requires_contiguous_sets() -> None:
    s = ParaphraseSetSampler.from_dataset({"set_id": ["a", "a", "b", "b"]}, g=2)
    assert s.set_rows == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="contiguous"):
        ParaphraseSetSampler.from_dataset({"set_id": ["a", "b", "a", "b"]}, g=2)


def test_reward_keyed_on_set_id() -> None:
    rw = ParaphraseSetReward(sim="bleu2", kappa=None, gold_weight=0.0)
    # two sets interleaved in the batch, n=2 members, g=2 rollouts
    comps = [" Paris\nmore", "Paris", "Paris", "Paris", "London", "London", "Rome", "London"]
    set_id = ["a", "a", "a", "a", "b", "b", "b", "b"]
    member = [0, 0, 1, 1, 0, 0, 1, 1]
    r = rw(prompts=[""] * 8, completions=comps, set_id=set_id, member=member, answers=[["Paris"]] * 8)
    assert r[:4] == [1.0, 1.0, 1.0, 1.0]
    assert r[4] == r[5] == 0.5 and r[6] == 0.0 and r[7] == 1.0
    rw_gold = ParaphraseSetReward(sim="bleu2", kappa=None, gold_weight=1.0)
    r2 = rw_gold(prompts=[""] * 8, completions=comps, set_id=set_id, member=member, answers=[["Paris"]] * 8)
    assert r2[0] == 2.0 and r2[4] == 0.5
    b = rw.score(comps, set_id, member, answers=[["Paris"]] * 8)
    assert b.rewards == r and b.consistency == pytest.approx(np.mean(r)) and b.incomplete == 0
    assert not hasattr(rw, "last")  # results are returned, not left on the reward
    # accuracy only: the group term is measured (for the log) but weighs nothing
    acc = ParaphraseSetReward(sim="bleu2", kappa=None, gold_weight=1.0, consistency_weight=0.0)
    b0 = acc.score(comps, set_id, member, answers=[["Paris"]] * 8)
    assert b0.rewards == [1.0] * 4 + [0.0] * 4 and b0.consistency == pytest.approx(np.mean(r))
    with pytest.raises(ValueError, match="both 0"):
        PSGRPOConfig(output_dir="x", gold_weight=0.0, consistency_weight=0.0)


def test_extract_answer_and_select_passages() -> None:
    assert extract_answer("  Answer: \"Paris\" \nQuestion: x", STOPS) == "Paris"
    assert extract_answer("Paris Question: next", STOPS) == "Paris"
    rec = sample_records(1)[0]
    ps = select_passages(rec, 3)
    assert len(ps) == 3 and set(rec.gold_ids) <= {p.id for p in ps}
    assert [p.id for p in ps] == [p.id for p in rec.passages if p.id in {q.id for q in ps}]


def test_settings_validation(tmp_path) -> None:
    with pytest.raises(ValueError, match="num_generations >= 2"):
        PSGRPOConfig(output_dir=str(tmp_path), num_generations=1)
    with pytest.raises(ValueError, match="paraphrases must be >= 2"):
        PSGRPOConfig(output_dir=str(tmp_path), paraphrases=1)
    with pytest.raises(ValueError, match="contradicts"):
        PSGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=5)
    with pytest.raises(ValueError, match="output_dir is required"):
        PSGRPOConfig()


def test_llm_training_paraphrases_are_screened(tmp_path) -> None:
    """A sampled rewrite the screen rejects (off topic here) is replaced by a rule rewrite."""
    from importlib.resources import files

    class OneAnswer:  # the rewriter: every sample the same off-topic line
        def generate(self, prompts, n=1, **_kw):
            return [["Tell me nothing at all?"] * n for _ in prompts]

    data = str(files("ragkit") / "data" / "hotpotqa_dev_sample.jsonl")
    cfg = PSGRPOConfig(output_dir=str(tmp_path), data_file=data, limit=2, paraphraser="llm", paraphrases=3)
    sets = build_training_sets(cfg, generator=OneAnswer())
    assert len(sets) == 2 and all(len(s) == 3 for s in sets)
    assert not any("Tell me nothing at all?" in s.paraphrases for s in sets)


def test_grpo_config_is_explicit(tmp_path) -> None:
    """Every GRPO option PS-GRPO relies on is set in the built config (not left to TRL's defaults);
    gradient checkpointing follows the device unless set."""
    import dataclasses

    from trl import GRPOConfig

    import ragkit.training.psgrpo as psgrpo

    cfg = PSGRPOConfig(output_dir=str(tmp_path), paraphrases=3, num_generations=2, beta=0.1, epsilon=0.3,
                       max_steps=7)
    assert (cfg.per_device_train_batch_size, cfg.num_generations, cfg.max_steps) == (6, 2, 7)
    assert (cfg.beta, cfg.epsilon, cfg.epsilon_high) == (0.1, 0.3, 0.3)
    assert cfg.steps_per_generation == cfg.gradient_accumulation_steps == 1
    assert cfg.generation_batch_size == 6
    assert cfg.gradient_checkpointing is True  # default on, CPU included (a 16-rollout step needs it in 24 GB)
    forced = PSGRPOConfig(output_dir=str(tmp_path), gradient_checkpointing=False)
    assert forced.gradient_checkpointing is False
    # the documented objective: plain k3 KL (no importance-ratio factor), per-sequence token mean, group scaling
    assert cfg.use_bias_correction_kl is False
    assert (cfg.loss_type, cfg.scale_rewards, cfg.importance_sampling_level) == ("grpo", "group", "token")
    for name, want in GRPO_OPTIONS.items():
        assert getattr(cfg, name) == want, name
    # each of them differs from, or is at least pinned against, TRL's own default
    trl_default = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert trl_default["use_bias_correction_kl"] is True and trl_default["loss_type"] != "grpo"
    defaults = PSGRPOConfig(output_dir=str(tmp_path))
    assert (defaults.beta, defaults.num_generations, defaults.epsilon, defaults.max_completion_length,
            defaults.learning_rate, defaults.bf16) == (0.04, 4, 0.2, 16, 1e-6, False)
    # the reward by default is the accuracy reward alone: the confirmation's rule turned the consistency term off
    assert (defaults.consistency_weight, defaults.gold_weight) == (0.0, 1.0)
    assert "use_bias_correction_kl=False" in psgrpo.__doc__ and "k3" in psgrpo.__doc__


def test_tiny_model_trains_end_to_end(tiny_lm_dir, tmp_path) -> None:
    """Real GRPOTrainer, beta > 0 (reference model rebuilt from the folder on disk), CPU."""
    import dataclasses

    pytest.importorskip("trl")
    from ragkit.training.psgrpo import train_psgrpo

    def char_jaccard(hyps, refs):  # dense signal for a random model (BLEU-2 would be all zeros)
        return np.array([len(set(h) & set(r)) / max(len(set(h) | set(r)), 1) for h, r in zip(hyps, refs)])

    sets = build_paraphrase_sets(sample_records(3), RuleParaphraser(seed=0), n=1)
    out = tmp_path / "run"
    cfg = PSGRPOConfig(output_dir=str(out), model=str(tiny_lm_dir), paraphrases=2, num_generations=2, max_steps=2,
                       beta=0.1, epsilon=0.2, kappa=3, max_completion_length=6, learning_rate=1e-2, save_steps=2,
                       gold_weight=0.0, consistency_weight=1.0, passage_max_tokens=8)
    summary = train_psgrpo([s for s in sets], cfg, similarity=char_jaccard)
    assert summary["steps"] == 2
    assert (out / "final" / "model.safetensors").exists()
    saved = json.loads((out / "psgrpo_summary.json").read_text())
    assert saved["steps"] == 2 and saved["reward_comparisons"] > 0
    hist = saved["history"]
    assert len(hist) == 2 and all("kl" in h for h in hist)
    # the trained weights differ from the initial ones
    from safetensors.numpy import load_file

    a = load_file(str(tiny_lm_dir / "model.safetensors"))
    b = load_file(str(out / "final" / "model.safetensors"))
    assert any(not np.allclose(a[k], b[k]) for k in a if k in b)
    # the final model stops at its own EOS again (training added the newline tokens)
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(out / "final").eos_token_id == \
        GenerationConfig.from_pretrained(tiny_lm_dir).eos_token_id
    # resume: other settings are refused (named), a finished run keeps its summary
    from ragkit.training.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"beta: 0.1 \(checkpoint\) vs 0.2 \(now\)"):
        train_psgrpo(sets, dataclasses.replace(cfg, beta=0.2, resume_from_checkpoint="last"), similarity=char_jaccard)
    again = train_psgrpo(sets, dataclasses.replace(cfg, resume_from_checkpoint="last"), similarity=char_jaccard)
    assert again["train_loss"] == saved["train_loss"] and again["steps"] == 2


def _bos_tokenizer_model(tmp_path):
    """A tiny Llama-style tokenizer that adds BOS (like Llama / Gemma / Mistral) with a chat template
    that writes BOS itself, and a tiny random Llama model over its vocabulary (built offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = sorted({w for r in sample_records(3) for w in (r.question + " " + " ".join(
        p.text for p in r.passages)).split()} | {"[user]", "[assistant]", "Answer", ":"})
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="</s>")
    tok.chat_template = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant] {% endif %}")
    import torch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         bos_token_id=1, eos_token_id=2, pad_token_id=2))
    return tok, model


def test_prompts_tokenise_like_evaluation_with_one_bos(tmp_path) -> None:
    """Issue 14.4: chat prompts already start with BOS; TRL's tokenizer call would add a second one on
    a BOS-adding tokenizer. Training must tokenise prompts exactly as evaluation (the Generator) does."""
    from ragkit.generation import Generator
    from ragkit.training.psgrpo import build_grpo_dataset, make_trainer

    tok, model = _bos_tokenizer_model(tmp_path)
    gen = Generator.from_components(model, tok, template="chat", passage_max_tokens=8, show_progress=False)
    sets = build_paraphrase_sets(sample_records(2), RuleParaphraser(seed=0), n=1)
    dataset = build_grpo_dataset(sets, gen)
    prompts = list(dataset["prompt"][:4])
    assert all(p.startswith("<s>") for p in prompts)
    assert tok(text=prompts)["input_ids"][0][:2] == [1, 1]  # the double BOS TRL's plain call would give
    cfg = PSGRPOConfig(output_dir=str(tmp_path / "run"), paraphrases=2, num_generations=2, beta=0.0, max_steps=1)
    reward = ParaphraseSetReward(sim="f1", kappa=None, gold_weight=0.0)
    trainer = make_trainer(model, tok, dataset, cfg, reward)
    ids, _, _ = trainer._tokenize_prompts(prompts)
    assert [list(x) for x in ids] == gen._encode_prompts(prompts)
    for x in ids:
        assert x[0] == tok.bos_token_id and x[1] != tok.bos_token_id
    # the very function evaluation's decoding tokenises its prompts with
    from ragkit.generation.fitting import encode_prompts

    assert [list(x) for x in ids] == encode_prompts(tok, prompts)


def test_cli_parses_and_rejects_bad_input(tmp_path) -> None:
    from ragkit.cli import build_parser

    p = build_parser()
    args = p.parse_args(["train", "psgrpo", "--data-file", "x.jsonl", "--model", "m", "--paraphrases", "3",
                         "--generations", "2", "--output-dir", str(tmp_path), "--max-steps", "1", "--beta", "0.1",
                         "--epsilon", "0.3", "--kappa", "2", "--reward", "rougel", "--gold-weight", "0.25",
                         "--lr", "1e-5", "--resume"])
    assert (args.paraphrases, args.num_generations, args.beta, args.epsilon, args.kappa, args.reward,
            args.gold_weight, args.learning_rate, args.resume_from_checkpoint) == \
        (3, 2, 0.1, 0.3, 2, "rougel", 0.25, 1e-5, "last")
    with pytest.raises(FileNotFoundError):
        args.func(args)
    args.paraphrases = 1
    with pytest.raises(ValueError, match="paraphrases"):
        args.func(args)


def test_load_records_reads_qa_paraphrase_sets_and_hotpotqa(tmp_path) -> None:
    """PS-GRPO reads its training file through the one record loader, ``ragkit.datasets.load_records``."""
    from ragkit.datasets import load_records as load_training_records

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": "1", "question": "Who?", "answers": ["Bob"],
                              "passages": [{"id": "p", "text": "Bob did."}]}) + "\n")
    recs = load_training_records(qa)
    assert recs[0].answers == ("Bob",) and recs[0].passages[0].id == "p"
    sets = build_paraphrase_sets(recs, RuleParaphraser(), n=2)
    ps = tmp_path / "sets.jsonl"
    ps.write_text("\n".join(json.dumps(s.to_dict()) for s in sets) + "\n")
    assert load_training_records(ps) == sets
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q": 1}) + "\n")
    with pytest.raises(ValueError, match="question"):
        load_training_records(bad)
    hp = tmp_path / "hotpot.jsonl"
    hp.write_text(json.dumps({"id": "h1", "question": "Q?", "answer": "A", "type": "bridge", "level": "easy",
                              "supporting_facts": {"title": ["T"], "sent_id": [0]},
                              "context": {"title": ["T", "U"], "sentences": [["a."], ["b."]]}}) + "\n")
    (rec,) = load_training_records(hp)
    assert rec.id == "h1" and rec.gold_ids == ("T",) and [p.id for p in rec.passages] == ["T", "U"]


def test_step_memory_estimate_and_early_refusal(tmp_path, monkeypatch, tiny_lm_dir) -> None:
    """A step that cannot fit the machine is refused before training, with its numbers and the fixes."""
    from transformers import AutoModelForCausalLM

    import ragkit.training.psgrpo as psgrpo

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm_dir))
    est = {c: psgrpo.estimate_step_memory(model, 16, 700, 16, c, lora=False, reference=True) for c in (False, True)}
    assert est[True]["activations"] < est[False]["activations"]
    longer = psgrpo.estimate_step_memory(model, 16, 1400, 16, False, lora=False, reference=True)
    assert longer["activations"] > 3 * est[False]["activations"]  # attention grows with the square of the length
    cfg = PSGRPOConfig(output_dir=str(tmp_path), gradient_checkpointing=False)
    monkeypatch.setattr(psgrpo, "_memory_budget", lambda device: (24.0, 20.0, "RAM"))
    psgrpo.check_step_memory({"activations": 5.0, "total": 6.0}, cfg, 700)  # fits: no error
    with pytest.raises(ValueError, match=r"needs about 30\.0 GB.*holds 24\.0 GB.*--passage_max_tokens.*"
                                         r"--gradient_checkpointing"):
        psgrpo.check_step_memory({"activations": 29.0, "total": 30.0}, cfg, 700)
    monkeypatch.setenv("RAGKIT_SKIP_MEMORY_CHECK", "1")
    psgrpo.check_step_memory({"activations": 29.0, "total": 30.0}, cfg, 700)
