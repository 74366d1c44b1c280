"""experiments/moi_lab/placement.py: re-placing a moi_quality run's stored rankings, with a tiny real model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_summary_pairs_each_placement_with_the_stored_answers(load_bench) -> None:
    pl = load_bench("placement")

    def row(fb: bool, none: float, stored: float, ranked: float) -> dict:
        m = lambda v: {"em": v, "f1": v, "rouge_l": None, "rouge_l_official": None}  # noqa: E731
        return {"fallback": fb, "retriever": m(none), "stored": m(stored), "placements": {"none": m(ranked)}}

    s = pl.summarise([row(True, 1.0, 0.0, 1.0), row(False, 0.0, 0.5, 1.0), row(False, 0.5, 0.5, 0.0)], ["none"])
    assert s["all"]["n"] == 3 and s["fallback"]["n"] == 1 and s["reranked"]["n"] == 2
    assert s["all"]["retriever"]["f1"] == pytest.approx(0.5)  # the stored answers of the retriever order
    ranked = {g: s[g]["placements"]["none"] for g in s}  # the placement "none" (best first)
    assert ranked["all"]["f1"] == pytest.approx(2 / 3)
    assert ranked["all"]["minus_retriever"]["f1"][0] == pytest.approx((0.0 + 1.0 - 0.5) / 3)
    assert ranked["reranked"]["minus_stored"]["f1"][0] == pytest.approx((0.5 - 0.5) / 2)
    assert ranked["fallback"]["minus_stored"]["em"][0] == pytest.approx(1.0)
    assert "rouge_l" not in ranked["all"]  # not measured on HotpotQA


@pytest.mark.usefixtures("shared_data")  # the script reads ../shared/data
def test_bias_aware_reproduces_the_stored_moi_answers(load_bench, tiny_lm_dir: Path, tmp_path: Path) -> None:
    """The run's own placement, re-answered, gives the answers moi_quality stored: the script answers
    exactly as the method does, so another placement's difference is the placement's."""
    mq, pl = load_bench("moi_quality"), load_bench("placement")
    run = tmp_path / "run.json"
    assert mq.main(["--model", str(tiny_lm_dir), "--device", "cpu", "--limit", "2", "--methods", "none,moi_loo_q",
                    "--passage-tokens", "12", "--max-new-tokens", "4", "--out", str(run)]) == 0
    out = tmp_path / "placement.json"
    assert pl.main(["--run", str(run), "--model", str(tiny_lm_dir), "--device", "cpu",
                    "--placements", "bias_aware,none,reverse", "--chunk", "1", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    stored = {r["id"]: r["methods"]["moi_loo_q"]["answer"] for r in json.loads(run.read_text())["per_question"]}
    assert got["questions_done"] == 2
    for r in got["per_question"]:
        assert r["placements"]["bias_aware"]["answer"] == stored[r["id"]] == r["stored"]["answer"]
    assert got["summary"]["all"]["placements"]["bias_aware"]["minus_stored"]["f1"][0] == 0.0
    with pytest.raises(SystemExit, match="not SmolLM2|pass the run's --model"):
        pl.main(["--run", str(run), "--out", str(tmp_path / "other.json")])  # another generator than the run's
