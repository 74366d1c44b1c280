"""benchmarks/moi_quality.py: the summary's paired differences, on hand-computed values."""

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
