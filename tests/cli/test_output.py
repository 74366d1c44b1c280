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
