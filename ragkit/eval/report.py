"""Markdown rendering of evaluation, sweep and consistency reports (JSON: :func:`ragkit.io.write_json`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_ci", "markdown_table", "markdown_report", "paired_text"]


def format_ci(stat: Mapping[str, Any] | float | None, digits: int = 3) -> str:
    """``0.412 [0.350, 0.470]`` for a bootstrap dict, the number for a float, ``-`` for missing."""
    if stat is None:
        return "-"
    if isinstance(stat, Mapping):
        mean = stat.get("mean")
        if mean is None or (isinstance(mean, float) and math.isnan(mean)):
            return "-"
        lo, hi = stat.get("lo"), stat.get("hi")
        if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    if isinstance(stat, float) and math.isnan(stat):
        return "-"
    if isinstance(stat, (int, float)):
        return f"{stat:.{digits}f}" if isinstance(stat, float) else str(stat)
    return str(stat)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (cells are ``str()``-ed, ``|`` escaped)."""
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def eval_table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows (one per method) of an evaluation report's aggregate metrics."""
    agg = report["aggregate"]
    names = list(report["metrics"])
    ranking = report.get("ranking_metrics") or ("mrr@10", "recall@2")
    extra = [m for m in ranking if any(m in v for v in agg.values())]
    tokens = any((v.get("cost_per_question") or {}).get("tokens_prefilled") is not None for v in agg.values())
    # questions whose reranker kept the input order (MoI's fallback): shown when any did
    fb = any(res.get("fallbacks") for res in agg.values())
    header = ["method", *names, *extra, "gen. calls/q", *(["tokens prefilled/q"] if tokens else []), "s/q",
              *(["fell back"] if fb else []), "n"]
    rows = []
    for method, res in agg.items():
        cost = res.get("cost_per_question") or {}
        rows.append(
            [
                method,
                *(format_ci(res.get(n)) for n in names + extra),
                f"{res.get('generator_calls_per_question', 0.0):.1f}",
                *([f"{cost.get('tokens_prefilled') or 0.0:.0f}"] if tokens else []),
                f"{res.get('seconds_per_question', 0.0):.2f}",
                *([str(res.get("fallbacks", 0))] if fb else []),
                str(res.get("questions", 0)),
            ]
        )
    return header, rows


def markdown_report(report: Mapping[str, Any]) -> str:
    """Markdown summary of an evaluation report (``ragkit eval``)."""
    cfg = report["config"]
    src = cfg.get("data_file") or ("bundled HotpotQA sample" if cfg.get("sample") else "hub")
    head = (
        f"# ragkit eval: {report['dataset']}\n\n"
        f"- data: {src}, {report['n_questions']} questions, retriever `{cfg['retriever']}`, "
        f"{cfg.get('candidates') or cfg['k']} candidates, k = {cfg['k']} in the prompt\n"
        f"- generator: `{report['models']['generator']}`"
        + (f", passages cut to {cfg['passage_max_tokens']} tokens" if cfg.get("passage_max_tokens") else "")
        + "\n"
        f"- metrics: means with 95% bootstrap intervals ({cfg['n_bootstrap']} resamples, seed {cfg['seed']})\n"
        f"- wall time: {report['timing']['total_seconds']:.1f} s\n\n"
    )
    header, rows = eval_table(report)
    return head + markdown_table(header, rows) + paired_text(report)


def paired_text(report: Mapping[str, Any]) -> str:
    """The paired differences of a report (each method minus the first), one line per method and metric."""
    paired = report.get("paired") or {}
    lines = [f"- {name}: " + ", ".join(f"{metric} {format_ci(ci)}" for metric, ci in metrics.items())
             for name, metrics in paired.items()]
    if not lines:
        return ""
    return ("\nPaired differences, question by question (mean [95% bootstrap interval]; "
            "an interval excluding 0 is a real difference on this sample):\n" + "\n".join(lines) + "\n")
