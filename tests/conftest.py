"""Shared fixtures: tiny real models built offline in a second, and paths to the shared data.

Tests that load the embedded default models are marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (loaded once), its folder on ``sys.path`` for its sibling imports."""
    mod_name = f"ragkit_bench_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "benchmarks" / f"{name}.py")
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
    """``../shared/data`` (skips the test when it is absent)."""
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def hotpot_dev_records(shared_data: Path) -> list[dict]:
    """The first 20 raw HotpotQA dev records."""
    with open(shared_data / "hotpotqa" / "dev.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for _, line in zip(range(20), f)]
