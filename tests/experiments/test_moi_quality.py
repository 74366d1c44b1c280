"""experiments/moi_lab/moi_quality.py: the summary's paired differences, on hand-computed values."""

from __future__ import annotations

import pytest


def _row(qid: str, **mrr: float) -> dict:
    return {"id": qid, "methods": {m: {"mrr@10": v, "recall@2": v, "em": 0.0, "f1": v, "rouge_l": None,
                                       "generator_calls": 1, "seconds": 1.0} for m, v in mrr.items()}}


def test_moi_is_paired_against_every_baseline_on_the_questions_all_methods_finished(load_bench) -> None:
    mq = load_bench("moi_quality")
    rows = [_row("a", none=0.5, voting=0.5, moi_loo_q=1.0),
            _row("b", none=0.0, voting=1.0, moi_loo_q=1.0),
            _row("c", none=0.2, voting=0.2, moi_loo_q=0.2),
            _row("d", none=1.0, moi_loo_q=0.0)]  # voting missing: left out of every mean
    s = mq.summarise(rows, ["none", "voting", "moi_loo_q"])
    assert s["moi_loo_q"]["n"] == 3
    assert s["moi_loo_q"]["mrr@10_minus_none"][0] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    minus = s["moi_loo_q"]["minus"]
    assert set(minus) == {"voting"}  # none has its own keys; MoI is not paired with MoI
    assert minus["voting"]["mrr@10"][0] == pytest.approx((0.5 + 0.0 + 0.0) / 3)
    assert minus["voting"]["f1"][0] == pytest.approx(1 / 6)
    assert "rouge_l" not in minus["voting"]  # not measured on HotpotQA
    assert "minus" not in s["voting"]


def test_blend_table_from_stored_utilities(load_bench) -> None:
    """Retriever order (p0, p1, p2), gold p2. Utilities (0, 0, 3): z = (−0.707, −0.707, 1.414);
    prior z(ranks) = (1.225, 0, −1.225). β = 0: p2 first, MRR 1. β = 0.75: blended
    (0.742, −0.177, −0.565): p0, p1, p2, MRR 1/3. A question that fell back keeps the retriever
    order at every β (gold p0: MRR 1)."""
    mq = load_bench("moi_quality")
    ranking = ["p0", "p1", "p2"]
    rows = [
        {"id": "a", "gold_ids": ["p2"], "methods": {
            "none": {"mrr@10": 1 / 3, "ranking": ranking},
            "moi_loo_q": {"mrr@10": 1.0, "utilities": [0.0, 0.0, 3.0], "fallback": False}}},
        {"id": "b", "gold_ids": ["p0"], "methods": {
            "none": {"mrr@10": 1.0, "ranking": ranking},
            "moi_loo_q": {"mrr@10": 1.0, "utilities": [0.0, 0.0, 3.0], "fallback": True}}},
    ]
    out = mq.blend_tables(rows, ["none", "moi_loo_q"], [0.0, 0.75])
    table = {b["beta"]: b for b in out["moi_loo_q"]["table"]}
    assert out["moi_loo_q"]["n"] == 2
    assert table[0.0]["mrr@10"] == pytest.approx((1.0 + 1.0) / 2)
    assert table[0.75]["mrr@10"] == pytest.approx((1 / 3 + 1.0) / 2)
    assert table[0.0]["minus_order"][0] == pytest.approx((2 / 3 + 0.0) / 2)
    # without the fallback question b ranks by its utilities too: p2, then the tie p0, p1 in retriever
    # order, so gold p0 is second (MRR 1/2)
    assert out["moi_loo_q"]["fallback_rate"] == 0.5
    assert out["moi_loo_q"]["no_fallback"]["mrr@10"] == pytest.approx((1.0 + 1 / 2) / 2)
    assert out["moi_loo_q"]["no_fallback"]["beta"] == 0.0
    assert mq.blend_tables(rows, ["moi_loo_q"], [0.0]) == {}  # no retriever order to compare with


def test_answer_reach_strata(load_bench) -> None:
    mq = load_bench("moi_quality")
    full = ["Tinted Windows played their first show in Tulsa, Oklahoma."]
    assert mq.answer_reach(["Tulsa"], full, full) == "in_context"
    assert mq.answer_reach(["Tulsa"], full, ["Tinted Windows played their"]) == "cut_away"
    assert mq.answer_reach(["Boston"], full, full) == "absent"
    assert mq.answer_reach(["yes"], full, full) == "yes/no"
    assert mq.answer_reach(["the Tulsa"], ["TULSA!"], ["TULSA!"]) == "in_context"  # SQuAD normalisation


def test_summary_by_reach_means_per_stratum(load_bench) -> None:
    mq = load_bench("moi_quality")
    rows = [{**_row("a", none=0.5, moi_loo_gold=1.0), "answer_reach": "in_context"},
            {**_row("b", none=0.0, moi_loo_gold=0.5), "answer_reach": "in_context"},
            {**_row("c", none=1.0, moi_loo_gold=0.2), "answer_reach": "cut_away"},
            {**_row("d", none=1.0), "answer_reach": "cut_away"}]  # moi_loo_gold missing: left out
    s = mq.summarise_by_reach(rows, ["none", "moi_loo_gold"])
    assert set(s) == {"in_context", "cut_away"}
    assert s["in_context"]["n"] == 2 and s["cut_away"]["n"] == 1
    assert s["in_context"]["moi_loo_gold"]["mrr@10"] == pytest.approx(0.75)
    assert s["in_context"]["none"]["f1"] == pytest.approx(0.25)
    assert s["cut_away"]["moi_loo_gold"]["mrr@10"] == pytest.approx(0.2)


def test_msmarco_rouge_both_protocols_are_paired(load_bench) -> None:
    """MS MARCO rows carry rouge-score's ROUGE-L and the leaderboard's; both get means and paired
    differences against ``none`` and every baseline."""
    mq = load_bench("moi_quality")
    rows = []
    for qid, (base, moi, base_off, moi_off) in {"a": (0.2, 0.6, 0.1, 0.5), "b": (0.4, 0.4, 0.3, 0.6)}.items():
        row = _row(qid, none=0.0, voting=0.0, moi_loo_q=0.0)
        for m, (r, o) in {"none": (base, base_off), "voting": (base, base_off), "moi_loo_q": (moi, moi_off)}.items():
            row["methods"][m].update(rouge_l=r, rouge_l_official=o)
        rows.append(row)
    s = mq.summarise(rows, ["none", "voting", "moi_loo_q"])
    assert s["moi_loo_q"]["rouge_l_official"] == pytest.approx(0.55)
    assert s["moi_loo_q"]["rouge_l_minus_none"][0] == pytest.approx(0.2)
    assert s["moi_loo_q"]["rouge_l_official_minus_none"][0] == pytest.approx(0.35)
    assert s["moi_loo_q"]["minus"]["voting"]["rouge_l_official"][0] == pytest.approx(0.35)
