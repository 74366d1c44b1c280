"""Log-probs through the model's own output path (issue 14.1) and answers tokenised with their prompt (14.2).

Tiny random models of several architectures are built in the test; ``score()`` and
``score_orderings()`` must equal a plain full forward + ``log_softmax`` of the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ragkit.generation import Generator
from ragkit.types import Passage

QUESTION = "Which magazine was started first?"
ANSWERS = ["Arthur's Magazine", "1844", "the fox"]


def _passages() -> list[Passage]:
    return [Passage(str(i), f"passage {i} about the fox and the magazine " * (i % 2 + 1), title=f"T{i}")
            for i in range(3)]


def _config(arch: str, tok) -> object:  # noqa: ANN001
    import transformers as tf

    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                  initializer_range=0.2)
    if arch == "llama":
        return tf.LlamaConfig(**common)
    if arch == "qwen2":
        return tf.Qwen2Config(**common)
    if arch == "granite":
        # Granite divides its logits by ``logits_scaling`` after the head
        return tf.GraniteConfig(**common, logits_scaling=0.125)
    if arch == "cohere":
        # Cohere multiplies its logits by ``logit_scale`` after the head
        return tf.CohereConfig(**common, logit_scale=4.0)
    if arch == "gemma2":
        return tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=2.0, query_pre_attn_scalar=8,
                               sliding_window=4096)
    raise AssertionError(arch)


def _generator(arch: str, tiny_lm_dir: Path) -> Generator:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(arch, tok)).eval()
    return Generator.from_components(model, tok, template="short", batch_size=2, show_progress=False)


def _reference(gen: Generator, prompt: str, answer: str) -> np.ndarray:
    """Plain full forward of ``prompt + " " + answer`` and ``log_softmax`` at the answer tokens."""
    tok = gen.tokenizer
    p = tok(prompt)["input_ids"]
    a = tok(" " + answer, add_special_tokens=False)["input_ids"]
    assert tok(prompt + " " + answer)["input_ids"] == p + a  # byte-level BPE: no merge across the boundary
    with torch.inference_mode():
        logits = gen.model(input_ids=torch.tensor([p + a])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(len(p) - 1, len(p) + len(a) - 1), torch.tensor(a)].double().numpy()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "granite", "cohere", "gemma2"])
def test_score_equals_full_forward(arch: str, tiny_lm_dir: Path) -> None:
    gen = _generator(arch, tiny_lm_dir)
    ps = _passages()
    orders = [[0, 1, 2], [2, 1, 0], [1, 2, 0]]
    prompts = [gen.build_prompt(QUESTION, [ps[i] for i in o]) for o in orders]
    refs = [_reference(gen, p, a) for p, a in zip(prompts, ANSWERS)]
    got = gen.score(prompts, ANSWERS)
    for r, g in zip(refs, got.token_logprobs):
        np.testing.assert_allclose(g, r, atol=1e-4)
    res = gen.score_orderings([QUESTION], [ps], [orders], [ANSWERS])[0]
    for r, g in zip(refs, res.token_logprobs):
        np.testing.assert_allclose(g, r, atol=1e-4)
    # the post-head transforms matter for these models: a plain log-softmax of the head differs
    if arch in ("granite", "cohere"):
        tok = gen.tokenizer
        p = tok(prompts[0])["input_ids"]
        a = tok(" " + ANSWERS[0], add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            h = gen.model.get_decoder()(input_ids=torch.tensor([p + a])).last_hidden_state[0]
            raw = torch.log_softmax(gen.model.get_output_embeddings()(h).float(), dim=-1)
        naive = raw[torch.arange(len(p) - 1, len(p) + len(a) - 1), torch.tensor(a)].numpy()
        assert np.abs(naive - refs[0]).max() > 0.1


@pytest.fixture(scope="module")
def sp_generator() -> Generator:
    """A Llama-2-style SentencePiece BPE tokenizer and a tiny Llama.

    Like Llama-2's ``tokenizer.json``: normaliser ``Prepend("▁")`` + ``Replace(" ", "▁")`` (the
    SentencePiece dummy prefix), no pre-tokenizer, BOS added by the post-processor.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    text = ["Answer the question using the passages. Question: Which magazine was started first?",
            "Passages: [1] T0: passage about the fox and the magazine. Answer: Paris London 1844",
            "Arthur's Magazine was an American literary periodical published in Philadelphia."] * 4
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tk.train_from_iterator(text, trainer=trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                             show_progress=False))
    bos = tk.token_to_id("<s>")
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                  pad_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, initializer_range=0.2)
    return Generator.from_components(LlamaForCausalLM(cfg).eval(), tok, template="short", show_progress=False)


def test_sentencepiece_answer_tokens_follow_the_prompt(sp_generator: Generator) -> None:
    gen = sp_generator
    tok = gen.tokenizer
    prompt = gen.build_prompt(QUESTION, _passages())
    assert prompt.endswith("Answer:")
    joint = tok(prompt + " Paris")["input_ids"]
    alone = tok(" Paris", add_special_tokens=False)["input_ids"]
    # tokenised on its own the answer starts with a spurious "▁" that the joint text never has
    assert tok.convert_ids_to_tokens(alone)[0] == "\u2581"
    p_ids, a_ids = gen.encode_answers([prompt], ["Paris"])
    assert p_ids[0] + a_ids[0] == joint
    assert a_ids[0] != alone
    assert "\u2581" not in tok.convert_ids_to_tokens(a_ids[0])
    # and the score is the full forward's log-prob of exactly those tokens
    p = p_ids[0]
    a = a_ids[0]
    with torch.inference_mode():
        logits = gen.model(input_ids=torch.tensor([joint])).logits[0].float()
    ref = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(joint) - 1), torch.tensor(a)].double().numpy()
    np.testing.assert_allclose(gen.score([prompt], ["Paris"]).token_logprobs[0], ref, atol=1e-4)
    ps = _passages()
    res = gen.score_orderings([QUESTION], [ps], [[[0, 1, 2], [2, 0, 1]]], ["Paris"])[0]
    np.testing.assert_allclose(res.token_logprobs[0], ref, atol=1e-4)
    np.testing.assert_allclose(res.sum[1], gen.score([gen.build_prompt(QUESTION, [ps[2], ps[0], ps[1]])],
                                                     ["Paris"]).sum[0], atol=1e-4)


def test_slow_tokenizer_path_matches_offsets(sp_generator: Generator) -> None:
    """The incremental-prefix fallback (tokenizers without offsets) finds the same answer tokens."""
    from ragkit.generation.fitting import encode_answers

    class NoOffsets:
        is_fast = False

        def __init__(self, tok) -> None:  # noqa: ANN001
            self._tok = tok
            self.bos_token = tok.bos_token
            self.bos_token_id = tok.bos_token_id
            self.all_special_ids = tok.all_special_ids

        def __call__(self, texts, **kw):  # noqa: ANN001, ANN003, ANN204
            kw.pop("return_offsets_mapping", None)
            return self._tok(texts, **kw)

    gen = sp_generator
    prompt = gen.build_prompt(QUESTION, _passages())
    prompts = [prompt, "Question: x\nAnswer:", prompt + " "]
    answers = [" Paris", " 1844 London", "Arthur's Magazine"]
    assert encode_answers(NoOffsets(gen.tokenizer), prompts, answers) == encode_answers(gen.tokenizer, prompts, answers)
