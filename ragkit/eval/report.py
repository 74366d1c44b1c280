"""Markdown rendering of evaluation, sweep and consistency reports (JSON: :func:`ragkit.io.write_json`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_ci", "markdown_table", "markdown_report", "paired_text", "text_table", "text_summary"]

TERMINAL_WIDTH = 100
"""Widest line a terminal summary prints; intervals and further columns stay in the JSON and markdown."""


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


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]], width: int = TERMINAL_WIDTH) -> str:
    """A plain table with aligned columns, cut to the columns that fit ``width`` (the first always stays).

    Dropped columns are named on a last line (``... also in the report: a, b``).
    """
    cols = [[str(h)] + [str(r[i]) for r in rows] for i, h in enumerate(header)]
    widths = [max(map(len, c)) for c in cols]
    keep, used = [0], widths[0]
    for i in range(1, len(cols)):
        if used + 2 + widths[i] <= width:
            keep.append(i)
            used += 2 + widths[i]
    lines = []
    for r in range(len(rows) + 1):
        cells = [cols[i][r].ljust(widths[i]) if i == 0 else cols[i][r].rjust(widths[i]) for i in keep]
        lines.append("  ".join(cells).rstrip())
    dropped = [str(header[i]) for i in range(len(header)) if i not in keep]
    if dropped:
        lines.append(f"(also in the report: {', '.join(dropped)})")
    return "\n".join(lines) + "\n"


def text_summary(report: Mapping[str, Any], width: int = TERMINAL_WIDTH) -> str:
    """The terminal summary of an evaluation report: means per method, then the paired differences.

    Every line fits ``width`` columns; the intervals of the means are in the JSON and markdown
    reports (:func:`markdown_report`), the paired differences keep theirs (they are the result).
    """
    import textwrap

    agg = report["aggregate"]
    names = list(report["metrics"])
    extra = [m for m in ("mrr@10", "recall@2") if any(m in v for v in agg.values())]
    # the cost ledger's prefill, when the run kept one: what a reranker costs beside its calls
    tokens = any((v.get("cost_per_question") or {}).get("tokens_prefilled") is not None for v in agg.values())
    header = ["method", *names, *extra, "calls/q", *(["tokens prefilled/q"] if tokens else []), "s/q", "n"]
    rows = [[method, *(format_ci((res.get(n) or {}).get("mean") if isinstance(res.get(n), Mapping)
                                 else res.get(n)) for n in names + extra),
             f"{res.get('generator_calls_per_question', 0.0):.1f}",
             *([f"{(res.get('cost_per_question') or {}).get('tokens_prefilled') or 0.0:.0f}"] if tokens else []),
             f"{res.get('seconds_per_question', 0.0):.2f}", str(res.get("questions", 0))]
            for method, res in agg.items()]
    out = text_table(header, rows, width)
    paired = report.get("paired") or {}
    if paired:
        out += "\nPaired differences, question by question (mean [95% bootstrap interval]):\n"
        for name, metrics in paired.items():
            items = [f"{metric} {format_ci(ci)}" for metric, ci in metrics.items()]
            out += textwrap.fill(f"{name}: " + ", ".join(items), width=width, subsequent_indent="    ",
                                 break_on_hyphens=False) + "\n"
    return out


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
    return head + markdown_table(header, rows) + paired_text(report) + headline_text(report)


def headline_text(report: Mapping[str, Any]) -> str:
    """The headline table of a report: each method minus the baseline, Holm-corrected across the table's rows."""
    h = report.get("headline") or {}
    rows = h.get("rows") or []
    if not rows:
        return ""
    body = [[r["contrast"], r["metric"], format_ci(r), format_ci({"mean": r["mean"], "lo": r.get("holm_lo"),
                                                                   "hi": r.get("holm_hi")}),
             f"{r['p']:.4f}", f"{r.get('p_holm', float('nan')):.4f}", "yes" if r.get("holds") else "no"]
            for r in rows]
    return (f"\nHeadline: each method minus {h['baseline']} (paired; Holm across the {h['family']} rows at "
            f"alpha {h['alpha']}):\n\n"
            + markdown_table(["contrast", "metric", "difference [95%]", "Holm interval", "p", "p (Holm)", "holds"],
                             body))


def paired_text(report: Mapping[str, Any]) -> str:
    """The paired differences of a report (each method minus the first), one line per method and metric."""
    paired = report.get("paired") or {}
    lines = [f"- {name}: " + ", ".join(f"{metric} {format_ci(ci)}" for metric, ci in metrics.items())
             for name, metrics in paired.items()]
    if not lines:
        return ""
    return ("\nPaired differences, question by question (mean [95% bootstrap interval]; "
            "an interval excluding 0 is a real difference on this sample):\n" + "\n".join(lines) + "\n")
