"""The GPU kit's figures as the Markdown table of ``docs/gpu.md`` ("Figures"), from the JSON files of one run.

    python3 benchmarks/gpu/figures.py benchmarks/results        # after copying a GPU run's *-gpu.json there
    python3 benchmarks/gpu/figures.py /tmp/gpu-smoke --tag smoke

One row per figure: the measurement, its numbers, the target, the device, and whether the target
was met (or why the measurement did not run). Nothing is computed that the JSON does not hold.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.{digits}f}"
    return str(v)


def _met(targets: dict[str, Any], *keys: str) -> str:
    out = []
    for k in keys:
        t = targets.get(k)
        if t is not None:
            out.append({True: "met", False: "not met", None: "n/a"}[t["met"]])
    return "; ".join(out) or "-"


def rows(folder: Path, tag: str = "gpu") -> list[tuple[str, str, str, str, str]]:
    """``(measurement, figure, target, device, status)`` for every kit JSON in ``folder``."""
    out: list[tuple[str, str, str, str, str]] = []
    paths = sorted(folder.glob(f"*-{tag}.json"))
    if (folder / "summary.json").is_file():  # the run's order
        order = [r.get("file") for r in json.loads((folder / "summary.json").read_text()).get("measurements", [])]
        paths.sort(key=lambda p: order.index(p.name) if p.name in order else len(order))
    for path in paths:
        d = json.loads(path.read_text())
        if not str(d.get("benchmark", "")).startswith("gpu-kit/"):
            continue  # another benchmark's file in the same folder
        name, stem = d["benchmark"].split("/", 1)[1], path.name[: -len(f"-{tag}.json")]
        dev = d.get("gpu") or d.get("device") or "-"
        if d.get("status") in ("skipped", "error"):
            out.append((stem, "-", "-", dev, f"{d['status']}: {d.get('reason', '')}"[:200]))
            continue
        tg = d.get("targets") or {}
        if name in ("moi", "moi_qwen"):
            for key, r in d["results"].items():
                if "error" in r:
                    out.append((f"{stem}, k = {r['k']}", "-", "-", dev, r["error"]))
                    continue
                fig = (f"ragkit / bare {_f(r['ragkit_vs_bare_tokens_per_s'])}; vs naive "
                       f"{_f(r.get('ragkit_speedup_vs_naive'))}x; {_f(r['ragkit']['tokens_per_s'])} tokens/s "
                       f"({r['tokens_effective']:,} tokens, {r['ragkit']['tokens_prefilled']:,} prefilled); peak "
                       f"{_f(r['ragkit']['peak_gib'])} GiB")
                out.append((f"{stem}, k = {r['k']}", fig, ">= 0.9; >= 5x", dev,
                            _met(tg, f"{key}_ragkit_vs_bare", f"{key}_speedup_vs_naive")))
            sweep = d.get("batch_size_sweep", {}).get("rows") or {}
            if sweep:
                fig = ", ".join(f"{bs}: {_f(r.get('ragkit_tokens_per_s'))} / {_f(r.get('bare_tokens_per_s'))}"
                                if "error" not in r else f"{bs}: {r['error'][:40]}" for bs, r in sweep.items())
                out.append((f"{stem}, batch sweep (k = {d['batch_size_sweep']['k']})",
                            f"batch: ragkit / bare tokens/s = {fig}", "-", dev, "-"))
        elif name == "generate":
            for bs, r in d["results"].items():
                out.append((f"{stem}, batch {bs}", f"ragkit {_f(r['ragkit_tokens_per_s'])} tokens/s, model.generate "
                            f"{_f(r['hf_generate_tokens_per_s'])} (x{_f(r['ragkit_vs_hf_tokens_per_s'])}); peak "
                            f"{_f(r['ragkit_peak_gib'])} GiB", "-", dev, "-"))
        elif name == "cord":
            res = d["results"]
            fig = "; ".join(f"{loss} {_f(r.get('s_per_step'), 3)} s/step, {r.get('tokens', 0):,} tokens, peak "
                            f"{_f(r.get('peak_gib'))} GiB" + (" (checkpointing)" if r.get("gradient_checkpointing")
                                                              else "")
                            for loss, r in res.items())
            out.append((stem, f"{fig}; cord / ce {_f(d.get('time_ratio_cord_over_ce'))}", "<= 2.3", dev,
                        _met(tg, "cord_over_ce")))
        elif name == "dense":
            enc = ", ".join(f"batch {bs}: {_f(r['passages_per_s'])} passages/s" for bs, r in d["encode"].items())
            s = d["search"]
            backend = "FAISS GPU" if "faiss_gpu_flat" in s else "torch matrix (no FAISS GPU)"
            qps = (s.get("faiss_gpu_flat") or s.get("torch_matrix_fp32") or {}).get("qps")
            out.append((stem, f"{enc}; search {_f(qps)} q/s over {d['params']['n_docs']:,} vectors ({backend})",
                        "-", dev, "-"))
        elif name == "serve":
            for docs, b in d["by_docs"].items():
                lv = b["served"]
                per = ", ".join(f"{c} clients {_f(r['throughput_rps'])} req/s" for c, r in lv.items())
                fig = (f"{docs} docs: {per}"
                       f"; sequential {_f(b['sequential_rps_mean'])} req/s; speedup at 8 "
                       f"{_f(lv.get('8', {}).get('speedup_vs_sequential'))}x; failed "
                       f"{sum(r['failed'] for r in lv.values())}")
                out.append((stem, fig, ">= 2x at 8; 0 failed", dev,
                            _met(tg, f"docs{docs}_speedup_at_8_clients", "failed_requests")))
    return out


def markdown(folder: Path, tag: str = "gpu") -> str:
    lines = ["| measurement | figure | target | device | target met |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows(folder, tag)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="where the kit's JSON files are (a run's $OUT, or benchmarks/results)")
    ap.add_argument("--tag", default="gpu", help="file suffix: gpu (default) or smoke")
    a = ap.parse_args(argv)
    print(markdown(Path(a.folder), a.tag))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
