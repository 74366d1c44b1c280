"""Answer similarities in [0, 1], batched: BLEU-2, token ROUGE-L, token F1, embedding cosine.

Shared by the PS-GRPO group rewards (:mod:`ragkit.training.rewards`) and the consistency metrics
(:mod:`ragkit.eval.consistency`). Every function takes aligned lists ``hyps, refs`` and returns
``sim[k] = similarity(hyps[k], refs[k])`` as a NumPy array. The names carry a ``sim_`` prefix so
they never clash with the evaluation metrics of :mod:`ragkit.eval.metrics` (``rouge_l`` there is
the MS MARCO metric with rouge-score's tokenizer, ``bleu`` is sacrebleu's BLEU-n).

Similarities (all in [0, 1], computed on SQuAD-normalised tokens from
``ragkit.text.normalize_answer``):

``"bleu2"`` (default)
    Sentence BLEU-2 of the hypothesis against one reference, with add-one smoothing of the
    bigram precision only ("BLEU+1", Lin & Och 2004)::

        p_1  = sum_w min(c_hyp(w), c_ref(w)) / #hyp tokens
        p_2  = (sum_bigram min(c_hyp, c_ref) + 1) / (#hyp bigrams + 1)
        BP   = 1 if c > r else exp(1 - r / c)        (c, r: hypothesis / reference length)
        BLEU2 = BP * sqrt(p_1 * p_2)

    Choice: the unigram precision is not smoothed, so answers with no word in common score 0
    (smoothing it would give two different one-word answers 0.71); identical answers score 1,
    one-word answers included. An empty hypothesis or reference scores 0.
``"rougel"``
    ROUGE-L F1 on normalised tokens: ``LCS / len(hyp)`` and ``LCS / len(ref)`` combined
    harmonically (``ragkit.eval.metrics.rouge_l`` is the MS MARCO metric with rouge-score's
    own tokenizer; this one shares the SQuAD normalisation of the other similarities).
``"f1"``
    SQuAD token F1 (:func:`ragkit.text.f1_score`).

Empty answers (after normalisation) never agree with anything: similarity 0 for every measure
here except ``"f1"``/``"cosine"`` given by other code; the group reward functions zero the
pairs with an empty side for all similarities.
``"cosine"``
    Cosine of sentence embeddings from an encoder (:func:`make_cosine_similarity`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.text import f1_score, normalize_answer

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

__all__ = [
    "SIMILARITIES",
    "PairSimilarity",
    "sim_bleu2",
    "sim_rouge_l",
    "sim_token_f1",
    "make_cosine_similarity",
    "get_similarity",
    "pairwise_similarity",
    "is_empty_answer",
]

PairSimilarity = Callable[[Sequence[str], Sequence[str]], np.ndarray]
"""A batched similarity: ``sim(hyps, refs)[k] = similarity(hyps[k], refs[k])`` for aligned lists."""

SIMILARITIES = ("bleu2", "rougel", "f1", "cosine")


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(normalize_answer(text).split())


def _ngram_counts(toks: tuple[str, ...], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))


class _TokenCache:
    """Normalised tokens and n-gram counts of each distinct string, computed once per batch."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.toks: dict[str, tuple[str, ...]] = {}
        self.grams: dict[str, tuple[Counter[tuple[str, ...]], Counter[tuple[str, ...]]]] = {}
        for t in set(texts):
            tk = _tokens(t)
            self.toks[t] = tk
            self.grams[t] = (_ngram_counts(tk, 1), _ngram_counts(tk, 2))


def _bleu2_cached(c: _TokenCache, hyp: str, ref: str) -> float:
    h, r = c.toks[hyp], c.toks[ref]
    if not h or not r:
        return 0.0
    logp = 0.0
    for n in (1, 2):
        hg, rg = c.grams[hyp][n - 1], c.grams[ref][n - 1]
        match = sum(min(v, rg[k]) for k, v in hg.items() if k in rg)
        total = max(len(h) - n + 1, 0)
        smooth = 0.0 if n == 1 else 1.0
        if match + smooth == 0:
            return 0.0
        logp += 0.5 * math.log((match + smooth) / (total + smooth))
    bp = 1.0 if len(h) > len(r) else math.exp(1.0 - len(r) / len(h))
    return bp * math.exp(logp)


def _lcs(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def _rouge_l_cached(c: _TokenCache, hyp: str, ref: str) -> float:
    h, r = c.toks[hyp], c.toks[ref]
    if not h or not r:
        return 0.0
    lcs = _lcs(h, r)
    if lcs == 0:
        return 0.0
    p, rec = lcs / len(h), lcs / len(r)
    return 2 * p * rec / (p + rec)


def _check_aligned(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if isinstance(hyps, str) or isinstance(refs, str):
        raise ValueError("similarities take lists of strings; wrap single strings: sim_bleu2([h], [r])")
    if len(hyps) != len(refs):
        raise ValueError(f"got {len(hyps)} hypotheses but {len(refs)} references; pass aligned lists")


def sim_bleu2(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Smoothed sentence BLEU-2 of each ``hyps[k]`` against ``refs[k]`` (see module docstring)."""
    _check_aligned(hyps, refs)
    c = _TokenCache([*hyps, *refs])
    return np.fromiter((_bleu2_cached(c, h, r) for h, r in zip(hyps, refs)), float, len(hyps))


def sim_rouge_l(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """ROUGE-L F1 (LCS on normalised tokens) of each ``hyps[k]`` against ``refs[k]``."""
    _check_aligned(hyps, refs)
    c = _TokenCache([*hyps, *refs])
    return np.fromiter((_rouge_l_cached(c, h, r) for h, r in zip(hyps, refs)), float, len(hyps))


def sim_token_f1(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """SQuAD token F1 of each pair (:func:`ragkit.text.f1_score`, memoised per distinct pair)."""
    _check_aligned(hyps, refs)
    memo: dict[tuple[str, str], float] = {}
    out = np.empty(len(hyps))
    for k, (h, r) in enumerate(zip(hyps, refs)):
        if (h, r) not in memo:
            memo[(h, r)] = float(f1_score(h, r))
        out[k] = memo[(h, r)]
    return out


def make_cosine_similarity(encoder: SentenceTransformer | str | None = None,
                           batch_size: int = 64) -> PairSimilarity:
    """Embedding cosine similarity: every distinct string is encoded once per call (batched).

    Parameters
    ----------
    encoder
        A loaded ``SentenceTransformer``, a name/path for ``ragkit.models.load_embedder``, or
        ``None`` for the embedded MiniLM default.
    batch_size
        Encoding batch size.

    Returns
    -------
    PairSimilarity
        ``sim(hyps, refs)[k] = max(0, cos(e(hyps[k]), e(refs[k])))`` (clipped at 0 so rewards
        stay in [0, 1]).
    """
    if encoder is None or isinstance(encoder, str):
        from ragkit.models import load_embedder

        encoder = load_embedder(encoder)
    enc = encoder

    def cosine(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
        _check_aligned(hyps, refs)
        uniq = sorted(set(hyps) | set(refs))
        if not uniq:
            return np.zeros(0)
        emb = np.asarray(enc.encode(uniq, batch_size=batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False), dtype=np.float64)
        idx = {t: i for i, t in enumerate(uniq)}
        a = emb[[idx[h] for h in hyps]]
        b = emb[[idx[r] for r in refs]]
        return np.clip(np.einsum("ij,ij->i", a, b), 0.0, 1.0)

    return cosine


_NAMED: dict[str, PairSimilarity] = {"bleu2": sim_bleu2, "rougel": sim_rouge_l, "rouge_l": sim_rouge_l,
                                     "f1": sim_token_f1}


def get_similarity(sim: str | PairSimilarity, encoder: Any = None) -> PairSimilarity:
    """Resolve a similarity name (``"bleu2"``, ``"rougel"``, ``"f1"``, ``"cosine"``) or pass a callable through."""
    if callable(sim):
        return sim
    if sim == "cosine":
        return make_cosine_similarity(encoder)
    if sim not in _NAMED:
        raise ValueError(f"unknown similarity {sim!r}; use one of {SIMILARITIES} or a callable(hyps, refs)")
    return _NAMED[sim]


def pairwise_similarity(texts_a: Sequence[str], texts_b: Sequence[str],
                        sim: str | PairSimilarity = "bleu2") -> np.ndarray:
    """Full matrix ``M[i, j] = sim(texts_a[i], texts_b[j])`` with one batched similarity call."""
    f = get_similarity(sim)
    a, b = list(texts_a), list(texts_b)
    if not a or not b:
        return np.zeros((len(a), len(b)))
    hyps = [x for x in a for _ in b]
    refs = b * len(a)
    return np.asarray(f(hyps, refs), dtype=float).reshape(len(a), len(b))


def is_empty_answer(texts: Sequence[str]) -> np.ndarray:
    """``True`` where a text is empty after answer normalisation (it never counts as agreement)."""
    return np.array([not _tokens(t) for t in texts], dtype=bool)
