"""Shared fixtures: tiny real models built offline in a second, and paths to the data folder.

Tests that start processes or load the embedded default models are ``slow``: marked by hand
(``@pytest.mark.slow``), or found here at collection (:func:`starts_processes`), so that
``-m "not slow"`` is the quick loop without anyone keeping a list.

Under pytest-xdist (``-n 2 --maxschedchunk 1``, the README's test command) each worker gets an
equal share of the cores for torch and for the processes its tests start (:func:`pytest_configure`):
two workers that each spin two threads on two cores ran the quick tests slower than one process did.
The longest tests come first (:data:`LONGEST_FIRST`) and are handed out one at a time, so they
spread over the workers and the short tests fill in around them instead of waiting behind them.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ragkit.datasets import data_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = data_dir()  # $RAGKIT_DATA (ragkit.datasets.data_dir)


def load_benchmark(name: str) -> ModuleType:
    """The script ``name`` as a module (loaded once): ``benchmarks/<name>.py`` or ``experiments/<study>/<name>.py``
    (``"<folder>/<name>"`` for ``benchmarks/gpu/run.py`` or where two studies have a script of that name).

    Its folder goes on ``sys.path`` (as when it runs as a script), for its folder's shared module
    (``benchmarks/_shapes.py``, ``experiments/moi_lab/_lab.py``).
    """
    mod_name = f"ragkit_bench_{name.replace('/', '_')}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    if "/" in name:  # "<folder>/<name>": benchmarks/gpu/run.py, or a script another study's folder also has
        found = [p for p in (ROOT / "benchmarks" / f"{name}.py", ROOT / "experiments" / f"{name}.py") if p.is_file()]
    else:
        found = [p for p in [ROOT / "benchmarks" / f"{name}.py", *sorted((ROOT / "experiments").glob(f"*/{name}.py"))]
                 if p.is_file()]
        if len(found) > 1:
            names = ", ".join(str(p.relative_to(ROOT)) for p in found)
            raise ValueError(f"{name!r} names {len(found)} scripts ({names}); pass '<study>/<name>'")
    if not found:
        raise FileNotFoundError(f"no script {name!r} under benchmarks/ or experiments/")
    path = found[0]
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_bench():
    """:func:`load_benchmark` as a fixture (test modules cannot import ``conftest`` by name: in a
    whole-tree run that name may resolve to another folder's conftest)."""
    return load_benchmark


def build_tiny_tokenizer():
    """A real byte-level BPE tokenizer (vocab 400) trained in-process, with a chat template: the model
    zoo's ``"bpe"`` tokenizer (one definition for the tests and ``benchmarks/model_zoo.py``)."""
    return load_benchmark("model_zoo").build_tokenizer("bpe")


def build_tiny_lm(path: Path, seed: int = 0) -> Path:
    """Save a randomly initialised 2-layer Llama (hidden 32) with the tiny tokenizer to ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random causal LM that ``from_pretrained`` loads (built once a session)."""
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny random BERT sentence-transformer (mean pooling, dim 32)."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from ragkit.models import resolve_embedder_path

    out = tmp_path_factory.mktemp("tiny-encoder")
    tok = BertTokenizerFast.from_pretrained(resolve_embedder_path(None))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    hf = out / "hf"
    BertModel(cfg).save_pretrained(hf)
    tok.save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=128)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension  # renamed in ST 5
    pool = models.Pooling(dim(), pooling_mode="mean")
    st = SentenceTransformer(modules=[word, pool], device="cpu")
    st.save(str(out / "st"))
    return out / "st"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The data folder, ``$RAGKIT_DATA`` (skips the test when it is absent)."""
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def hotpot_dev_records(shared_data: Path) -> list[dict]:
    """The first 20 raw HotpotQA dev records."""
    with open(shared_data / "hotpotqa" / "dev.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(20), f)]


# ----------------------------------------------------------------------------- the slow mark
#: Calls that start a process: the test then pays an interpreter start and ragkit's imports (seconds).
_PROCESS_CALLS = {"subprocess.run", "subprocess.Popen", "subprocess.check_call", "subprocess.check_output",
                  "subprocess.call", "Popen", "multiprocessing.Process", "os.fork", "os.system"}


#: Constructors and loaders that, given no model (no argument, or ``None``), load an embedded default model.
_DEFAULT_MODEL_CALLS = {"Generator", "DenseRetriever", "load_generator", "load_embedder", "RAGPipeline.default",
                        "ragkit.RAGPipeline.default", "MoIReranker"}


def _loads_default_model(node: ast.Call) -> bool:
    name = _call_name(node)
    if name not in _DEFAULT_MODEL_CALLS and name.rpartition(".")[2] not in {"load_generator", "load_embedder"}:
        return False
    if name.endswith("default"):
        return True
    first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg in ("model", "name")), None)
    if name == "MoIReranker":  # MoIReranker(Generator()): the generator argument decides
        return isinstance(first, ast.Call) and _loads_default_model(first)
    return first is None or (isinstance(first, ast.Constant) and first.value is None)


def _call_name(node: ast.Call) -> str:
    f = node.func
    parts = []
    while isinstance(f, ast.Attribute):
        parts.append(f.attr)
        f = f.value
    if isinstance(f, ast.Name):
        parts.append(f.id)
    return ".".join(reversed(parts))


@functools.cache
def _module_process_functions(path: str) -> frozenset[str]:
    """Names of the module's functions that start a process or load an embedded default model, directly
    or through another of them."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls = {name: {_call_name(c) for c in ast.walk(fn) if isinstance(c, ast.Call)} for name, fn in funcs.items()}
    slow = {name for name, cs in calls.items() if cs & _PROCESS_CALLS
            or any(isinstance(x, ast.Attribute) and x.attr == "executable"
                   and isinstance(x.value, ast.Name) and x.value.id == "sys" for x in ast.walk(funcs[name]))
            or any(isinstance(x, ast.Call) and _loads_default_model(x) for x in ast.walk(funcs[name]))}
    grew = True
    while grew:
        grew = False
        for name, cs in calls.items():
            if name not in slow and cs & slow:
                slow.add(name)
                grew = True
    return frozenset(slow)


def starts_processes(func: object) -> bool:
    """Whether a test function starts a process (``subprocess``, ``sys.executable``, a fork) or loads an
    embedded default model (``Generator()``, ``DenseRetriever()``, ``load_embedder(None)``, ...), itself
    or through a function of its module that does (followed transitively)."""
    try:
        path = inspect.getsourcefile(func)  # type: ignore[arg-type]
    except TypeError:
        return False
    return bool(path) and getattr(func, "__name__", "") in _module_process_functions(path)


LONGEST_FIRST = ("tests/test_readme_examples.py::test_readme_example_runs",)
"""Tests (node ids up to their parameters) run first under xdist: the longest ones (the README's
examples: about half of the suite's time), so that no worker is left with one of them at the end."""


def _worker_threads(workers: int) -> int:
    """Threads for each of ``workers`` test processes: the usable cores shared equally, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


def pytest_configure(config: pytest.Config) -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")  # set in each xdist worker before its config
    if workers:
        import torch

        os.environ.setdefault("OMP_NUM_THREADS", str(_worker_threads(int(workers))))  # the processes tests start
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and item.get_closest_marker("slow") is None and starts_processes(fn):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, and must collect the same order
        items.sort(key=lambda item: item.nodeid.partition("[")[0] not in LONGEST_FIRST)
