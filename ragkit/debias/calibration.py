"""Scores users can threshold: Platt scaling of a reranker's raw score into a probability of relevance.

A reranker's raw score is on its own scale: a cross-encoder's logit, MoI's utility (a change in
log-likelihood), an LLM's yes/no log-odds. Only the last is a probability the model states
(``sigmoid(s)``); for the others ``sigmoid(s)`` is a number in [0, 1] that no threshold means
the same for. Platt scaling (Platt, "Probabilistic Outputs for Support Vector Machines and
Comparisons to Regularized Likelihood Methods", 1999) fits

``P(relevant | s) = sigmoid(a s + b)``

by maximum likelihood on labelled (score, relevant) pairs, with Platt's smoothed targets
``t+ = (N+ + 1) / (N+ + 2)`` and ``t- = 1 / (N- + 2)`` (no infinite weights on separable data),
by Newton's method. The fit is stored beside the model as ``ragkit_calibration.json`` and
``ragkit serve`` then reports ``relevance_score = sigmoid(a s + b)``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CALIBRATION_FILE", "PlattCalibration"]

CALIBRATION_FILE = "ragkit_calibration.json"
_FORMAT = "ragkit-platt/1"


@dataclass(frozen=True)
class PlattCalibration:
    """``P(relevant | s) = sigmoid(a s + b)`` (see the module docstring).

    Attributes
    ----------
    a, b
        Slope and offset.
    pairs, positives
        Labelled pairs and relevant pairs it was fitted on.
    reranker
        The reranker whose raw scores it maps (a name, for the record).
    """

    a: float
    b: float
    pairs: int = 0
    positives: int = 0
    reranker: str = ""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ValueError(f"a Platt calibration needs finite a and b, got {self.a}, {self.b}")

    def __call__(self, raw: float | np.ndarray) -> Any:
        """The calibrated probability of each raw score."""
        z = self.a * np.asarray(raw, dtype=np.float64) + self.b
        p = np.where(z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z))))
        return float(p) if np.ndim(p) == 0 else p

    @classmethod
    def fit(cls, scores: Sequence[float], labels: Sequence[bool | int], reranker: str = "",
            max_iter: int = 100) -> PlattCalibration:
        """Fit ``a, b`` on raw ``scores`` and 0/1 ``labels`` (Newton's method on the smoothed log-loss)."""
        s = np.asarray(scores, dtype=np.float64)
        y = np.asarray(labels, dtype=np.float64)
        if s.shape != y.shape or s.ndim != 1 or s.size < 2:
            raise ValueError(f"fit needs as many scores as labels (at least 2), got {s.shape} and {y.shape}")
        if not np.isfinite(s).all():
            raise ValueError("a score to calibrate is not a finite number")
        n_pos = int(y.sum())
        n_neg = int(s.size - n_pos)
        if n_pos == 0 or n_neg == 0:
            raise ValueError(f"fit needs relevant and non-relevant pairs, got {n_pos} and {n_neg}")
        t = np.where(y > 0.5, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
        a, b = 0.0, math.log((n_neg + 1.0) / (n_pos + 1.0)) * -1.0
        for _ in range(max_iter):
            p = 1.0 / (1.0 + np.exp(-(a * s + b)))
            g = np.array([np.sum((p - t) * s), np.sum(p - t)])
            w = p * (1 - p) + 1e-12
            h = np.array([[np.sum(w * s * s), np.sum(w * s)], [np.sum(w * s), np.sum(w)]]) + 1e-9 * np.eye(2)
            step = np.linalg.solve(h, g)
            a, b = a - step[0], b - step[1]
            if np.abs(step).max() < 1e-10:
                break
        return cls(float(a), float(b), int(s.size), n_pos, reranker)

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write ``ragkit_calibration.json`` into ``folder`` (a model folder), atomically."""
        from ragkit.io import write_json

        path = Path(folder) / CALIBRATION_FILE
        write_json(path, {"format": _FORMAT, **asdict(self)})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PlattCalibration:
        """Read a calibration file (or the ``ragkit_calibration.json`` of a model folder)."""
        p = Path(path)
        if p.is_dir():
            p = p / CALIBRATION_FILE
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"no calibration file {p}; fit one with PlattCalibration.fit(...).save(folder)") \
                from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not valid JSON ({e.msg}); fit the calibration again") from None
        if not isinstance(raw, dict) or raw.get("format") != _FORMAT:
            raise ValueError(f"{p} is not a ragkit Platt calibration (format {_FORMAT!r})")
        try:
            return cls(float(raw["a"]), float(raw["b"]), int(raw.get("pairs", 0)), int(raw.get("positives", 0)),
                       str(raw.get("reranker", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{p}: a calibration needs numbers a and b ({e})") from None

    @classmethod
    def find(cls, folder: str | os.PathLike[str] | None) -> PlattCalibration | None:
        """The calibration stored in a model folder, or ``None`` when it has none."""
        if folder is None or not (Path(folder) / CALIBRATION_FILE).is_file():
            return None
        return cls.load(folder)
