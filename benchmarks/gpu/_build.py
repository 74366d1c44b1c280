"""What the GPU kit measures on, built in-process: synthetic text, tokenizers and random models at real shapes.

Nothing is downloaded and no weights travel to the GPU machine: speed, memory and scaling do not
depend on trained weights, so every model is a random initialisation of a real configuration,
built directly on the device in its dtype (no fp32 copy of 8B weights). The tokenizers are
trained in a second on generated text; their ids are all below each shape's vocabulary size, and
the embedding and LM head keep the shape's real vocabulary, so the head costs what the real
model's does.

Shapes (``SHAPES``): ``llama-3-8b`` (meta-llama/Meta-Llama-3-8B-Instruct, from
``benchmarks/_shapes.py``), ``qwen2.5-7b`` (Qwen/Qwen2.5-7B-Instruct), ``minilm-l6``
(sentence-transformers/all-MiniLM-L6-v2 and the cross-encoder/ms-marco-MiniLM-L6-v2 reranker);
the ``tiny-*`` shapes are the smoke mode's.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helper modules

from _shapes import SHAPES as _LM_SHAPES  # noqa: E402

from ragkit.types import Passage  # noqa: E402

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "be", "da", "fo", "gu", "ha", "ji",
             "pe", "qu", "ri", "zo", "ta", "mo", "su", "ly", "wa", "ce"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML, as Qwen2.5's: the instruct models' prompts go through the ``chat`` template."""

SHAPES: dict[str, dict[str, Any]] = {
    "llama-3-8b": {"arch": "llama", **_LM_SHAPES["llama-3-8b"]},
    # Qwen/Qwen2.5-7B-Instruct
    "qwen2.5-7b": {"arch": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "max_position_embeddings": 32768, "rope_theta": 1000000.0, "tie_word_embeddings": False},
    # sentence-transformers/all-MiniLM-L6-v2 (and the MiniLM-L6 cross-encoders)
    "minilm-l6": {"arch": "bert", "hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6,
                  "num_attention_heads": 12, "vocab_size": 30522, "max_position_embeddings": 512},
    # the smoke mode's shapes: seconds on a CPU
    "tiny-llama": {"arch": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "tiny-qwen2": {"arch": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
                   "max_position_embeddings": 4096, "tie_word_embeddings": False},
    "tiny-bert": {"arch": "bert", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "vocab_size": 8192, "max_position_embeddings": 512},
}


def n_params(model: Any) -> int:
    """Parameter count of a torch module."""
    return int(sum(p.numel() for p in model.parameters()))


# ----------------------------------------------------------------------------- text
class Text:
    """Deterministic pseudo-words (2-4 syllables) and Zipf-distributed passages and questions over them."""

    def __init__(self, n_words: int = 6000, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        words: dict[str, None] = {}
        while len(words) < n_words:
            words["".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 5))))] = None
        self.words = list(words)
        p = 1.0 / np.arange(1, n_words + 1)
        self._p = p / p.sum()
        self._rng = np.random.default_rng(seed + 1)

    def sentence(self, n: int) -> str:
        """``n`` words, capitalised, with a full stop."""
        idx = self._rng.choice(len(self.words), size=n, p=self._p)
        s = " ".join(self.words[i] for i in idx)
        return s[:1].upper() + s[1:] + "."

    def passages(self, k: int, words: int, prefix: str = "p") -> list[Passage]:
        """``k`` passages of about ``words`` words, each with a short title."""
        return [Passage(id=f"{prefix}{i}", title=self.sentence(2)[:-1], text=self.sentence(words)) for i in range(k)]

    def question(self) -> str:
        """A question of 8-14 words."""
        return self.sentence(int(self._rng.integers(8, 15)))[:-1] + "?"

    def training_text(self, n: int = 3000) -> list[str]:
        """Sentences that cover the vocabulary, plus English and punctuation (the templates' own words)."""
        english = ("Answer the question using the passages. Reply with a short answer only (a name, a date, "
                   "a number, yes/no or a few words), with no explanation. Example: Question: Which city is "
                   "the capital of France? Passages: [1] Paris: Paris is the capital and most populous city "
                   "of France. Answer: Paris 0 1 2 3 4 5 6 7 8 9 user assistant system")
        out = [english] * 20
        for i in range(0, len(self.words), 40):
            out.append(" ".join(self.words[i:i + 40]))
        out += [self.sentence(int(self._rng.integers(10, 30))) for _ in range(n)]
        return out


# ----------------------------------------------------------------------------- tokenizers
def lm_tokenizer(text: Text, vocab_size: int = 8000) -> Any:
    """A byte-level BPE tokenizer trained on ``text`` (any string encodes and decodes back), ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                          "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(text.training_text(), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def bert_tokenizer(text: Text) -> Any:
    """A WordPiece BERT tokenizer (``[CLS] q [SEP] p [SEP]``) whose vocabulary is ``text``'s words + characters."""
    from transformers import BertTokenizerFast

    chars = sorted(set("".join(text.training_text(0))) - {" "})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    seen = set(vocab)
    for w in text.words + "answer the question using passages".split():
        if w not in seen:
            vocab.append(w)
            seen.add(w)
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)


# ----------------------------------------------------------------------------- models
def causal_lm(shape: str, tokenizer: Any, device: str, dtype: Any, seed: int = 0) -> Any:
    """A random causal LM of ``shape`` built directly on ``device`` in ``dtype``, in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(SHAPES[shape])
    arch = spec.pop("arch")
    if spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"shape {shape}: vocabulary {spec['vocab_size']} < tokenizer's {len(tokenizer)}")
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = cfg_cls(**spec, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(cfg)
    finally:
        torch.set_default_dtype(old)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def _bert_config(shape: str, tokenizer: Any, **kw: Any) -> Any:
    from transformers import BertConfig

    spec = dict(SHAPES[shape])
    spec.pop("arch")
    if spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"shape {shape}: vocabulary {spec['vocab_size']} < tokenizer's {len(tokenizer)}")
    return BertConfig(**spec, pad_token_id=tokenizer.pad_token_id, **kw)


def sentence_encoder(shape: str, text: Text, folder: Path, seed: int = 0, max_seq_length: int = 256) -> Path:
    """Save a random BERT sentence-transformer (mean pooling) of ``shape`` under ``folder``; returns its path."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertModel

    tok = bert_tokenizer(text)
    torch.manual_seed(seed)
    hf = folder / "hf"
    BertModel(_bert_config(shape, tok)).save_pretrained(hf)
    tok.save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=max_seq_length)
    dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension  # renamed in ST 5
    st = SentenceTransformer(modules=[word, models.Pooling(dim(), pooling_mode="mean")], device="cpu")
    st.save(str(folder / "st"))
    return folder / "st"


def cross_encoder(shape: str, text: Text, folder: Path, seed: int = 0) -> Path:
    """Save a random one-output BERT cross-encoder of ``shape`` (what ``cross-encoder:DIR`` loads) under ``folder``."""
    import torch
    from transformers import BertForSequenceClassification

    tok = bert_tokenizer(text)
    torch.manual_seed(seed)
    out = folder / "ce"
    BertForSequenceClassification(_bert_config(shape, tok, num_labels=1)).save_pretrained(out)
    tok.save_pretrained(out)
    return out
