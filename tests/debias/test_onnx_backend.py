"""ONNX Runtime backends of the cross-encoder rerankers against torch, on a tiny model and the bundled questions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'ragkit[onnx]'")
pytest.importorskip("onnx", reason="the onnx extra is not installed: pip install 'ragkit[onnx]'")


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


@pytest.fixture(scope="module")
def student(tiny_encoder_dir: Path) -> Any:
    """A tiny real student (2-layer BERT, hidden 32) trained for seconds to put the bundled questions'
    gold paragraphs first, so that its scores carry a signal that quantisation could scramble."""
    from ragkit.datasets import sample_records
    from ragkit.training.distill import train_student
    from ragkit.training.labels import LabelRecord

    labels = [LabelRecord(qid=r.id, question=r.question, passage_ids=tuple(p.id for p in r.passages),
                          texts=tuple(p.contents for p in r.passages),
                          u=tuple(float(p.id in r.gold_ids) for p in r.passages), answers=r.answers,
                          source="hotpotqa") for r in sample_records()]
    res = train_student(labels, None, base_model=str(tiny_encoder_dir), loss="ranknet", epochs=3, batch_size=8,
                        lr=5e-3, seed=0, max_length=128, device="cpu", report_loss=False, show_progress=False)
    return res.reranker


@pytest.fixture(scope="module")
def bundled() -> tuple[list[str], list[list[Any]]]:
    from ragkit.datasets import sample_records

    recs = sample_records()
    return [r.question for r in recs], [list(r.passages) for r in recs]


def _agreement(ref: list[Any], got: list[Any]) -> tuple[float, float]:
    """Share of questions with the same top-3 (in order) and the mean per-question Spearman of the scores."""
    top3 = float(np.mean([a.ids()[:3] == b.ids()[:3] for a, b in zip(ref, got)]))
    rho = float(np.mean([_spearman(a.scores(), [dict(zip(b.ids(), b.scores()))[i] for i in a.ids()])
                         for a, b in zip(ref, got)]))
    return top3, rho


def test_onnx_matches_torch(student: Any, bundled: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))
    qs, ps = bundled
    ref = student.rank_many(qs, ps)
    onnx = student.with_backend("onnx")
    assert onnx.backend == "onnx" and student.backend == "torch" and onnx.metadata == student.metadata
    got = onnx.rank_many(qs, ps)
    top3, rho = _agreement(ref, got)
    assert top3 >= 0.95 and rho >= 0.99, (top3, rho)
    assert max(abs(a - b) for x, y in zip(ref, got) for a, b in zip(x.scores(), y.scores())) < 1e-3
    assert onnx.pairs_scored == student.pairs_scored  # the same cut pairs, run through the other engine
    # exported once into the cache, keyed by the weights; the int8 graph is smaller and still ranks alike
    files = sorted(p.name for p in (tmp_path / "cache").rglob("*.onnx"))
    assert files == ["model.onnx", "model_qint8_per_channel.onnx"]
    q8 = student.with_backend("onnx-int8")
    top3_q8, rho_q8 = _agreement(ref, q8.rank_many(qs, ps))
    print(f"int8 vs torch: same top-3 on {top3_q8:.2f}, Spearman {rho_q8:.3f}; fp32: {top3:.2f}, {rho:.4f}")
    assert rho_q8 >= 0.93 and top3_q8 >= 0.75, (top3_q8, rho_q8)  # measured: 0.965, 0.87
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "cache").rglob("*.onnx")}
    assert sizes["model_qint8_per_channel.onnx"] < sizes["model.onnx"]


def test_backend_through_the_loaders(student: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragkit.debias import get_reranker
    from ragkit.debias.cross_encoder import CrossEncoderReranker
    from ragkit.debias.student import DistilledReranker

    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))
    folder = student.save_pretrained(tmp_path / "s")
    q, docs = "which river flows through the zebra castle?", ["A zebra river.", "Paris is in France.", "Rivers."]
    want = student.rank(q, docs)
    for rr in (DistilledReranker.load(folder, device="cpu", backend="onnx"),
               DistilledReranker.from_pretrained(folder, device="cpu", backend="onnx"),
               CrossEncoderReranker.from_pretrained(str(folder), device="cpu", backend="onnx"),
               get_reranker(f"student:{folder}", device="cpu", backend="onnx")):
        assert rr.backend == "onnx"
        got = rr.rank(q, docs)
        assert got.ids() == want.ids() and got.scores() == pytest.approx(want.scores(), abs=1e-4)
    with pytest.raises(ValueError, match="onnx-int8"):
        student.with_backend("tensorrt")
    with pytest.raises(RuntimeError, match="backend='torch'"):
        DistilledReranker.load(folder, device="cpu", backend="onnx").save_pretrained(tmp_path / "again")
    assert student.with_backend("torch") is student


def test_openvino_matches_torch(student: Any, bundled: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    openvino = pytest.importorskip("openvino", reason="the openvino extra is not installed (about 180 MB, not in "
                                                      "dev): pip install 'ragkit[openvino]'")
    from ragkit.debias import get_reranker
    from ragkit.debias.onnx_encoder import OpenVinoCrossEncoder
    from ragkit.debias.student import DistilledReranker

    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))
    qs, ps = bundled
    before = student.pairs_scored  # the module's student keeps counting across tests
    ref = student.rank_many(qs, ps)
    ov = student.with_backend("openvino", threads=1)
    assert ov.backend == "openvino" and isinstance(ov.model, OpenVinoCrossEncoder) and ov.metadata == student.metadata
    assert ov.model.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    # fp32 even where the CPU has bf16 instructions (OpenVINO's default there is bfloat16)
    assert ov.model.compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32
    got = ov.rank_many(qs, ps)
    top3, rho = _agreement(ref, got)
    assert top3 >= 0.95 and rho >= 0.99, (top3, rho)
    assert max(abs(a - b) for x, y in zip(ref, got) for a, b in zip(x.scores(), y.scores())) < 1e-3
    assert ov.pairs_scored == student.pairs_scored - before
    # the fp32 graph of the ONNX export, written once (OpenVINO needs no int8 graph), then shared with onnx
    assert sorted(p.name for p in (tmp_path / "cache").rglob("*.onnx")) == ["model.onnx"]
    assert student.with_backend("onnx").model.path == ov.model.path
    # through the loaders, and from a folder that ships its own onnx/model.onnx
    folder = student.save_pretrained(tmp_path / "s")
    q, docs = "which river flows through the zebra castle?", ["A zebra river.", "Paris is in France.", "Rivers."]
    want = student.rank(q, docs)
    for rr in (DistilledReranker.load(folder, device="cpu", backend="openvino"),
               get_reranker(f"student:{folder}", device="cpu", backend="openvino")):
        assert rr.backend == "openvino"
        got1 = rr.rank(q, docs)
        assert got1.ids() == want.ids() and got1.scores() == pytest.approx(want.scores(), abs=1e-4)
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(ov.model.path.read_bytes())
    assert DistilledReranker.load(folder, device="cpu", backend="openvino").model.path == folder / "onnx" / "model.onnx"
    with pytest.raises(RuntimeError, match="backend='openvino'"):
        ov.save_pretrained(tmp_path / "again")


def test_openvino_missing_names_the_extra(student: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ragkit.debias.onnx_encoder import BACKENDS, check_backend

    assert check_backend("openvino") == "openvino" and "openvino" in BACKENDS
    monkeypatch.setitem(sys.modules, "openvino", None)  # what `import openvino` meets when it is not installed
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ImportError, match=r"pip install 'ragkit\[openvino\]'"):
        student.with_backend("openvino")
    assert not (tmp_path / "cache").exists()  # refused before exporting a graph nobody would run


def test_serve_cli_takes_the_openvino_backend() -> None:
    from ragkit.cli import build_parser

    args = build_parser().parse_args(["serve", "--reranker", "student:x", "--backend", "openvino"])
    assert args.backend == "openvino"
