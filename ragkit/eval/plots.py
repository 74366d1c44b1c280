"""PNG plots of evaluation results (matplotlib, Agg backend, written atomically)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragkit.io import save_figure

__all__ = ["plot_aggregate", "plot_curves"]


def _plt() -> Any:
    from ragkit.types import require_extra

    require_extra(["matplotlib"], "plotting")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_aggregate(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> list[str]:
    """One bar chart per metric (methods side by side, 95% intervals as error bars)."""
    plt = _plt()
    agg = report["aggregate"]
    ranking = report.get("ranking_metrics") or ("mrr@10", "recall@2")
    names = [m for m in [*report["metrics"], *ranking] if any(m in v for v in agg.values())]
    paths = []
    for name in names:
        methods = [m for m in agg if name in agg[m]]
        means = [agg[m][name]["mean"] for m in methods]
        lo = [max(0.0, agg[m][name]["mean"] - agg[m][name]["lo"]) for m in methods]
        hi = [max(0.0, agg[m][name]["hi"] - agg[m][name]["mean"]) for m in methods]
        fig, ax = plt.subplots(figsize=(max(3.0, 1.0 + 0.8 * len(methods)), 3.0))
        ax.bar(methods, means, yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_ylabel(name)
        ax.set_title(f"{report['dataset']}: {name}")
        safe = name.replace("@", "_at_")
        paths.append(save_figure(fig, Path(out_dir) / f"eval-{report['dataset']}-{safe}.png"))
    return paths


def plot_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | os.PathLike[str],
    xlabel: str,
    ylabel: str,
    title: str = "",
    hlines: Mapping[str, float] | None = None,
) -> str:
    """Line plot of ``{label: (x, y)}`` with optional horizontal reference lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for label, (x, y) in curves.items():
        ax.plot(list(x), list(y), marker="o", label=label)
    for i, (label, v) in enumerate((hlines or {}).items()):
        ax.axhline(v, linestyle="--", color=f"C{len(curves) + i}", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
