"""A student run killed half-way resumes from its checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragkit.training.labels import LabelRecord

_WORDS = "river mountain castle music garden winter station harbor library village bridge forest".split()


def _labels(n: int, k: int = 4, seed: int = 0) -> list[LabelRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for qi in range(n):
        pos = int(rng.integers(k))
        texts = [" ".join(rng.choice(_WORDS, size=5)) + (" zebra" if j == pos else "") for j in range(k)]
        out.append(LabelRecord(qid=f"q{qi}", question="which " + " ".join(rng.choice(_WORDS, size=2)) + "?",
                               passage_ids=[f"p{j}" for j in range(k)], texts=texts, u=np.eye(k)[pos].tolist(),
                               answers=["x"], source="synthetic"))
    return out


class _Killed(Exception):
    pass


def _count_steps(monkeypatch: pytest.MonkeyPatch, kill_at: int | None = None) -> dict[str, int]:
    """Count optimiser steps (every recipe trains with torch's AdamW); raise in step ``kill_at``."""
    import torch

    calls = {"n": 0}
    real = torch.optim.AdamW.step

    def step(self, *a, **kw):
        calls["n"] += 1
        if kill_at is not None and calls["n"] == kill_at:
            raise _Killed
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return calls


def _trainer(recipe: str):
    from ragkit.training.bi_encoder import train_bi_encoder
    from ragkit.training.distill import train_residual_student, train_student

    return {"residual": train_residual_student, "cross-encoder": train_student, "bi-encoder": train_bi_encoder}[recipe]


@pytest.mark.parametrize("recipe", ["residual", "cross-encoder", "bi-encoder"])
def test_a_killed_student_run_resumes_and_ends_like_an_uninterrupted_one(
        recipe: str, tiny_encoder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels = _labels(12)
    train = _trainer(recipe)
    kw = dict(base_model=str(tiny_encoder_dir), epochs=1 if recipe == "bi-encoder" else 3, batch_size=4, lr=1e-3,
              max_length=32, device="cpu", show_progress=False, seed=0)
    with monkeypatch.context() as m:
        calls = _count_steps(m)
        whole = train(labels, None, **kw)
        total = calls["n"]
    assert total >= 8

    ck = tmp_path / "checkpoints"
    kill_at = total // 2 + 2  # steps 1 .. kill_at - 1 done; the last checkpoint is at an even step
    with monkeypatch.context() as m:
        _count_steps(m, kill_at=kill_at)
        with pytest.raises(_Killed):
            train(labels, tmp_path / "never", checkpoint_dir=ck, checkpoint_every=2, **kw)
    assert not (tmp_path / "never").exists()
    saved = (kill_at - 1) // 2 * 2
    assert (ck / f"checkpoint-{saved}").is_dir()

    out = tmp_path / "student"
    with monkeypatch.context() as m:
        calls = _count_steps(m)
        resumed = train(labels, out, checkpoint_dir=ck, checkpoint_every=2, **kw)
        assert calls["n"] == total - saved  # it went on from the checkpoint, not from step 0
    assert resumed.reranker.metadata["resumed_from_step"] == saved
    assert not ck.exists() and out.is_dir()  # the checkpoints are removed once the student is saved
    assert len(resumed.loss_history) == len(whole.loss_history)
    np.testing.assert_allclose(resumed.loss_history, whole.loss_history, rtol=1e-4, atol=1e-5)
    qs, ps = [lab.question for lab in labels[:3]], [lab.passages() for lab in labels[:3]]
    if recipe == "bi-encoder":
        a, b = whole.reranker.scores(qs, ps), resumed.reranker.scores(qs, ps)
    else:
        a, b = ([r.scores() for r in s.reranker.rank_many(qs, ps)] for s in (whole, resumed))
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_a_checkpoint_of_other_settings_is_refused(tiny_encoder_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ragkit.training.checkpoint import CheckpointError
    from ragkit.training.distill import train_residual_student

    labels = _labels(8)
    kw = dict(base_model=str(tiny_encoder_dir), epochs=2, batch_size=2, max_length=32, device="cpu",
              show_progress=False)
    ck = tmp_path / "checkpoints"
    with monkeypatch.context() as m:
        _count_steps(m, kill_at=4)
        with pytest.raises(_Killed):
            train_residual_student(labels, None, lr=1e-3, checkpoint_dir=ck, checkpoint_every=2, **kw)
    with pytest.raises(CheckpointError, match="lr"):
        train_residual_student(labels, None, lr=3e-4, checkpoint_dir=ck, checkpoint_every=2, **kw)
    with pytest.raises(CheckpointError, match="labels"):
        train_residual_student(_labels(8, seed=1), None, lr=1e-3, checkpoint_dir=ck, checkpoint_every=2, **kw)
