"""Shared fixtures: tiny real models built offline in a second, and paths to the shared data.

Tests that load the embedded default models are marked ``slow``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGKIT_SHARED_DATA", ROOT.parent / "shared" / "data"))

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France.",
    "Arthur's Magazine was an American literary periodical published in Philadelphia.",
    "First for Women is a woman's magazine published by Bauer Media Group in the USA.",
    "Answer the question using the passages. Question: Which magazine was started first?",
    "Passage 1: Title. Text. Answer: yes no 1844 1989 the a an of in on at to is was",
    "0 1 2 3 4 5 6 7 8 9 ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz .,;:!?'\"()[]-",
]


def build_tiny_tokenizer():
    """A real byte-level BPE tokenizer (vocab 400) trained in-process, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(_TRAIN_TEXT * 4, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = _CHAT_TEMPLATE
    return tok


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
