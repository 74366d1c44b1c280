"""experiments/cord/cord_sweep.py: a cut-off run resumes where it stopped and refuses another run's file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_bench) -> ModuleType:
    return load_bench("cord_sweep")


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")


def _tiny_run(out: Path, model: Path, tmp_path: Path, losses: str) -> list[str]:
    """Arguments of a seconds-long cord_sweep run on the tiny model."""
    return ["--out", str(out), "--model", str(model), "--train-limit", "3", "--train-k", "3", "--steps", "2",
            "--passage-max-tokens", "8", "--k", "3", "--sweep-questions", "3", "--losses", losses,
            "--workdir", str(tmp_path / "work")]


@pytest.mark.usefixtures("shared_data")  # the script reads ../shared/data
def test_resume_keeps_finished_sweeps_and_trainings(
    bench: ModuleType, tiny_lm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "cord.json"
    args = _tiny_run(out, tiny_lm_dir, tmp_path, "cord")
    assert bench.main(args) == 0
    first = json.loads(out.read_text(encoding="utf-8"))
    assert set(first["sweep"]) == {"none", "cord"} and set(first["train"]) == {"cord"}
    assert first["train"]["cord"]["global_step"] == 2

    # a run cut off after its trainings: the finished sweep of the base is kept, only the rest runs
    del first["sweep"]["cord"]
    out.write_text(json.dumps(first), encoding="utf-8")
    calls: list[str] = []
    real = bench._sweep
    monkeypatch.setattr(bench, "_sweep", lambda path, *a: calls.append(str(path)) or real(path, *a))
    writes: list[dict] = []
    real_write = bench.write_result
    monkeypatch.setattr(bench, "write_result",
                        lambda p, r: writes.append(json.loads(json.dumps(r))) or real_write(p, r))
    assert bench.main(args) == 0
    # every file the resumed run writes holds the intervals of the sweeps it holds, the first one included
    assert writes and all(set(w["gap_bootstrap"]["gap"]) == set(w["sweep"]) for w in writes)
    assert len(calls) == 1 and calls[0].startswith(str(tmp_path / "work" / "cord"))
    again = json.loads(out.read_text(encoding="utf-8"))
    assert again["sweep"]["none"] == first["sweep"]["none"]
    assert again["train"]["cord"]["seconds"] == first["train"]["cord"]["seconds"]  # not trained again

    # a finished run is not run again
    calls.clear()
    assert bench.main(args) == 0 and calls == []

    # a training recorded in the JSON whose --workdir is gone (a new machine): trained again, not a crash
    del again["sweep"]["cord"]
    out.write_text(json.dumps(again), encoding="utf-8")
    shutil.rmtree(tmp_path / "work" / "cord")
    assert bench.main(args) == 0
    redone = json.loads(out.read_text(encoding="utf-8"))
    assert set(redone["sweep"]) == {"none", "cord"} and redone["train"]["cord"]["global_step"] == 2
    assert (tmp_path / "work" / "cord" / "final").is_dir()

    # another run's file is refused by name, not mixed in
    with pytest.raises(SystemExit, match=r"other settings \(steps\).*--no-resume"):
        bench.main([*args, "--steps", "3"])


def test_loss_spec_parses_own_settings_and_names_bad_ones(bench: ModuleType) -> None:
    assert bench.parse_loss_spec("cord") == ("cord", {})
    assert bench.parse_loss_spec(" cord:alpha=1:lam=4:steps=600 ") == ("cord", {"alpha": 1.0, "lam": 4.0, "steps": 600})
    assert bench.parse_loss_spec("cord:ce_on=both") == ("cord", {"ce_on": "both"})
    with pytest.raises(SystemExit, match=r"'beta=2' is not KEY=VALUE with KEY one of lam, alpha"):
        bench.parse_loss_spec("cord:beta=2")
    with pytest.raises(SystemExit, match=r"'lam' is not KEY=VALUE"):
        bench.parse_loss_spec("cord:lam")
    with pytest.raises(SystemExit, match=r"steps='1.5' is not a int"):
        bench.parse_loss_spec("cord:steps=1.5")


@pytest.mark.usefixtures("shared_data")
def test_a_variant_trains_with_its_own_settings_beside_the_base(
    bench: ModuleType, tiny_lm_dir: Path, tmp_path: Path,
) -> None:
    name, out = "cord:alpha=1:lam=3:steps=1", tmp_path / "cord.json"
    assert bench.main(_tiny_run(out, tiny_lm_dir, tmp_path, name)) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    assert set(res["sweep"]) == {"none", name}
    assert res["train"][name]["global_step"] == 1
    assert res["train"][name]["overrides"] == {"alpha": 1.0, "lam": 3.0, "steps": 1}
    settings = json.loads((tmp_path / "work" / "cord_alpha=1_lam=3_steps=1" / "cord_settings.json").read_text())
    assert (settings["alpha"], settings["lam"], settings["loss"]) == (1.0, 3.0, "cord")
    assert f"{name} - none" in res["gap_bootstrap"]["gap_difference"]

    with pytest.raises(SystemExit, match=r"unknown loss in cordd:lam=2; use one of cord"):
        bench.main(_tiny_run(out, tiny_lm_dir, tmp_path, "cordd:lam=2"))
