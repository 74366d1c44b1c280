"""The studies' rankings and answers on a smoke config are pinned: moving or refactoring a study must
not change what it computes.

``smoke_expected.json`` was written by the studies before they moved out of ``benchmarks/`` (same
inputs as below: the first 3 HotpotQA dev/train records, the embedded SmolLM2 for the answering
studies, the tiny random Llama of ``conftest.build_tiny_lm`` for the scoring ones). Rankings and
answers must be identical; log-probs and utilities agree to 1e-4 (float32 on CPU). Each study runs
through its ``run(config)``, the settings by name, as a committed config would give them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

EXPECTED = json.loads(Path(__file__).with_name("smoke_expected.json").read_text(encoding="utf-8"))


def _close(got: Any, want: Any, where: str) -> None:
    """Strings, bools and ids equal; floats within 1e-4; lists and dicts element by element."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            _close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        same = isinstance(got, (int, float)) and (math.isclose(got, want, abs_tol=1e-4)
                                                  or (math.isnan(got) and math.isnan(want)))
        assert same, f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.fixture(scope="module")
def inputs(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The first 3 HotpotQA dev and train records, each in its own JSONL file."""
    tmp = tmp_path_factory.mktemp("smoke")
    out = {}
    for split in ("dev", "train"):
        with open(shared_data / "hotpotqa" / f"{split}.jsonl", encoding="utf-8") as f:
            lines = [line for _, line in zip(range(3), f)]
        out[split] = tmp / f"{split}.jsonl"
        out[split].write_text("".join(lines), encoding="utf-8")
    return out


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")


@pytest.mark.slow  # loads the embedded SmolLM2
def test_moi_lab_rankings_answers_and_placements(load_bench, inputs: dict[str, Path], tmp_path: Path) -> None:
    mq, pl = load_bench("moi_quality"), load_bench("placement")
    run = tmp_path / "mq.json"
    assert mq.run({"data": str(inputs["dev"]), "device": "cpu", "limit": 2, "methods": "none,reverse,voting,moi_loo_q",
                   "passage_tokens": 12, "max_new_tokens": 4, "out": str(run), "resume": False}) == 0
    got = {q["id"]: {m: {"ranking": v.get("ranking"), "answer": v.get("answer")} for m, v in q["methods"].items()}
           for q in json.loads(run.read_text(encoding="utf-8"))["per_question"]}
    _close(got, EXPECTED["moi_quality"], "moi_quality")
    out = tmp_path / "pl.json"
    assert pl.run({"run": str(run), "device": "cpu", "placements": "bias_aware,none,reverse", "chunk": 1,
                   "out": str(out)}) == 0
    got = {q["id"]: {p: v["answer"] for p, v in q["placements"].items()}
           for q in json.loads(out.read_text(encoding="utf-8"))["per_question"]}
    _close(got, EXPECTED["placement"], "placement")


ROW_KEYS = ("design", "outcome", "per_question_mrr", "per_question_utilities", "per_question_fallback")


def test_moi_designs_rankings(load_bench, inputs: dict[str, Path], tiny_lm_dir: Path, tmp_path: Path) -> None:
    md = load_bench("moi_designs")
    out = tmp_path / "md.json"
    assert md.run({"data": str(inputs["train"]), "limit": 2, "designs": "loo,cyclic", "outcomes": "gold,label_free",
                   "passage_max_tokens": 8, "max_new_tokens": 4, "model": str(tiny_lm_dir), "device": "cpu",
                   "out": str(out), "resume": False}) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    assert res["question_ids"] == EXPECTED["moi_designs"]["question_ids"]
    _close([{k: r.get(k) for k in ROW_KEYS} for r in res["rows"]],
           [{k: r.get(k) for k in ROW_KEYS} for r in EXPECTED["moi_designs"]["rows"]], "moi_designs")


def test_generator_choice_answers_and_slot_scores(load_bench, inputs: dict[str, Path], tiny_lm_dir: Path,
                                                  tmp_path: Path) -> None:
    g = load_bench("generators")
    out = tmp_path / "g.json"
    assert g.run({"out": str(out), "models": str(tiny_lm_dir), "data_file": str(inputs["dev"]), "questions": 3,
                  "batch_questions": 2, "passage_max_tokens": 8, "max_new_tokens": 4, "threads": 1, "n_boot": 50}) == 0
    per_q = json.loads(out.read_text(encoding="utf-8"))["models"][str(tiny_lm_dir)]["per_question"]
    keys = ("prediction", "gold", "gold_logprob", "slot_logprob", "em", "f1")
    _close({q: {k: v[k] for k in keys} for q, v in per_q.items()},
           {q: {k: v[k] for k in keys} for q, v in EXPECTED["generators"].items()}, "generators")


def test_question_orders_bm25(load_bench, inputs: dict[str, Path], tmp_path: Path) -> None:
    qo = load_bench("question_orders")
    out = tmp_path / "qo.json"
    assert qo.run({"data": str(inputs["dev"]), "out": str(out), "kinds": "bm25"}) == 0
    _close(json.loads(out.read_text(encoding="utf-8"))["orders"], EXPECTED["question_orders"], "question_orders")
