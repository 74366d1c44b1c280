"""``moi_attn``: the leave-one-out-fitted attention probe (synthetic features; tiny random LM end to end)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.types import Passage


def _synthetic(n_q: int, n_p: int, layers: int, heads: int, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=layers * heads)
    feats = [rng.gamma(2.0, 1.0, size=(n_p, layers * heads)) + rng.normal() for _ in range(n_q)]  # per-query offsets
    utils = [(x @ w + rng.normal()).tolist() for x in feats]
    return w, feats, utils


def test_probe_recovers_known_weights() -> None:
    from ragkit.debias.attention_probe import AttentionProbe, spearman_fidelity, top_k_agreement

    w, feats, utils = _synthetic(40, 8, 3, 4, seed=0)
    probe = AttentionProbe.fit(feats, utils, layers=3, heads=4, ridge=0.0, target="center")
    np.testing.assert_allclose(probe.weights / probe.scale, w, atol=1e-8)  # exact recovery
    pred = [probe.score(x) for x in feats]
    assert spearman_fidelity(pred, utils) == pytest.approx(1.0) and top_k_agreement(pred, utils, 3) == 1.0
    z = AttentionProbe.fit(feats, utils, layers=3, heads=4, ridge=1e-3)  # z-scored targets: same direction
    eff = z.weights / z.scale
    assert eff @ w / (np.linalg.norm(eff) * np.linalg.norm(w)) > 0.95
    shrunk = AttentionProbe.fit(feats, utils, layers=3, heads=4, ridge=10.0, target="center")
    assert np.linalg.norm(shrunk.weights) < 0.5 * np.linalg.norm(probe.weights)  # the ridge penalty bites
    with pytest.raises(ValueError, match="expected \\(8, 12\\)"):
        AttentionProbe.fit([np.zeros((8, 5))], [list(range(8))], layers=3, heads=4)


def test_probe_json_round_trip_and_errors(tmp_path: Path) -> None:
    from ragkit.debias.attention_probe import PROBE_FORMAT, AttentionProbe

    w, feats, utils = _synthetic(10, 5, 2, 2, seed=1)
    probe = AttentionProbe.fit(feats, utils, layers=2, heads=2, model_fingerprint="m-123")
    path = probe.save(tmp_path / "p.json")
    d = json.loads(path.read_text())
    assert d["format"] == PROBE_FORMAT and d["model_fingerprint"] == "m-123" and len(d["weights"]) == 4
    assert "feature_layout" in d and path.stat().st_size < 4000
    back = AttentionProbe.load(path)
    np.testing.assert_array_equal(back.score(feats[0]), probe.score(feats[0]))
    with pytest.raises(FileNotFoundError, match="ragkit distill probe"):
        AttentionProbe.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a ragkit attention probe"):
        AttentionProbe.load(tmp_path / "bad.json")
    (tmp_path / "short.json").write_text(json.dumps({**d, "weights": [1.0]}))
    with pytest.raises(ValueError, match="1 weights"):
        AttentionProbe.load(tmp_path / "short.json")


def test_fidelity_functions() -> None:
    from ragkit.debias.attention_probe import spearman_fidelity, top_k_agreement

    assert spearman_fidelity([[1, 2, 3]], [[3, 2, 1]]) == pytest.approx(-1.0)
    assert np.isnan(spearman_fidelity([[1, 1, 1]], [[1, 2, 3]]))
    assert top_k_agreement([[5, 4, 3, 2, 1]], [[5, 4, 0, 3, 2]], k=3) == pytest.approx(2 / 3)
    assert top_k_agreement([[1, 2]], [[1, 2]], k=3) == 1.0


def _questions() -> tuple[list[str], list[list[Passage]]]:
    texts = ["Paris is the capital of France.", "The dog barks at night.", "Rome is in Italy.",
             "Bread is baked in ovens.", "The Seine flows through Paris."]
    ps = [Passage(id=f"p{i}", title=f"T{i}", text=t) for i, t in enumerate(texts)]
    return (["What is the capital of France?", "Where is Rome?", "What do dogs do?"],
            [ps, ps[::-1], ps[1:4]])


def test_moi_attn_end_to_end_on_a_tiny_model(tiny_lm_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.debias import get_reranker
    from ragkit.debias.attention_probe import (
        AttentionProbeReranker,
        attention_features,
        default_probe_path,
        fit_attention_probe,
        model_fingerprint,
    )
    from ragkit.debias.icr import ICRReranker
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    cfg = gen.model.config
    lh = cfg.num_hidden_layers * cfg.num_attention_heads
    qs, ps = _questions()
    x = attention_features(ICRReranker(gen), qs[0], ps[0])
    assert x.shape == (5, lh) and np.all(np.isfinite(x)) and np.abs(x).sum() > 0
    raw = attention_features(ICRReranker(gen), qs[0], ps[0], calibrated=False)
    assert raw.shape == (5, lh) and raw.min() >= 0 and raw.sum(0).max() <= 1.0 + 1e-5  # attention mass

    rng = np.random.default_rng(0)
    utils = [rng.normal(size=len(p)).tolist() for p in ps]
    path = tmp_path / "probe.json"
    probe = fit_attention_probe(gen, qs, ps, utils, ridge=0.1, out=path, show_progress=False)
    assert path.exists() and probe.model_fingerprint == model_fingerprint(gen)
    assert -1.0 <= probe.metadata["train_fidelity"]["spearman"] <= 1.0

    reranker = get_reranker("moi_attn", gen, probe=str(path))
    assert isinstance(reranker, AttentionProbeReranker)
    ranked = reranker.rank_many(qs, ps)
    for r, p, q in zip(ranked, ps, qs):
        assert sorted(r.ids()) == sorted(x.id for x in p)
        expected = probe.score(attention_features(ICRReranker(gen), q, p))
        np.testing.assert_allclose(sorted(r.scores(), reverse=True), sorted(expected, reverse=True), atol=1e-6)
        assert r.info.generator_calls == 2 and r.info.forward_passes == 2

    if not default_probe_path(gen).exists():  # no committed probe for a random model: say how to fit one
        with pytest.raises(FileNotFoundError, match="ragkit distill probe"):
            get_reranker("moi_attn", gen)
    other = probe.to_dict()
    other["model_fingerprint"] = "another-model-000000000000"
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="fitted for another-model"):
        AttentionProbeReranker(gen, tmp_path / "other.json")


def test_feature_cache_resumes_exactly_and_recomputes_only_a_torn_row(tiny_lm_dir: Path, tmp_path: Path) -> None:
    from ragkit.debias.attention_probe import attention_feature_table, fit_attention_probe
    from ragkit.generation import Generator
    from ragkit.generation.base import metered

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    qs, ps = _questions()
    cache = tmp_path / "features.jsonl"
    with metered() as first:
        a = attention_feature_table(gen, qs[:2], ps[:2], cache=cache, show_progress=False)
    assert first.forward_passes > 0 and len(cache.read_text().splitlines()) == 2
    with metered() as again:  # all three: two read back, the third computed and appended
        b = attention_feature_table(gen, qs, ps, cache=cache, show_progress=False)
    per_question = first.forward_passes // 2
    assert again.forward_passes == per_question and len(cache.read_text().splitlines()) == 3
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)  # read back bit for bit

    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) - 40])  # a write killed in the last row
    with metered() as torn:
        c = attention_feature_table(gen, qs, ps, cache=cache, show_progress=False)
    assert torn.forward_passes == per_question and len(cache.read_text().splitlines()) == 3
    np.testing.assert_array_equal(c[2], b[2])
    with metered() as other:  # uncalibrated features are another key: nothing read back
        attention_feature_table(gen, qs[:1], ps[:1], calibrated=False, cache=cache, show_progress=False)
    assert other.forward_passes > 0

    utils = [np.random.default_rng(0).normal(size=len(p)).tolist() for p in ps]
    cached = fit_attention_probe(gen, qs, ps, utils, ridge=0.1, cache=cache, show_progress=False)
    plain = fit_attention_probe(gen, qs, ps, utils, ridge=0.1, show_progress=False)
    np.testing.assert_array_equal(cached.weights, plain.weights)


def test_cli_distill_probe(tiny_lm_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.cli import main
    from ragkit.debias.attention_probe import AttentionProbe
    from ragkit.training.labels import LabelRecord, write_labels

    qs, ps = _questions()
    rng = np.random.default_rng(1)
    labs = [LabelRecord(qid=f"q{i}", question=q, passage_ids=[x.id for x in p], texts=[x.text for x in p],
                        titles=[x.title for x in p], u=rng.normal(size=len(p)).tolist(), design="loo")
            for i, (q, p) in enumerate(zip(qs * 2, ps * 2))]
    labels = tmp_path / "labels.jsonl"
    write_labels(labels, labs)
    out = tmp_path / "probe.json"
    rc = main(["distill", "probe", "--labels", str(labels), "--model", str(tiny_lm_dir), "--device", "cpu",
               "--probe-out", str(out), "--holdout", "0.34", "--json"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["held_out_fidelity"]["num_queries"] == 2 and report["num_queries"] == 4
    assert AttentionProbe.load(out).metadata["held_out_fidelity"]["num_queries"] == 2


def test_cli_rerank_moi_attn(tiny_lm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`ragkit rerank --reranker moi_attn` finds the generator's probe by fingerprint ($RAGKIT_PROBE_DIR)."""
    from ragkit.cli import main
    from ragkit.debias.attention_probe import default_probe_path, fit_attention_probe
    from ragkit.generation import Generator

    qs, ps = _questions()
    passages = tmp_path / "p.jsonl"
    passages.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in ps[0]))
    argv = ["rerank", "--query", qs[0], "--passages", str(passages), "--reranker", "moi_attn", "--model",
            str(tiny_lm_dir), "--device", "cpu", "--json"]
    monkeypatch.setenv("RAGKIT_PROBE_DIR", str(tmp_path / "probes"))
    assert main(argv) == 1
    assert "ragkit distill probe" in capsys.readouterr().err  # no probe yet: how to fit one
    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    fit_attention_probe(gen, qs, ps, [list(range(len(p))) for p in ps], out=default_probe_path(gen),
                        show_progress=False)
    assert main(argv) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["reranker"] == "moi_attn" and out["generator_calls"] == 2
