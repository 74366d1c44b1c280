"""The evaluation runner end to end on the tiny LM, including a real kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ragkit.datasets import sample_records
from ragkit.eval.runner import CRASH_ENV, EvalConfig, bootstrap_ci, candidates_for, run_eval


@pytest.fixture(scope="module")
def tiny_gen(tiny_lm_dir: Path):
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=16, show_progress=False)


def test_bootstrap_ci_seeded_and_bounded() -> None:
    a = bootstrap_ci([0, 1, 1, 0, 1], n_bootstrap=200, seed=3)
    b = bootstrap_ci([0, 1, 1, 0, 1], n_bootstrap=200, seed=3)
    assert a == b and a["mean"] == pytest.approx(0.6) and 0.0 <= a["lo"] <= 0.6 <= a["hi"] <= 1.0
    assert bootstrap_ci([1.0, 1.0], 50)["lo"] == 1.0
    assert bootstrap_ci([], 10)["n"] == 0


def test_candidates_given_and_bm25() -> None:
    recs = sample_records(3)
    given = candidates_for(EvalConfig(k=4), recs)
    assert [c.ids() for c in given] == [[p.id for p in r.passages[:4]] for r in recs]
    bm = candidates_for(EvalConfig(k=5, retriever="bm25"), recs)
    assert all(len(c) == 5 for c in bm)
    # retrieval runs over the pooled corpus of all 3 records' paragraphs
    pooled = {p.id for r in recs for p in r.passages}
    assert all(set(c.ids()) <= pooled for c in bm)
    assert len({pid for c in bm for pid in c.ids()}) > 5


def test_run_eval_writes_json_and_markdown(tmp_path: Path, tiny_gen) -> None:
    recs = sample_records(3)
    cfg = EvalConfig(sample=True, limit=3, k=4, model="tiny", methods=("none",), max_new_tokens=4, n_bootstrap=50)
    out = tmp_path / "rep.json"
    rep = run_eval(cfg, out=out, records=recs, generator=tiny_gen, plot_dir=tmp_path / "plots", show_progress=False)
    data = json.loads(out.read_text())
    assert data["n_questions"] == 3 and len(data["outputs"]) == 3
    assert {"em", "f1", "mrr@10", "recall@2"} <= set(data["aggregate"]["none"])
    assert data["aggregate"]["none"]["em"]["n"] == 3
    assert [o["qid"] for o in data["outputs"]] == [r.id for r in recs]
    md = (tmp_path / "rep.md").read_text()
    assert "| method |" in md and "| none |" in md
    assert rep["plots"] and all(Path(p).stat().st_size > 0 for p in rep["plots"])
    assert not (tmp_path / "rep.json.partial.jsonl").exists()


def test_resume_rejects_other_config(tmp_path: Path, tiny_gen) -> None:
    out = tmp_path / "r.json"
    part = tmp_path / "r.json.partial.jsonl"
    part.write_text(json.dumps({"_fingerprint": "something-else"}) + "\n")
    cfg = EvalConfig(sample=True, limit=2, k=3, max_new_tokens=2, n_bootstrap=10)
    with pytest.raises(ValueError, match="no-resume"):
        run_eval(cfg, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    run_eval(cfg, out=out, records=sample_records(2), generator=tiny_gen, resume=False, show_progress=False)
    assert out.exists()


def _cli(tiny_lm_dir: Path, out: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    env.update({"RAGKIT_NO_PROGRESS": "1", **(env_extra or {})})
    cmd = [sys.executable, "-m", "ragkit.cli", "eval", "--model", str(tiny_lm_dir), "--limit", "5", "--k", "4",
           "--passage-max-tokens", "16", "--max-new-tokens", "4", "--chunk-size", "2", "--bootstrap", "20",
           "--device", "cpu", "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_kill_and_resume_matches_uninterrupted(tmp_path: Path, tiny_lm_dir: Path) -> None:
    # uninterrupted reference, in-process, with the configuration the CLI call below builds
    ref = tmp_path / "ref.json"
    cfg = EvalConfig(sample=True, limit=5, k=4, model=str(tiny_lm_dir), passage_max_tokens=16, max_new_tokens=4,
                     chunk_size=2, n_bootstrap=20, device="cpu")
    run_eval(cfg, out=ref, show_progress=False)

    out = tmp_path / "run.json"
    part = tmp_path / "run.json.partial.jsonl"
    killed = _cli(tiny_lm_dir, out, {CRASH_ENV: "2"})  # SIGKILLs itself after 2 appended items
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists()
    lines = part.read_text().splitlines()
    assert len(lines) == 1 + 2  # fingerprint header + 2 finished questions

    resumed = _cli(tiny_lm_dir, out)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = json.loads(ref.read_text())
    b = json.loads(out.read_text())
    assert b["timing"]["resumed_items"] == 2
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(b["outputs"]) == strip(a["outputs"])
    assert b["aggregate"]["none"]["f1"] == a["aggregate"]["none"]["f1"]
    assert not part.exists()
