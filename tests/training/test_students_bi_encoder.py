"""Bi-encoder student: the dense embedder fine-tuned on MoI utilities (tiny random encoder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_students_residual import _labels

from ragkit.training.labels import write_labels


def test_bi_encoder_trains_and_saves_a_sentence_transformer(tiny_encoder_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from ragkit.debias.student import META_FILE
    from ragkit.training.bi_encoder import train_bi_encoder

    labels = _labels(16, 4, seed=2)
    out = tmp_path / "bi"
    res = train_bi_encoder(labels, out, base_model=str(tiny_encoder_dir), epochs=1, batch_size=4, lr=1e-3,
                           max_length=32, device="cpu", show_progress=False)
    assert res.loss_history and all(np.isfinite(res.loss_history))
    assert res.num_queries == 16 and res.num_pairs == 16 + 16 * 3  # one (q, p+) and k - 1 margins per question
    meta = json.loads((out / META_FILE).read_text(encoding="utf-8"))
    assert meta["metadata"]["student"] == "bi-encoder" and meta["metadata"]["loss"] == "margin_mse"
    model = SentenceTransformer(str(out), device="cpu")
    a = model.encode(["which river?"], convert_to_numpy=True)
    b = res.reranker.model.encode(["which river?"], convert_to_numpy=True)
    np.testing.assert_allclose(a, b, atol=1e-5)  # the saved weights are the trained ones
    before = SentenceTransformer(str(tiny_encoder_dir), device="cpu").encode(["which river?"], convert_to_numpy=True)
    assert not np.allclose(a, before, atol=1e-4)  # training moved the embedder
    s = res.reranker.scores(["which river?"], [labels[0].passages()])
    assert len(s[0]) == 4 and all(-1.0 - 1e-5 <= x <= 1.0 + 1e-5 for x in s[0])
    # student:PATH loads it as a reranker (eval, rerank, serve) that ranks by the same cosine
    from ragkit.debias import get_reranker
    from ragkit.debias.bi_encoder import BiEncoderReranker

    rr = get_reranker(f"student:{out}", device="cpu")
    assert isinstance(rr, BiEncoderReranker)
    ranked = rr.rank("which river?", labels[0].passages())
    assert ranked.ids() == [labels[0].passage_ids[i] for i in np.argsort(-np.asarray(s[0]), kind="stable")]
    np.testing.assert_allclose(sorted(ranked.scores(), reverse=True), sorted(s[0], reverse=True), atol=1e-5)
    assert ranked.info.forward_passes == 1 + len(labels[0].passage_ids)  # encoder passes: the question, each passage


def test_bi_encoder_argument_errors() -> None:
    from ragkit.training.bi_encoder import train_bi_encoder

    with pytest.raises(ValueError, match="margin_mse"):
        train_bi_encoder(_labels(2, 3, seed=1), None, loss="listnet")
    with pytest.raises(ValueError, match="in-batch negatives"):
        train_bi_encoder(_labels(2, 3, seed=1), None, batch_size=1)


def test_cli_bi_encoder_student(tiny_encoder_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.cli import main

    labels = tmp_path / "labels.jsonl"
    write_labels(labels, _labels(10, 3, seed=3))
    out = tmp_path / "bi"
    rc = main(["distill", "--labels", str(labels), "--out", str(out), "--student", "bi-encoder", "--base-model",
               str(tiny_encoder_dir), "--epochs", "1", "--max-length", "32", "--device", "cpu", "--force", "--json"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["metadata"]["student"] == "bi-encoder" and report["metadata"]["comparison"]["num_queries"] == 2
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "Compared with the first stage" in card and "bi-encoder" in card
    assert main(["distill", "--labels", str(labels), "--out", str(tmp_path / "x"), "--student", "bi-encoder",
                 "--loss", "ranknet"]) == 1
    assert "does not train a bi-encoder student" in capsys.readouterr().err
