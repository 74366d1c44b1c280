"""experiments/distill/distill_recipes.py: recipes chosen on held-out train labels, with hand-computed references."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from ragkit.training.labels import LabelRecord, write_labels

_WORDS = "river mountain castle history music science garden winter station harbor library village".split()


def _labels(n: int, k: int) -> list[LabelRecord]:
    """The passage holding 'zebra' is the gold one and the teacher's best; the others tie below it."""
    rng = np.random.default_rng(0)
    out = []
    for qi in range(n):
        texts = [" ".join(rng.choice(_WORDS, size=5)) for _ in range(k)]
        pos = qi % k
        texts[pos] += " zebra"
        u = [1.0 if j == pos else 0.0 for j in range(k)]
        out.append(LabelRecord(qid=f"q{qi}", question="which zebra?", passage_ids=[f"p{j}" for j in range(k)],
                               texts=texts, u=u, answers=["x"], gold_ids=[f"p{pos}"], source="synthetic"))
    return out


@pytest.fixture(scope="module")
def bench(load_bench) -> ModuleType:
    return load_bench("distill_recipes")


def test_recipes_on_held_out_train_labels_and_resume(bench: ModuleType, tiny_encoder_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    labels = tmp_path / "labels.jsonl"
    write_labels(labels, _labels(12, 4))
    out = tmp_path / "r.json"
    common = ["--labels", str(labels), "--holdout", "4", "--base-model", str(tiny_encoder_dir), "--out", str(out)]
    assert bench.main([*common, "--recipes", "ranknet:1e-3:1"]) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    assert res["config"]["holdout"] == 4 and res["config"]["num_labels"] == 12
    # the teacher's label ranking puts the gold first; a random order of 4 with one gold: (1 + 1/2 + 1/3 + 1/4) / 4
    assert res["reference"]["teacher"]["mrr@10"] == 1.0
    assert res["reference"]["random"]["mrr@10"] == pytest.approx(25 / 48, abs=0.03)
    r = res["recipes"]["ranknet:0.001:1"]
    assert len(r["per_question"]["mrr@10"]) == 4
    assert 0.25 <= r["mrr@10"] <= 1.0 and -1.0 <= r["spearman_u"] <= 1.0
    first_seconds = r["train_seconds"]

    # a second run keeps the finished recipe and trains only the new one
    assert bench.main([*common, "--recipes", "ranknet:1e-3:1,listnet:1e-3:1", "--save-dir", str(tmp_path / "s")]) == 0
    res2 = json.loads(out.read_text(encoding="utf-8"))
    assert set(res2["recipes"]) == {"ranknet:0.001:1", "listnet:0.001:1"}
    assert res2["recipes"]["ranknet:0.001:1"]["train_seconds"] == first_seconds
    # the saved student loads back and ranks like the run's numbers say
    from ragkit.debias.student import DistilledReranker

    saved = DistilledReranker.load(res2["recipes"]["listnet:0.001:1"]["student_dir"], device="cpu")
    held = _labels(12, 4)[-4:]
    again = bench.heldout_scores(held, saved.rank_many([x.question for x in held], [x.passages() for x in held]))
    assert again["mrr@10"] == pytest.approx(res2["recipes"]["listnet:0.001:1"]["per_question"]["mrr@10"])


def test_a_bad_recipe_is_named(bench: ModuleType, tmp_path: Path) -> None:
    labels = tmp_path / "labels.jsonl"
    write_labels(labels, _labels(6, 3))
    with pytest.raises(SystemExit):
        bench.main(["--labels", str(labels), "--recipes", "hinge:1e-4:3", "--out", str(tmp_path / "r.json")])
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        bench.parse_recipe("hinge:1e-4:3")
    with pytest.raises(ValueError, match="LOSS:LR:EPOCHS"):
        bench.parse_recipe("ranknet:1e-4")
