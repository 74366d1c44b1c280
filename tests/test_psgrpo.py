"""PS-GRPO on TRL's GRPOTrainer: set-preserving sampler, set-keyed reward, tiny end-to-end run."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from ragkit.datasets import sample_records
from ragkit.paraphrase import RuleParaphraser, build_paraphrase_sets
from ragkit.training.psgrpo import (
    ParaphraseSetReward,
    ParaphraseSetSampler,
    PSGRPOSettings,
    clean_completion,
    make_grpo_config,
    select_passages,
)


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
    assert rw.last["consistency"] == pytest.approx(np.mean(r))


def test_clean_completion_and_select_passages() -> None:
    assert clean_completion("  Answer: \"Paris\" \nQuestion: x") == "Paris"
    assert clean_completion("Paris Question: next") == "Paris"
    rec = sample_records(1)[0]
    ps = select_passages(rec, 3)
    assert len(ps) == 3 and set(rec.gold_ids) <= {p.id for p in ps}
    assert [p.id for p in ps] == [p.id for p in rec.passages if p.id in {q.id for q in ps}]


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="g >= 2"):
        PSGRPOSettings(g=1).validate()
    with pytest.raises(ValueError, match="n >= 2"):
        PSGRPOSettings(n=1).validate()


def test_grpo_config_is_explicit(tmp_path) -> None:
    """The settings reach TRL's config; gradient checkpointing follows the device unless set."""
    import torch

    cfg = make_grpo_config(tmp_path, PSGRPOSettings(n=3, g=2, beta=0.1, epsilon=0.3, max_steps=7))
    assert (cfg.per_device_train_batch_size, cfg.num_generations, cfg.max_steps) == (6, 2, 7)
    assert (cfg.beta, cfg.epsilon, cfg.epsilon_high) == (0.1, 0.3, 0.3)
    assert cfg.gradient_checkpointing is torch.cuda.is_available()  # default: on with CUDA only
    forced = PSGRPOSettings(gradient_checkpointing=not torch.cuda.is_available())
    assert make_grpo_config(tmp_path, forced).gradient_checkpointing is (not torch.cuda.is_available())


def test_tiny_model_trains_end_to_end(tiny_lm_dir, tmp_path) -> None:
    """Real GRPOTrainer, beta > 0 (reference model rebuilt from the folder on disk), CPU."""
    pytest.importorskip("trl")
    from ragkit.training.psgrpo import train_psgrpo

    def char_jaccard(hyps, refs):  # dense signal for a random model (BLEU-2 would be all zeros)
        return np.array([len(set(h) & set(r)) / max(len(set(h) | set(r)), 1) for h, r in zip(hyps, refs)])

    sets = build_paraphrase_sets(sample_records(3), RuleParaphraser(seed=0), n=1)
    st = PSGRPOSettings(n=2, g=2, max_steps=2, beta=0.1, epsilon=0.2, kappa=3, max_completion_length=6,
                        learning_rate=1e-2, save_steps=1000, reward=char_jaccard, gold_weight=0.0)
    out = tmp_path / "run"
    summary = train_psgrpo([s for s in sets], str(tiny_lm_dir), out, st, passage_max_tokens=8)
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


def test_cli_parses_and_rejects_bad_input(tmp_path) -> None:
    from ragkit.cli import build_parser

    p = build_parser()
    args = p.parse_args(["train", "psgrpo", "--data-file", "x.jsonl", "--model", "m", "--paraphrases", "3",
                         "--generations", "2", "--output-dir", str(tmp_path), "--max-steps", "1", "--beta", "0.1",
                         "--epsilon", "0.3", "--kappa", "2", "--reward", "rougel", "--gold-weight", "0.25",
                         "--lr", "1e-5", "--resume"])
    assert (args.paraphrases, args.generations, args.beta, args.epsilon, args.kappa, args.reward,
            args.gold_weight, args.lr, args.resume) == (3, 2, 0.1, 0.3, 2, "rougel", 0.25, 1e-5, True)
    with pytest.raises(FileNotFoundError):
        args.func(args)
    args.paraphrases = 1
    with pytest.raises(ValueError, match="paraphrases"):
        args.func(args)


def test_load_training_records_formats(tmp_path) -> None:
    from ragkit.training.psgrpo import load_training_records

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
