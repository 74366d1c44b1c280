"""experiments/generators/generators.py: the generator choice on tiny real models and real HotpotQA records."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench(load_bench) -> ModuleType:
    return load_bench("generators")


def test_slot_orderings_move_the_gold_block_and_keep_the_distractors_in_order(bench: ModuleType) -> None:
    ids = list("abcdefghij")
    labels, orders = bench.slot_orderings(ids, {"c", "h"}, 10)
    assert labels == ["1-2", "3-4", "5-6", "7-8", "9-10"]
    for lab, order in zip(labels, orders):
        assert sorted(order) == list(range(10))
        s = int(lab.split("-")[0]) - 1
        assert order[s:s + 2] == [2, 7]
        assert [i for i in order if i not in (2, 7)] == [0, 1, 3, 4, 5, 6, 8, 9]
    assert bench.slot_orderings(ids, {"zz"}, 10) == ([], [])


def test_missing_candidate_names_the_fetch_command(bench: ModuleType, tmp_path: Path) -> None:
    spec = dataclasses.replace(bench.KNOWN["qwen05"], path=str(tmp_path / "absent.gguf"))
    with pytest.raises(FileNotFoundError, match="get_qwen05.sh"):
        spec.check()
    spec = dataclasses.replace(bench.KNOWN["gemma270m"], path=str(tmp_path / "absent.gguf"))
    with pytest.raises(FileNotFoundError, match="--fetch gemma270m"):
        spec.check()


def test_run_scores_match_plain_scoring_and_resume_skips_done_work(
    bench: ModuleType, tiny_lm_dir: Path, hotpot_dev_records: list[dict], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")

    from ragkit.datasets import load_dataset
    from ragkit.generation import Generator

    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in hotpot_dev_records[:3]), encoding="utf-8")
    out = tmp_path / "gen.json"
    threads = torch.get_num_threads()
    args = ["--out", str(out), "--models", str(tiny_lm_dir), "--data-file", str(data), "--questions", "3",
            "--batch-questions", "2", "--passage-max-tokens", "8", "--max-new-tokens", "4", "--threads", "1",
            "--n-boot", "50"]
    try:
        assert bench.main(args) == 0
        res = json.loads(out.read_text(encoding="utf-8"))
        entry = res["models"][str(tiny_lm_dir)]
        assert len(entry["per_question"]) == 3
        s = entry["summary"]
        curve = np.array(list(s["slot_curve"].values()))
        assert list(s["slot_curve"]) == ["1-2", "3-4", "5-6", "7-8", "9-10"]
        assert s["slot_gap"] == pytest.approx(curve.max() - curve.min())
        assert res["gap_bootstrap"]["gap"][str(tiny_lm_dir)]["value"] == pytest.approx(s["slot_gap"])

        # every stored log-prob equals a plain Generator.score of the full prompt
        gen = Generator(str(tiny_lm_dir), device="cpu", passage_max_tokens=8, show_progress=False)
        recs = load_dataset("hotpotqa", str(data), limit=3)
        for r in recs:
            row = entry["per_question"][r.id]
            ps = list(r.passages[:10])
            given = gen.score([gen.build_prompt(r.question, ps)], [r.answers[0]]).mean[0]
            assert row["gold_logprob"] == pytest.approx(given, abs=1e-4)
            _, orders = bench.slot_orderings([p.id for p in ps], set(r.gold_ids), 10)
            plain = gen.score([gen.build_prompt(r.question, [ps[i] for i in o]) for o in orders],
                              [r.answers[0]] * len(orders)).mean
            np.testing.assert_allclose(row["slot_logprob"], plain, atol=1e-4)

        # resume: a question dropped from the JSON is the only one measured again
        dropped = recs[1].id
        kept = {q: v for q, v in entry["per_question"].items() if q != dropped}
        entry["per_question"] = kept
        out.write_text(json.dumps(res), encoding="utf-8")
        assert bench.main(args) == 0
        again = json.loads(out.read_text(encoding="utf-8"))["models"][str(tiny_lm_dir)]["per_question"]
        assert set(again) == {r.id for r in recs}
        for q, v in kept.items():
            assert again[q]["seconds_answer"] == v["seconds_answer"]  # not re-run

        # fewer questions than done: the table covers the first two, nothing is re-run or dropped
        assert args[6:8] == ["--questions", "3"]
        assert bench.main([*args[:7], "2", *args[8:]]) == 0
        res2 = json.loads(out.read_text(encoding="utf-8"))
        e2 = res2["models"][str(tiny_lm_dir)]
        assert e2["summary"]["n"] == 2 and res2["gap_bootstrap"]["n_questions"] == 2
        assert e2["per_question"] == again
    finally:
        torch.set_num_threads(threads)
