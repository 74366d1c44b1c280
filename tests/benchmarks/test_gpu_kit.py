"""benchmarks/gpu: the GPU evidence kit's smoke mode, its skip-with-reason paths and its travel-size report.

The smoke run is the real entry script (``python3 benchmarks/gpu/run.py --smoke``) in a subprocess:
tiny random models on the CPU, a real ``ragkit serve`` process on 127.0.0.1, every measurement
written as JSON. The checks are on what a GPU run will write: the files, their keys, the summary
table, and the figures that must hold on any device (ragkit's log-probs equal the bare and naive
forwards', greedy decoding equals ``model.generate``, the torch search is exact, no failed request).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "benchmarks" / "gpu"

STEMS = {"moi": "moi-llama-3-8b", "generate": "generate-llama-3-8b", "cord": "cord-llama-3-8b",
         "dense": "dense-minilm-l6", "serve": "serve-minilm-l6", "moi_qwen": "moi-qwen2.5-7b"}


@pytest.fixture(scope="module")
def kit(load_bench) -> ModuleType:
    return load_bench("gpu/run")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu-smoke")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    res = subprocess.run([sys.executable, str(KIT / "run.py"), "--smoke", "--device", "cpu", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out, res.stdout


def _load(out: Path, name: str, tag: str = "smoke") -> dict:
    return json.loads((out / f"{STEMS[name]}-{tag}.json").read_text())


@pytest.mark.slow
def test_smoke_writes_every_measurement_and_the_summary(smoke: tuple[Path, str]) -> None:
    out, stdout = smoke
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "smoke"
    env = summary["environment"]
    assert env["torch"]["version"] and env["packages"]["transformers"] and "cuda_available" in env["torch"]
    assert [r["name"] for r in summary["measurements"]] == list(STEMS)
    for row in summary["measurements"]:
        assert row["status"] == "ok", row
        assert (out / row["file"]).is_file()
    assert "measurement" in stdout and all(name in stdout for name in STEMS)
    assert summary["table"][0].startswith("measurement")
    for name in STEMS:
        d = _load(out, name)
        for key in ("benchmark", "status", "device", "machine", "headline", "targets", "params", "seconds"):
            assert key in d, (name, key)
        for t in d["targets"].values():
            assert set(t) == {"target", "value", "met", "what"}


@pytest.mark.slow
def test_smoke_moi_paths_agree_and_count_tokens(smoke: tuple[Path, str]) -> None:
    out, _ = smoke
    for name in ("moi", "moi_qwen"):
        d = _load(out, name)
        row = d["results"][f"k{max(d['params']['ks'])}"]
        for path in ("ragkit", "bare", "naive"):
            assert row[path]["tokens_per_s"] > 0 and row[path]["peak_gib"] > 0
        # ragkit scores exactly the bare forward's tokens (fp32 on CPU), and prefills fewer of them
        assert row["max_abs_diff_ragkit_vs_bare"] < 1e-3 and row["max_abs_diff_ragkit_vs_naive"] < 1e-3
        assert 0 < row["ragkit"]["tokens_prefilled"] < row["tokens_effective"] == row["bare"]["tokens_prefilled"]
        assert row["prompts_per_call"] == row["k"] + 1
        assert {"k4_ragkit_vs_bare", "k4_speedup_vs_naive"} <= set(d["targets"]) or name == "moi_qwen"
    sweep = _load(out, "moi")["batch_size_sweep"]["rows"]
    assert sweep and all(r["ragkit_tokens_per_s"] > 0 and r["bare_tokens_per_s"] > 0 for r in sweep.values())


@pytest.mark.slow
def test_smoke_generation_cord_dense_and_serve_figures(smoke: tuple[Path, str]) -> None:
    out, _ = smoke
    gen = _load(out, "generate")["results"]
    assert gen and all(r["ragkit_tokens_per_s"] > 0 and r["hf_generate_tokens_per_s"] > 0 for r in gen.values())
    assert all(r["same_text_share"] == 1.0 for r in gen.values())  # greedy: the same tokens as model.generate
    cord = _load(out, "cord")
    assert cord["results"]["cord"]["rows"] == 2 * cord["results"]["ce"]["rows"]
    assert cord["time_ratio_cord_over_ce"] > 0 and cord["trainable_parameters"] > 0
    dense = _load(out, "dense")
    assert all(r["passages_per_s"] > 0 for r in dense["encode"].values())
    assert dense["search"]["torch_matrix_fp32"]["top_k_equal_exact_share"] == 1.0
    assert "faiss_gpu_flat" in dense["search"] or dense["search"]["faiss_gpu_skipped"]  # which backend, and why
    serve = _load(out, "serve")
    assert serve["failed"] == 0 and serve["targets"]["failed_requests"]["met"] is True
    for block in serve["by_docs"].values():
        assert block["sequential_rps_mean"] > 0
        for level in block["served"].values():
            assert level["ok"] > 0 and level["speedup_vs_sequential"] > 0


def test_without_cuda_the_full_kit_skips_with_the_reason(kit: ModuleType, tmp_path: Path) -> None:
    assert kit.main(["--out", str(tmp_path), "--device", "cpu", "--only", "moi,serve"], hard_exit=False) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"]) for r in summary["measurements"]] == [("moi", "skipped"), ("serve", "skipped")]
    for name in ("moi", "serve"):
        d = _load(tmp_path, name, "gpu")
        assert d["status"] == "skipped" and "no CUDA device" in d["reason"] and d["mode"] == "full"
        assert "machine" in d


def test_a_measurement_without_time_left_is_skipped_with_the_reason(kit: ModuleType, tmp_path: Path) -> None:
    assert kit.main(["--smoke", "--out", str(tmp_path), "--device", "cpu", "--only", "dense", "--time-limit", "5"],
                    hard_exit=False) == 0
    d = _load(tmp_path, "dense")
    assert d["status"] == "skipped" and d["reason"].startswith("time limit")


def test_the_summary_table_reports_targets_and_reasons(kit: ModuleType) -> None:
    rows = [{"name": "moi", "status": "ok", "seconds": 3.0, "headline": {"k": 20, "ragkit_vs_bare": 0.95},
             "targets": {"k20_ragkit_vs_bare": {"target": ">= 0.9", "value": 0.95, "met": True, "what": ""},
                         "k20_speedup_vs_naive": {"target": ">= 5", "value": 2.0, "met": False, "what": ""}}},
            {"name": "serve", "status": "skipped", "seconds": 0.0, "reason": "no CUDA device"}]
    text = kit.table(rows)
    assert "k20_ragkit_vs_bare met (0.95 >= 0.9)" in text and "k20_speedup_vs_naive unmet (2 >= 5)" in text
    assert "serve        skipped" in text and "no CUDA device" in text


def test_fetch_wheels_reports_the_travel_size_against_the_limit(load_bench, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    fw = load_bench("gpu/fetch_wheels")
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 2**20)
    total = fw.report(tmp_path)
    text = capsys.readouterr().out
    tree = fw.size_bytes(fw.tree_files()) / 2**20
    assert total == pytest.approx(1.0 + tree)
    assert "wheels 1.00 MiB (1 files)" in text and "of the 64 MiB that travel: fits" in text
    assert fw.main(["--check-only", "--dest", str(tmp_path)]) == 0
    (tmp_path / "b-1.0-py3-none-any.whl").write_bytes(b"x" * 70 * 2**20)
    assert fw.main(["--check-only", "--dest", str(tmp_path)]) == 1  # over the limit: exit 1


def test_the_watchdog_writes_the_summary_when_a_measurement_overruns(kit: ModuleType, tmp_path: Path) -> None:
    import time

    run = kit.Kit(tmp_path, smoke=True, time_limit=3.4, only=[], device="cpu", hard_exit=False)
    run.current = "serve"
    dog = run.watchdog()  # fires 3 s before the limit: after about 0.4 s
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "summary.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        dog.cancel()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["note"] == "stopped by the watchdog during serve"
    assert summary["measurements"][-1]["status"] == "killed" and "time limit" in summary["measurements"][-1]["reason"]


@pytest.mark.slow
def test_figures_renders_one_row_per_figure_from_the_run(load_bench, smoke: tuple[Path, str]) -> None:
    out, _ = smoke
    text = load_bench("gpu/figures").markdown(out, "smoke")
    lines = text.splitlines()
    assert lines[0] == "| measurement | figure | target | device | target met |"
    body = lines[2:]
    assert [ln.split(" | ")[0] for ln in body] == [
        "| moi-llama-3-8b, k = 4", "| moi-llama-3-8b, batch sweep (k = 4)", "| generate-llama-3-8b, batch 2",
        "| cord-llama-3-8b", "| dense-minilm-l6", "| serve-minilm-l6", "| moi-qwen2.5-7b, k = 3"]
    assert "ragkit / bare" in body[0] and ">= 0.9; >= 5x" in body[0] and "cord / ce" in body[3]
    assert "torch matrix (no FAISS GPU)" in body[4] and "failed 0" in body[5]
