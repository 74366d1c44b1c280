"""Platt scaling of raw reranker scores: the fit recovers a known curve, is stored with the model and loads back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.debias.calibration import CALIBRATION_FILE, PlattCalibration


def test_fit_recovers_a_known_logistic_curve() -> None:
    rng = np.random.default_rng(0)
    s = rng.normal(0.0, 3.0, size=20_000)
    y = rng.random(s.size) < 1.0 / (1.0 + np.exp(-(0.7 * s - 1.2)))
    cal = PlattCalibration.fit(s, y, reranker="synthetic")
    assert cal.a == pytest.approx(0.7, abs=0.05) and cal.b == pytest.approx(-1.2, abs=0.08)
    assert (cal.pairs, cal.positives) == (20_000, int(y.sum()))
    # calibrated: among pairs scored near p, about p are relevant
    p = cal(s)
    for lo in (0.1, 0.4, 0.7):
        sel = (p >= lo) & (p < lo + 0.1)
        assert y[sel].mean() == pytest.approx(lo + 0.05, abs=0.04)
    assert cal(0.0) == pytest.approx(1 / (1 + np.exp(1.2)), abs=0.03)


def test_separable_data_stays_finite() -> None:
    cal = PlattCalibration.fit([-2.0, -1.0, 1.0, 2.0], [0, 0, 1, 1])
    assert np.isfinite([cal.a, cal.b]).all() and cal.a > 0
    assert cal(-2.0) > 0.0 and cal(2.0) < 1.0  # Platt's smoothed targets: never exactly 0 or 1
    with pytest.raises(ValueError, match="relevant and non-relevant"):
        PlattCalibration.fit([1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="as many scores as labels"):
        PlattCalibration.fit([1.0, 2.0, 3.0], [1, 0])


def test_stored_with_the_student(tiny_encoder_dir: Path, tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    student = DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0)
    assert student.calibration is None
    student.calibration = PlattCalibration.fit([-1.0, 0.0, 0.5, 2.0], [0, 0, 1, 1], reranker="student")
    folder = student.save_pretrained(tmp_path / "s")
    raw = json.loads((folder / CALIBRATION_FILE).read_text(encoding="utf-8"))
    assert raw["format"] == "ragkit-platt/1" and raw["a"] == student.calibration.a
    for loaded in (DistilledReranker.load(folder, device="cpu"),
                   DistilledReranker.from_pretrained(folder, device="cpu")):
        assert loaded.calibration == student.calibration
    (folder / CALIBRATION_FILE).write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        DistilledReranker.load(folder, device="cpu")
    with pytest.raises(FileNotFoundError, match="PlattCalibration.fit"):
        PlattCalibration.load(tmp_path / "nowhere.json")
