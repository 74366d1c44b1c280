"""Intervals and tests for comparing methods on the same questions.

* :func:`bootstrap_ci`: the mean of per-question values with its percentile-bootstrap interval
  (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13): ``B`` resamples of the
  ``n`` values with replacement; the interval is the ``alpha/2`` and ``1 - alpha/2`` quantiles of
  the resampled means.
* :func:`paired_ci`: the same for the per-question differences ``d_i = x_i - y_i`` of two methods
  on the same questions (a paired bootstrap, ch. 16: resampling questions keeps the pairs).
* :func:`paired_p_value`: the two-sided bootstrap p-value of ``mean(d) = 0``.
* :func:`holm`: Holm's step-down adjustment of several p-values (Holm, *Scand. J. Statist.* 6, 1979),
  which controls the family-wise error rate when one table compares many methods.
* :func:`gap_bootstrap`: the paired bootstrap of a position sweep's best-minus-worst slot gap.

Every function takes a seed; the same seed gives the same interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_ci", "contrast_family", "gap_bootstrap", "holm", "paired_ci", "paired_p_value",
           "seed_question_bootstrap"]


def _boot_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """Means of ``n_boot`` resamples of ``x`` with replacement (``numpy.random.default_rng(seed)``)."""
    rng = np.random.default_rng(seed)
    return x[rng.integers(0, x.size, size=(max(1, n_boot), x.size))].mean(axis=1)


def bootstrap_ci(values: Sequence[float | None], n_bootstrap: int = 1000, seed: int = 0,
                 alpha: float = 0.05) -> dict[str, float]:
    """Mean with a percentile-bootstrap ``1 - alpha`` interval; ``None`` and NaN values are left out.

    Returns
    -------
    dict
        ``{"mean", "lo", "hi", "n"}``; NaN bounds and ``n = 0`` when no value is left.
    """
    x = np.asarray([v for v in values if v is not None and not np.isnan(v)], dtype=float)
    if x.size == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0}
    means = _boot_means(x, n_bootstrap, seed)
    return {"mean": float(x.mean()), "lo": float(np.quantile(means, alpha / 2)),
            "hi": float(np.quantile(means, 1 - alpha / 2)), "n": int(x.size)}


def paired_ci(x: Sequence[float], y: Sequence[float], seed: int = 0, n_boot: int = 2000) -> list[float]:
    """``[mean(x - y), low, high]``: the mean paired difference and its 95% percentile-bootstrap interval.

    ``x[i]`` and ``y[i]`` are two methods' scores on question ``i``; NaN bounds when there is no pair.

    Raises
    ------
    ValueError
        When ``x`` and ``y`` differ in length (the pairs would not be the same questions).
    """
    if len(x) != len(y):
        raise ValueError(f"paired_ci needs one value per question from each method; got {len(x)} and {len(y)}")
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    if d.size == 0:
        return [float("nan")] * 3
    boots = _boot_means(d, n_boot, seed)
    return [float(d.mean()), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]


def paired_p_value(x: Sequence[float], y: Sequence[float], seed: int = 0, n_boot: int = 2000) -> float:
    """Two-sided bootstrap p-value of "the mean paired difference is 0".

    The differences are centred (``d_i - mean(d)``, the null's distribution), resampled ``n_boot``
    times, and ``p = (1 + #{|mean*| >= |mean(d)|}) / (1 + n_boot)`` (Efron & Tibshirani, 1993,
    ch. 16.4; the ``+1`` keeps ``p > 0``). 1.0 when every difference is 0 or there is none.
    """
    if len(x) != len(y):
        raise ValueError(f"paired_p_value needs one value per question from each method; got {len(x)} and {len(y)}")
    d = np.asarray(x, dtype=float) - np.asarray(y, dtype=float)
    if d.size == 0 or not np.any(d):
        return 1.0
    obs = abs(float(d.mean()))
    boots = _boot_means(d - d.mean(), n_boot, seed)
    return float((1 + np.count_nonzero(np.abs(boots) >= obs - 1e-12)) / (1 + boots.size))


def holm(p_values: Sequence[float] | Mapping[str, float]) -> Any:
    """Holm's step-down adjusted p-values, in the input's order (a mapping gives a mapping).

    Sort the ``m`` p-values ascending, ``p_(1) <= ... <= p_(m)``; the adjusted value of the ``i``-th
    is ``max_{j <= i} min(1, (m - j + 1) p_(j))``. Rejecting where the adjusted value is below
    ``alpha`` keeps the chance of any false rejection among the ``m`` at most ``alpha``.
    """
    if isinstance(p_values, Mapping):
        keys = list(p_values)
        return dict(zip(keys, holm([p_values[k] for k in keys])))
    p = [float(v) for v in p_values]
    bad = [v for v in p if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"p-values must lie in [0, 1]; got {bad}")
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def _gap(m: np.ndarray) -> np.ndarray:
    """Best-minus-worst slot of the per-slot means; ``m`` is ``(..., questions, slots)``."""
    means = m.mean(axis=-2)
    return means.max(axis=-1) - means.min(axis=-1)


def gap_bootstrap(sweeps: Mapping[str, Mapping[str, Any]], n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Paired bootstrap over questions of each model's slot gap and of every pairwise gap difference.

    ``sweeps[name]["per_question_slot_logprob"]`` maps a question id to its per-slot scores. The gap
    is the best-minus-worst slot of the per-slot means; the same resampled question sets serve every
    model, so the differences are paired. Returns point values and 95% percentile intervals:
    ``{"n_questions", "n_boot", "gap": {name: {"value", "ci95"}}, "gap_difference": {"b - a": ...}}``
    (``{}`` when no sweep has per-question scores).
    """
    names = [n for n, sw in sweeps.items() if sw.get("per_question_slot_logprob")]
    if not names:
        return {}
    qids = sorted(set.intersection(*(set(sweeps[n]["per_question_slot_logprob"]) for n in names)))
    mats = {n: np.array([sweeps[n]["per_question_slot_logprob"][q] for q in qids]) for n in names}
    idx = np.random.default_rng(seed).integers(0, len(qids), size=(n_boot, len(qids)))
    boot = {n: _gap(m[idx]) for n, m in mats.items()}

    def _ci(point: float, draws: np.ndarray) -> dict[str, float]:
        lo, hi = np.percentile(draws, [2.5, 97.5])
        return {"value": float(point), "ci95": [float(lo), float(hi)]}

    out: dict[str, Any] = {"n_questions": len(qids), "n_boot": n_boot,
                           "gap": {n: _ci(float(_gap(mats[n])), boot[n]) for n in names}, "gap_difference": {}}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out["gap_difference"][f"{b} - {a}"] = _ci(float(_gap(mats[b]) - _gap(mats[a])), boot[b] - boot[a])
    return out


def seed_question_bootstrap(a: Mapping[Any, Sequence[float]], b: Mapping[Any, Sequence[float]] | None = None,
                            n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                            levels: Mapping[str, float] | None = None) -> dict[str, float]:
    """Mean of an arm (or the paired difference of two arms) with an interval over seeds AND questions.

    ``a[s][i]`` is arm A's score on question ``i`` when trained with seed ``s`` (every seed scores
    the same questions in the same order); ``b`` likewise for arm B (a base model is one "seed").
    The statistic is ``mean_s mean_i a[s][i] − mean_s mean_i b[s][i]``. Each of the ``n_boot``
    resamples draws each arm's seeds with replacement and, independently, one set of question
    indices shared by both arms (a two-level, paired bootstrap: Davison & Hinkley, 1997, §3.8), so
    the interval carries training noise as well as question noise; with one seed per arm it is the
    ordinary paired bootstrap over questions.

    ``levels`` names further ``alpha`` values read off the SAME resamples, e.g.
    ``{"bonferroni": 0.05 / m}`` for simultaneous intervals over ``m`` contrasts: each adds
    ``lo_<name>`` and ``hi_<name>``, so the intervals of one call are nested and cost one bootstrap.

    Returns
    -------
    dict
        ``{"mean", "lo", "hi", "p", "n_questions", "n_seeds_a", "n_seeds_b"}``: the point value, the
        percentile ``1 − alpha`` interval, and the two-sided bootstrap p-value of "no difference"
        (``2 · min(P*(stat ≤ 0), P*(stat ≥ 0))``, at least ``1 / (n_boot + 1)``), the input of
        :func:`holm`; with ``lo_<name>``/``hi_<name>`` for each of ``levels``.

    Raises
    ------
    ValueError
        No seed, seeds that score different numbers of questions, or a level outside (0, 1).
    """
    def _matrix(arm: Mapping[Any, Sequence[float]], name: str) -> np.ndarray:
        if not arm:
            raise ValueError(f"arm {name} has no seed")
        m = [np.asarray(v, dtype=float) for v in arm.values()]
        if len({x.size for x in m}) != 1:
            raise ValueError(f"arm {name}: every seed must score the same questions; got sizes {[x.size for x in m]}")
        return np.stack(m)

    ma = _matrix(a, "a")
    mb = _matrix(b, "b") if b is not None else None
    if mb is not None and mb.shape[1] != ma.shape[1]:
        raise ValueError(f"the arms score different numbers of questions ({ma.shape[1]} and {mb.shape[1]})")
    rng = np.random.default_rng(seed)
    n_q = ma.shape[1]
    q_idx = rng.integers(0, n_q, size=(n_boot, n_q))
    sa = rng.integers(0, ma.shape[0], size=(n_boot, ma.shape[0]))
    boots = np.array([ma[sa[r]][:, q_idx[r]].mean() for r in range(n_boot)])
    point = float(ma.mean())
    if mb is not None:
        sb = rng.integers(0, mb.shape[0], size=(n_boot, mb.shape[0]))
        boots = boots - np.array([mb[sb[r]][:, q_idx[r]].mean() for r in range(n_boot)])
        point -= float(mb.mean())
    p = 2.0 * min(np.mean(boots <= 0), np.mean(boots >= 0))
    out = {"mean": point, "lo": float(np.quantile(boots, alpha / 2)), "hi": float(np.quantile(boots, 1 - alpha / 2)),
           "p": float(min(1.0, max(p, 1.0 / (n_boot + 1)))), "n_questions": int(n_q),
           "n_seeds_a": int(ma.shape[0]), "n_seeds_b": int(mb.shape[0]) if mb is not None else 0}
    for name, lvl in (levels or {}).items():
        if not 0.0 < lvl < 1.0:
            raise ValueError(f"levels[{name!r}] = {lvl}: an alpha must lie strictly between 0 and 1")
        out[f"lo_{name}"] = float(np.quantile(boots, lvl / 2))
        out[f"hi_{name}"] = float(np.quantile(boots, 1 - lvl / 2))
    return out


def contrast_family(pairs: Mapping[str, tuple[Mapping[Any, Sequence[float]], Mapping[Any, Sequence[float]]]],
                    n_boot: int = 2000, seed: int = 0, alpha: float = 0.05) -> dict[str, dict[str, float]]:
    """A family of paired contrasts, each with its :func:`seed_question_bootstrap` interval, corrected together.

    ``pairs[name] = (a, b)`` holds the two arms' per-seed, per-question scores. Every contrast gets
    its own ``1 − alpha`` interval (``lo``, ``hi``) and p-value, the Holm-adjusted p-value over the
    ``m`` contrasts (``p_holm``, :func:`holm`), and the Bonferroni-widened interval at ``1 − alpha/m``
    (``lo_bonferroni``, ``hi_bonferroni``, read off the same resamples): simultaneous coverage, so
    "the corrected interval is above 0" can be read off one contrast.
    """
    out = {n: seed_question_bootstrap(a, b, n_boot=n_boot, seed=seed, alpha=alpha,
                                      levels={"bonferroni": alpha / len(pairs)}) for n, (a, b) in pairs.items()}
    for n, p in holm({n: v["p"] for n, v in out.items()}).items():
        out[n]["p_holm"] = p
    return out
