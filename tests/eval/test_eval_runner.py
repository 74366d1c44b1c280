"""The evaluation runner end to end on the tiny LM, including a real kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragkit.datasets import sample_records
from ragkit.eval.runner import EvalConfig, bootstrap_ci, candidates_for, run_eval


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
    assert {"em", "f1", "ndcg@10", "mrr@10", "recall@4"} <= set(data["aggregate"]["none"])
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


def test_a_finished_run_started_again_runs_nothing(tmp_path: Path, tiny_gen) -> None:
    """The partial file is gone once the report is written; the report's own rows then resume the run."""
    from ragkit.generation.base import metered

    out = tmp_path / "r.json"
    cfg = EvalConfig(sample=True, limit=2, k=3, max_new_tokens=2, n_bootstrap=10, methods=("none", "moi"))
    first = run_eval(cfg, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    assert not (tmp_path / "r.json.partial.jsonl").exists()
    written = out.read_bytes()
    with metered() as meter:
        again = run_eval(cfg, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    # nothing ran and nothing was rewritten: the report keeps its wall time, corpus size and profiles
    assert meter.forward_passes == 0 and out.read_bytes() == written
    assert not (tmp_path / "r.json.partial.jsonl").exists()  # no header-only partial file left behind
    assert again == json.loads(written) and again["timing"] == first["timing"]
    # another bootstrap count re-aggregates the same rows (a rewrite, nothing run)
    boot = EvalConfig(sample=True, limit=2, k=3, max_new_tokens=2, n_bootstrap=20, methods=("none", "moi"))
    with metered() as meter:
        rerun = run_eval(boot, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    assert meter.forward_passes == 0 and rerun["timing"]["resumed_items"] == 4
    assert [(r["method"], r["qid"], r["prediction"], r["ranking"]) for r in rerun["outputs"]] == \
        [(r["method"], r["qid"], r["prediction"], r["ranking"]) for r in first["outputs"]]
    # a method added to the same configuration runs alone; the finished rows stay as they were
    more = EvalConfig(sample=True, limit=2, k=3, max_new_tokens=2, n_bootstrap=10, methods=("none", "moi", "random"))
    grown = run_eval(more, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    assert grown["timing"]["resumed_items"] == 4 and [r["method"] for r in grown["outputs"]].count("random") == 2
    # another configuration does not take those rows
    other = EvalConfig(sample=True, limit=2, k=2, max_new_tokens=2, n_bootstrap=10, methods=("none",))
    with metered() as meter:
        run_eval(other, out=out, records=sample_records(2), generator=tiny_gen, show_progress=False)
    assert meter.forward_passes > 0


def test_rows_of_another_report_are_reused_only_where_they_would_come_out_the_same(tmp_path: Path, tiny_gen) -> None:
    """``reuse``: a method run with the same settings on the same candidates is taken, not run again."""
    import json

    from ragkit.generation.base import metered

    first_out = tmp_path / "first.json"
    base = dict(sample=True, limit=2, k=3, max_new_tokens=2, n_bootstrap=10)
    first = run_eval(EvalConfig(**base, methods=("none", "moi")), out=first_out, records=sample_records(2),
                     generator=tiny_gen, show_progress=False)
    # everything taken: no model work at all, the same rows, each naming where it came from
    with metered() as meter:
        same = run_eval(EvalConfig(**base, methods=("moi", "none")), out=tmp_path / "same.json",
                        records=sample_records(2), generator=tiny_gen, show_progress=False, reuse=[first_out])
    assert meter.forward_passes == 0 and same["timing"]["reused_items"] == 4
    assert {(r["method"], r["qid"], r["prediction"]) for r in same["outputs"]} == \
        {(r["method"], r["qid"], r["prediction"]) for r in first["outputs"]}
    assert all(r["reused_from"] == str(first_out) for r in same["outputs"])
    # moi with another setting runs again; none is taken
    with metered() as meter:
        other = run_eval(EvalConfig(**base, methods=("none", "moi"), method_kwargs={"moi": {"blend": 0.5}}),
                         out=tmp_path / "other.json", records=sample_records(2), generator=tiny_gen,
                         show_progress=False, reuse=[first_out])
    assert meter.forward_passes > 0 and other["timing"]["reused_items"] == 2
    assert {r["method"] for r in other["outputs"] if "reused_from" in r} == {"none"}
    # a question whose stored candidates are not this run's runs again (another corpus behind the same config)
    report = json.loads(first_out.read_text())
    report["outputs"][0]["candidates"] = list(reversed(report["outputs"][0]["candidates"]))
    first_out.write_text(json.dumps(report))
    edited = run_eval(EvalConfig(**base, methods=("none",)), out=tmp_path / "edited.json", records=sample_records(2),
                      generator=tiny_gen, show_progress=False, reuse=[first_out])
    assert edited["timing"]["reused_items"] == 1
    # another prompt size changes every answer: nothing is taken
    k2 = run_eval(EvalConfig(**{**base, "k": 2}, methods=("none",)), out=tmp_path / "k2.json",
                  records=sample_records(2), generator=tiny_gen, show_progress=False, reuse=[first_out])
    assert k2["timing"]["reused_items"] == 0


def _cli_cmd(tiny_lm_dir: Path, out: Path, limit: int) -> list[str]:
    return [sys.executable, "-m", "ragkit.cli", "eval", "--model", str(tiny_lm_dir), "--limit", str(limit),
            "--k", "4", "--passage-max-tokens", "16", "--max-new-tokens", "4", "--chunk-size", "2",
            "--bootstrap", "20", "--device", "cpu", "--methods", "none", "--out", str(out)]


def _env() -> dict[str, str]:
    return {**os.environ, "RAGKIT_NO_PROGRESS": "1"}


def _kill_after_first_chunks(cmd: list[str], part: Path, min_lines: int) -> int:
    """Start ``ragkit eval``, SIGKILL it from outside once the partial file has ``min_lines`` lines."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline:
            if part.exists() and len(part.read_text().splitlines()) >= min_lines:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.005)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_kill_and_resume_matches_uninterrupted(tmp_path: Path, tiny_lm_dir: Path) -> None:
    limit = 12
    # uninterrupted reference, in-process, with the configuration the CLI call below builds
    ref = tmp_path / "ref.json"
    cfg = EvalConfig(sample=True, limit=limit, k=4, model=str(tiny_lm_dir), passage_max_tokens=16,
                     max_new_tokens=4, chunk_size=2, n_bootstrap=20, device="cpu")
    run_eval(cfg, out=ref, show_progress=False)

    out = tmp_path / "run.json"
    part = tmp_path / "run.json.partial.jsonl"
    rc = _kill_after_first_chunks(_cli_cmd(tiny_lm_dir, out, limit), part, 1 + 2)  # killed from outside
    assert rc == -signal.SIGKILL
    assert not out.exists()
    lines = part.read_text().splitlines()
    done = len(lines) - 1  # fingerprint header + finished questions, whole chunks of 2
    assert 2 <= done < limit and done % 2 == 0

    resumed = subprocess.run(_cli_cmd(tiny_lm_dir, out, limit), env=_env(), capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a = json.loads(ref.read_text())
    b = json.loads(out.read_text())
    assert b["timing"]["resumed_items"] == done
    def strip(rows: list[dict]) -> list[dict]:  # wall times differ; the token ledger does not
        return [{k: ({c: x for c, x in v.items() if c != "seconds"} if k in ("cost", "ranking_cost") else v)
                 for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(b["outputs"]) == strip(a["outputs"])
    assert b["aggregate"]["none"]["f1"] == a["aggregate"]["none"]["f1"]
    assert not part.exists()


def test_runner_holds_no_test_hooks() -> None:
    import ragkit.eval.runner as runner

    src = Path(runner.__file__).read_text()
    assert "SIGKILL" not in src and "KILL_AFTER" not in src and "_BaselineNone" not in src


def test_unknown_method_is_reported_before_any_model_loads(tmp_path: Path, tiny_lm_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown method 'moi_prio'.*moi_prior.*student:PATH"):
        EvalConfig(methods=("none", "moi_prio"))
    with pytest.raises(ValueError, match="no such student folder"):
        EvalConfig(methods=("student:" + str(tmp_path / "missing"),))
    with pytest.raises(ValueError, match="listed twice"):
        EvalConfig(methods=("none", "none"))
    # through the CLI: the typo is the error, reported before the (valid) model would load
    res = subprocess.run([sys.executable, "-m", "ragkit.cli", "eval", "--model", str(tiny_lm_dir),
                          "--methods", "none,moi_prio", "--limit", "1", "--out", str(tmp_path / "r.json")],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "moi_prio" in res.stderr and "moi_prior" in res.stderr
    assert "Loading weights" not in res.stderr
