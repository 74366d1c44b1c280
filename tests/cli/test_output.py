"""Output that reads well: no progress bar for sub-second work, a bar that counts what is done."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragkit.cli import main


def test_small_index_prints_no_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    """A 5-passage BM25 index printed 3 bars (one read `tokenize 0/10000`); now only its result line."""
    monkeypatch.delenv("RAGKIT_NO_PROGRESS", raising=False)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"passage number {i} about topic {i}"}) + "\n"
                              for i in range(5)))
    assert main(["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx")]) == 0
    out = capsys.readouterr()
    assert "it/s" not in out.err and "%|" not in out.err, out.err
    assert "indexed 5 passages" in out.out + out.err


def test_progress_bar_is_delayed_and_counts_chunks(capsys: pytest.CaptureFixture) -> None:
    """ragkit's bars appear only after PROGRESS_DELAY_S; a bar updated by n shows n at once."""
    from ragkit.io import PROGRESS_DELAY_S, progress

    assert PROGRESS_DELAY_S >= 1
    for _ in progress(range(3), show=True, desc="quick"):
        pass
    assert "quick" not in capsys.readouterr().err
    bar = progress(iter(()), show=True, desc="eval", total=16, delay=0, smoothing=0.0)
    bar.update(8)  # one finished chunk
    bar.refresh()
    assert " 8/16" in capsys.readouterr().err
    bar.close()


def _report(metrics: list[str], methods: list[str]) -> dict:
    ci = {"mean": 0.123456, "lo": -0.1, "hi": 0.3}
    agg = {m: {**{n: ci for n in [*metrics, "mrr@10", "recall@2"]}, "generator_calls_per_question": 12.0,
               "seconds_per_question": 9.5, "questions": 100} for m in methods}
    paired = {f"{m} - {methods[0]}": {n: ci for n in metrics} for m in methods[1:]}
    return {"aggregate": agg, "metrics": metrics, "paired": paired}


def test_eval_summary_fits_100_columns() -> None:
    """The terminal summary fits 100 columns (the markdown table was up to 257); intervals stay in the JSON."""
    from ragkit.eval.report import text_summary

    many = ["rouge_l", "bleu1", "bleu2", "bleu3", "bleu4", "official_rouge_l", "official_bleu4", "em", "f1"]
    for metrics in (["em", "f1"], many):
        text = text_summary(_report(metrics, ["none", "moi_prior_consensus", "both_ends", "voting"]))
        assert max(map(len, text.splitlines())) <= 100, text
        assert "moi_prior_consensus" in text and "0.123" in text
    assert "also in the report:" in text_summary(_report(many, ["none", "moi"]))


def test_sweep_text_is_one_based_and_not_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from ragkit.cli.eval import _sweep_summary_text

    text = _sweep_summary_text({"10": {"subspan_em": {"worst_slot": 5, "worst": 0.05, "best_slot": 9, "best": 0.08,
                                                      "gap": 0.03}}})
    assert "best at position 10" in text and "worst at position 6" in text
    assert "{" not in text
    assert main(["eval", "sweep", "--data-file", str(tmp_path / "x.jsonl"), "-k", "3", "--slots", "0", "--quiet"]) == 1
    assert "positions are 1..3 for k=3" in capsys.readouterr().err
