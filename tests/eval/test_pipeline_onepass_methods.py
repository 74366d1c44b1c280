"""One-pass rerankers in the pipeline study's configs: ``moi_attn`` (probe path or default location) and
``student:DIR``, with the reranker's own passes in every row's ``ranking_cost``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.types import Passage

SAMPLE = Path(__file__).resolve().parents[2] / "ragkit" / "data" / "hotpotqa_dev_sample.jsonl"


@pytest.fixture(scope="module")
def study(load_bench):
    return load_bench("pipeline/run")


def _probe(tiny_lm_dir: Path, out: Path) -> Path:
    from ragkit.debias.attention_probe import fit_attention_probe
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False, passage_max_tokens=12)
    ps = [Passage(id=f"p{i}", text=t) for i, t in enumerate(["Paris is in France.", "Dogs bark.", "Rome.", "Oslo."])]
    fit_attention_probe(gen, ["Where is Paris?", "Who barks?"], [ps, ps[::-1]],
                        [np.arange(4.0).tolist(), np.arange(4.0)[::-1].tolist()], out=out, show_progress=False)
    return out


def test_moi_attn_and_student_in_a_pipeline_config(study, tiny_lm_dir: Path, tiny_encoder_dir: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from ragkit.debias.student import DistilledReranker

    student = tmp_path / "student"
    DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0).save(student)
    probe = _probe(tiny_lm_dir, tmp_path / "probe.json")
    methods = ["none", "moi_attn", f"student:{student}"]
    cfg = {"stage": "select", "dataset": "hotpotqa", "data_file": str(SAMPLE), "limit": 2, "candidates": 6, "k": 3,
           "methods": ",".join(methods), "method_settings": {"moi_attn": {"probe": str(probe)}},
           "model": str(tiny_lm_dir), "passage_tokens": 12, "max_new_tokens": 2, "bootstrap": 10, "device": "cpu",
           "out": str(tmp_path / "one.json"), "quiet": True}
    config = tmp_path / "one-select.json"
    config.write_text(json.dumps(cfg), encoding="utf-8")
    assert study.main(["--config", str(config)]) == 0
    report = json.loads((tmp_path / "one.eval.json").read_text())
    rows = {m: [r for r in report["outputs"] if r["method"] == m] for m in methods}
    assert all(len(v) == 2 for v in rows.values())
    for r in rows[f"student:{student}"]:  # six encoder passes (one per pair), no generator pass to rank, one answer
        assert r["ranking_cost"]["model_passes"] == 6 and r["ranking_cost"]["forwards"] == 0
        assert r["cost"]["generator_calls"] == 1
    for r in rows["moi_attn"]:  # one generator pass over the candidates (+ ICR's calibration row)
        assert r["ranking_cost"]["generator_calls"] == 2 and r["ranking_cost"]["forwards"] >= 1
        assert r["ranking_cost"]["tokens_prefilled"] > 0
    for r in rows["none"]:
        assert r["ranking_cost"]["model_passes"] == 0 and r["ranking_cost"]["forwards"] == 0
    agg = report["aggregate"]
    assert agg[f"student:{student}"]["ranking_cost_per_question"]["model_passes"] == 6
    assert agg["moi_attn"]["ranking_cost_per_question"]["generator_calls"] == 2

    # moi_attn with no probe setting reads the generator's probe at its default location
    from ragkit.debias.attention_probe import default_probe_path
    from ragkit.generation import Generator

    monkeypatch.setenv("RAGKIT_PROBE_DIR", str(tmp_path / "probes"))
    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    default_probe_path(gen).parent.mkdir(parents=True)
    default_probe_path(gen).write_bytes(probe.read_bytes())
    cfg2 = {**cfg, "methods": "none,moi_attn", "method_settings": {}, "out": str(tmp_path / "two.json")}
    config.write_text(json.dumps(cfg2), encoding="utf-8")
    assert study.main(["--config", str(config)]) == 0
    two = json.loads((tmp_path / "two.eval.json").read_text())
    by = {r["qid"]: r["ranking"] for r in two["outputs"] if r["method"] == "moi_attn"}
    assert by == {r["qid"]: r["ranking"] for r in rows["moi_attn"]}  # the same probe, the same rankings
