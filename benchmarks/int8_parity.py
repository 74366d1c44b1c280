"""Benchmark: how far int8 variants of a student's ONNX graph move its ranking from torch's, and their speed.

The served student (``--student DIR``, a saved ``DistilledReranker``) ranks the bundled HotpotQA
questions (the first 10 paragraphs of each, as ``benchmarks/serve.py --backends`` does) with torch;
its fp32 ONNX graph (``ragkit.debias.onnx_encoder.export_onnx``) is then quantised several ways and
each graph ranks the same questions through the same ``rank_many``. Per variant: the share of
questions with the same top-3 as torch in order and as a set, the mean per-question Spearman, the
largest score difference. Also the spread of torch's scores (the margins that int8's error must
stay under).

Variants (``--variants``, comma-separated; all by default):

* ``fp32``: the exported graph itself;
* ``int8``: the ``onnx-int8`` backend's recipe (``quantize_dynamic``, int8 ``MatMul`` weights, one
  scale per output channel, activations quantised per batch);
* ``keep-*``: the same with some products kept in fp32 (``nodes_to_exclude``): ``keep-head`` (the
  pooler and classifier ``Gemm`` nodes, which ``quantize_dynamic`` quantises as ``MatMul`` too; the
  attention-score products, with no constant operand, stay fp32 in every variant),
  ``keep-last-layer``, ``keep-first-last-layers``, ``keep-head-first-last-layers``, ``keep-ffn-out-L``
  (layer ``L``'s feed-forward output projection), ``keep-ffn-out`` (all of them), ``keep-ffn`` (both
  feed-forward projections of every layer);
* ``smooth-all``, ``smooth-ffn-out``: SmoothQuant (Xiao et al., "SmoothQuant: Accurate and Efficient
  Post-Training Quantization for Large Language Models", ICML 2023, arXiv 2211.10438) before the same
  dynamic int8: ``x W = (x / s)(s W)`` with ``s_j = max|x_j|^a / max_k |W_jk|^(1-a)`` (``--alpha``),
  the per-channel activation maxima from ``--calibration-questions`` questions of ``--calibration``
  (a label file, never the bundled questions), ``x / s`` as an explicit ``Mul`` before the product.

Parity needs no idle cores (nothing is timed)::

    python benchmarks/int8_parity.py --student students/minilm-gold --out benchmarks/results/int8-parity-gold.json

With ``--time`` each graph (and torch) also ranks all the questions again, one client, ``--threads``
threads, best of ``--repeats``; the row gets its seconds and its speed over torch's, measured in the
same run (run it on idle cores)::

    python benchmarks/int8_parity.py --student students/minilm-gold --variants fp32,int8,keep-ffn-out,keep-ffn \
        --time --out benchmarks/results/int8-speed-gold-cpu.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import agreement  # noqa: E402

from ragkit.eval.harness import gpu_epilog, machine_info, write_result  # noqa: E402

LAYERS = 6
VARIANTS = ["fp32", "int8", "keep-head", "keep-head-first-last-layers", "keep-last-layer", "keep-first-last-layers",
            *[f"keep-ffn-out-{k}" for k in range(LAYERS)], "keep-ffn-out", "keep-ffn", "smooth-all", "smooth-ffn-out"]
CALIBRATION = ROOT / "experiments" / "distill" / "results" / "hotpotqa-train-bm25-20-passages.jsonl.gz"


def _is_ffn_out(name: str) -> bool:
    return "/output/dense/" in name and "attention" not in name


def _is_ffn(name: str) -> bool:
    return "/intermediate/dense/" in name or _is_ffn_out(name)


def _layer(k: int) -> Callable[[str], bool]:
    return lambda name: f"/layer.{k}/" in name


def _is_head(name: str) -> bool:
    return "/pooler/" in name or "/classifier/" in name


_KEEP: dict[str, Callable[[str], bool]] = {
    "keep-head": _is_head,
    "keep-head-first-last-layers": lambda n: _is_head(n) or _layer(0)(n) or _layer(LAYERS - 1)(n),
    "keep-last-layer": _layer(LAYERS - 1),
    "keep-first-last-layers": lambda n: _layer(0)(n) or _layer(LAYERS - 1)(n),
    "keep-ffn-out": _is_ffn_out,
    "keep-ffn": _is_ffn,
    **{f"keep-ffn-out-{k}": (lambda n, k=k: _is_ffn_out(n) and _layer(k)(n)) for k in range(LAYERS)},
}


def _quantize(src: Path, dst: Path, keep: list[str] | None = None, extra: dict[str, Any] | None = None) -> None:
    """The ``onnx-int8`` recipe (as in ``export_onnx``), with ``keep`` nodes left in fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, reduce_range=False,
                     op_types_to_quantize=["MatMul"], nodes_to_exclude=keep or [], extra_options=extra or {})


def _smooth(src: Path, dst: Path, which: Callable[[str], bool], tokenizer: Any, pairs: list[tuple[str, str]],
            alpha: float, max_length: int) -> int:
    """SmoothQuant the weight ``MatMul`` nodes that ``which`` names, then :func:`_quantize`; the smoothed fp32
    graph is kept beside ``dst`` (``*.smooth_fp32.onnx``). Returns the number of smoothed nodes."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    targets = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits and which(n.name)]
    xs = sorted({n.input[0] for n in targets})
    probe = onnx.load(str(src))
    for x in xs:
        probe.graph.output.append(helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs, ins = [o.name for o in sess.get_outputs()], [i.name for i in sess.get_inputs()]
    amax: dict[str, np.ndarray] = {}
    for s in range(0, len(pairs), 16):
        chunk = pairs[s : s + 16]
        enc = tokenizer([q for q, _ in chunk], [d for _, d in chunk], padding=True, truncation=True,
                        max_length=max_length, return_tensors="np")
        got = dict(zip(outs, sess.run(None, {k: np.asarray(enc[k], dtype=np.int64) for k in ins})))
        real = np.asarray(enc["attention_mask"], dtype=bool)  # padding positions do not count
        for x in xs:
            amax[x] = np.maximum(amax.get(x, 0.0), np.abs(got[x][real]).max(axis=0))
    for n in targets:
        w = numpy_helper.to_array(inits[n.input[1]])
        s = np.clip(amax[n.input[0]] ** alpha / np.abs(w).max(axis=1) ** (1.0 - alpha), 1e-5, None).astype(np.float32)
        inits[n.input[1]].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), n.input[1]))
        model.graph.initializer.append(numpy_helper.from_array((1.0 / s).astype(np.float32), f"{n.name}_inv_s"))
        mul = helper.make_node("Mul", [n.input[0], f"{n.name}_inv_s"], [f"{n.name}_smoothed"], name=f"{n.name}_smooth")
        model.graph.node.insert(list(model.graph.node).index(n), mul)  # just before its product
        n.input[0] = f"{n.name}_smoothed"
    smoothed = dst.with_suffix(".smooth_fp32.onnx")
    onnx.save(model, str(smoothed))
    _quantize(smoothed, dst)
    return len(targets)


def _best_seconds(engine: Any, qs: list[str], ps: list[list[Any]], repeats: int) -> float:
    """Best wall time of ``repeats`` passes of ``engine.rank_many`` over all questions (after one warm-up)."""
    engine.rank_many(qs[:2], ps[:2])
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        engine.rank_many(qs, ps)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    epilog = gpu_epilog("benchmarks/int8_parity.py", None, note=(
        "GPU: not applicable. int8 graphs are the CPU backends of ONNX Runtime; the agreement does not depend "
        "on the machine's speed, so any CPU reproduces the table."))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--student", required=True, help="a saved student folder (DistilledReranker)")
    ap.add_argument("--docs", type=int, default=10, help="paragraphs per bundled question (10)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--alpha", type=float, default=0.5, help="SmoothQuant's migration strength (0.5)")
    ap.add_argument("--calibration", default=str(CALIBRATION), help="label file whose pairs calibrate SmoothQuant")
    ap.add_argument("--calibration-questions", type=int, default=16)
    ap.add_argument("--work", default=None, help="folder for the graphs (default: a temporary one)")
    ap.add_argument("--time", action="store_true", help="also time each graph and torch (run on idle cores)")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes per graph with --time; the best counts (2)")
    ap.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime threads with --time (2)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "int8-parity.json"))
    a = ap.parse_args(argv)
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose among {', '.join(VARIANTS)}")

    from ragkit.datasets import sample_records
    from ragkit.debias.onnx_encoder import OnnxCrossEncoder, export_onnx
    from ragkit.debias.student import DistilledReranker
    from ragkit.training.labels import read_labels

    recs = sample_records(None)
    qs, ps = [r.question for r in recs], [list(r.passages[: a.docs]) for r in recs]
    student = DistilledReranker.load(a.student, device="cpu")
    ref = student.rank_many(qs, ps)
    timing: dict[str, Any] = {}
    if a.time:
        import torch

        torch.set_num_threads(a.threads)
        timing = {"threads": a.threads, "repeats": a.repeats,
                  "torch_seconds": _best_seconds(student, qs, ps, a.repeats)}
        print(f"torch: {timing['torch_seconds']:.2f} s for {len(qs)} questions", flush=True)
    top = [np.sort(r.scores())[::-1] for r in ref if len(r.scores()) > 3]
    spread = {"median_std": float(np.median([x.std() for x in top])),
              "median_gap_3rd_4th": float(np.median([x[2] - x[3] for x in top])),
              "mean_gap_3rd_4th": float(np.mean([x[2] - x[3] for x in top]))}
    print(f"torch scores: median std {spread['median_std']:.4f} within a question, median gap 3rd-4th "
          f"{spread['median_gap_3rd_4th']:.4f}", flush=True)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="ragkit-int8-parity-"))
    fp32 = export_onnx(student.model, work, int8=False) / "onnx" / "model.onnx"
    import onnx

    # ONNX Runtime's dynamic quantisation first rewrites the head's Gemm nodes (pooler, classifier) as
    # "<name>_MatMul" + Add and quantises those too; it leaves the attention-score products (no constant
    # operand) in fp32 (MatMulConstBOnly)
    names = [n.name if n.op_type == "MatMul" else f"{n.name}_MatMul" for n in onnx.load(str(fp32)).graph.node
             if n.op_type in ("MatMul", "Gemm")]
    max_length = int(getattr(student.model, "max_length", None) or 256)
    pairs: list[tuple[str, str]] = []
    if any(v.startswith("smooth") for v in variants):
        pairs = [(lab.question, t) for lab in read_labels(a.calibration)[: a.calibration_questions] for t in lab.texts]
    rows: dict[str, Any] = {}
    for v in variants:
        path, row = work / f"{v}.onnx", {}
        if v == "fp32":
            path = fp32
        elif v == "int8":
            _quantize(fp32, path)
        elif v.startswith("keep-"):
            keep = [n for n in names if _KEEP[v](n)]
            row["kept_fp32"] = len(keep)
            _quantize(fp32, path, keep=keep)
        else:
            which = _is_ffn_out if v == "smooth-ffn-out" else (lambda n: True)
            row["smoothed"] = _smooth(fp32, path, which, student.model.tokenizer, pairs, a.alpha, max_length)
            row["alpha"], row["calibration_pairs"] = a.alpha, len(pairs)
        engine = copy.copy(student)  # the same settings and batching, another graph (its counters do not matter here)
        engine.model = OnnxCrossEncoder(path, student.model.tokenizer, max_length)
        t0 = time.perf_counter()
        row.update(agreement(ref, engine.rank_many(qs, ps)))
        if a.time:
            row["seconds"] = _best_seconds(engine, qs, ps, a.repeats)
            row["speed_over_torch"] = timing["torch_seconds"] / row["seconds"]
            print(f"{v:>22}: {row['seconds']:.2f} s, {row['speed_over_torch']:.2f}x torch", flush=True)
        rows[v] = row
        print(f"{v:>22}: same top-3 {row['same_top3']:.0%} in order, {row['same_top3_set']:.0%} as a set, Spearman "
              f"{row['spearman']:.4f}, largest difference {row['max_abs_diff']:.4f} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    print(f"\n| variant | of {len(names)} products kept fp32 | same top-3 in order | as a set | mean Spearman | "
          "speed over torch |\n|---|---|---|---|---|---|")
    for v, row in rows.items():
        speed = f"{row['speed_over_torch']:.2f}x" if "speed_over_torch" in row else "not timed"
        print(f"| {v} | {row.get('kept_fp32', '')} | {row['same_top3']:.0%} | {row['same_top3_set']:.0%} | "
              f"{row['spearman']:.3f} | {speed} |")
    write_result(a.out, {
        "command": "python benchmarks/int8_parity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "student": {k: v for k, v in student.metadata.items() if k not in ("base_path",)},
        "questions": len(qs), "docs_per_question": a.docs, "torch_score_spread": spread, "by_variant": rows,
        **({"timing": {**timing, "machine": machine_info()}} if a.time else {}),
    })
    print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
