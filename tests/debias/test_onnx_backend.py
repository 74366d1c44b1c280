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
    assert files == ["model.onnx", "model_qint8.onnx"]
    q8 = student.with_backend("onnx-int8")
    top3_q8, rho_q8 = _agreement(ref, q8.rank_many(qs, ps))
    print(f"int8 vs torch: same top-3 on {top3_q8:.2f}, Spearman {rho_q8:.3f}; fp32: {top3:.2f}, {rho:.4f}")
    assert rho_q8 >= 0.93 and top3_q8 >= 0.75, (top3_q8, rho_q8)  # measured: 0.965, 0.87
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "cache").rglob("*.onnx")}
    assert sizes["model_qint8.onnx"] < sizes["model.onnx"]


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
