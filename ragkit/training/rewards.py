"""Group similarity rewards for PS-GRPO (paraphrase-set GRPO).

Hamman et al., "Improving Consistency in Retrieval-Augmented Systems with Group Similarity
Rewards", NeurIPS 2025, arXiv 2510.04392 (PS-GRPO / Con-RAG).

A paraphrase set has ``n`` members (the same question worded ``n`` ways); the policy samples
``g`` rollouts ``y_ij`` for every member ``i``. The **group similarity reward** of a rollout is
its mean similarity to the rollouts of the *other* members::

    r_ij = 1 / ((n - 1) g) * sum_{i' != i} sum_{j'=1..g} sim(y_ij, y_i'j')   [+ w * F1(y_ij, gold)]

It is maximal when every member gets the same answer, and a member whose answers disagree with
the rest gets the lowest reward. Exact computation costs ``n g (n - 1) g`` similarity calls.

**Scalable approximation** (this module's :func:`approx_group_similarity_rewards`): for each
member ``i`` draw ``kappa`` other members uniformly without replacement and ``s`` rollouts of
each uniformly without replacement, ONCE; the resulting ``kappa * s`` references ``R_i`` are
shared by all ``g`` rollouts of ``i``::

    r^_ij = 1 / (kappa s) * sum_{y in R_i} sim(y_ij, y)

Every ``y_i'j'`` (``i' != i``) is in ``R_i`` with probability ``kappa/(n-1) * s/g``, so
``E[r^_ij] = r_ij`` (unbiased), at ``n g kappa s`` calls (72 instead of 480 at n=6, g=4,
kappa=3, s=1).

Similarities (all in [0, 1], computed on SQuAD-normalised tokens from
``ragkit.eval.metrics.normalize_answer``):

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
    SQuAD token F1 (``ragkit.eval.metrics.f1_score``).

Empty answers (after normalisation) never agree with anything: similarity 0 for every measure
here except ``"f1"``/``"cosine"`` given by other code; the group reward functions zero the
pairs with an empty side for all similarities.
``"cosine"``
    Cosine of sentence embeddings from an encoder (:func:`make_cosine_similarity`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

__all__ = [
    "SIMILARITIES",
    "PairSimilarity",
    "bleu2",
    "rouge_l",
    "token_f1",
    "make_cosine_similarity",
    "get_similarity",
    "pairwise_similarity",
    "gold_f1",
    "group_similarity_rewards",
    "approx_group_similarity_rewards",
    "exact_comparisons",
    "approx_comparisons",
]

PairSimilarity = Callable[[Sequence[str], Sequence[str]], np.ndarray]
"""A batched similarity: ``sim(hyps, refs)[k] = similarity(hyps[k], refs[k])`` for aligned lists."""

SIMILARITIES = ("bleu2", "rougel", "f1", "cosine")


def _tokens(text: str) -> tuple[str, ...]:
    from ragkit.eval.metrics import normalize_answer

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
        raise ValueError("similarities take lists of strings; wrap single strings: bleu2([h], [r])")
    if len(hyps) != len(refs):
        raise ValueError(f"got {len(hyps)} hypotheses but {len(refs)} references; pass aligned lists")


def bleu2(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """Smoothed sentence BLEU-2 of each ``hyps[k]`` against ``refs[k]`` (see module docstring)."""
    _check_aligned(hyps, refs)
    c = _TokenCache([*hyps, *refs])
    return np.fromiter((_bleu2_cached(c, h, r) for h, r in zip(hyps, refs)), float, len(hyps))


def rouge_l(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """ROUGE-L F1 (LCS on normalised tokens) of each ``hyps[k]`` against ``refs[k]``."""
    _check_aligned(hyps, refs)
    c = _TokenCache([*hyps, *refs])
    return np.fromiter((_rouge_l_cached(c, h, r) for h, r in zip(hyps, refs)), float, len(hyps))


def token_f1(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """SQuAD token F1 of each pair (``ragkit.eval.metrics.f1_score``, memoised per distinct pair)."""
    from ragkit.eval.metrics import f1_score

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


_NAMED: dict[str, PairSimilarity] = {"bleu2": bleu2, "rougel": rouge_l, "rouge_l": rouge_l, "f1": token_f1}


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


def gold_f1(completions: Sequence[str], golds: Sequence[str] | None) -> np.ndarray:
    """``max_a F1(y, a)`` over the gold aliases ``golds`` for every completion (0 when no gold)."""
    if not golds:
        return np.zeros(len(completions))
    from ragkit.eval.metrics import f1_max

    refs = list(golds)
    return np.array([float(f1_max(y, refs)) for y in completions])


def _check_rollouts(rollouts: Sequence[Sequence[str]]) -> tuple[int, int]:
    if isinstance(rollouts, str) or not rollouts or isinstance(rollouts[0], str):
        raise ValueError("rollouts must be a list of n lists of g strings (n paraphrases x g rollouts)")
    n, g = len(rollouts), len(rollouts[0])
    if any(len(r) != g for r in rollouts):
        raise ValueError(f"every paraphrase needs the same number of rollouts; got {[len(r) for r in rollouts]}")
    if n < 2:
        raise ValueError(f"a paraphrase set needs at least 2 members for a group reward, got n={n}")
    if g < 1:
        raise ValueError("g (rollouts per paraphrase) must be >= 1")
    return n, g


def _empty_mask(texts: Sequence[str]) -> np.ndarray:
    """``True`` where a text is empty after answer normalisation (it never counts as agreement)."""
    return np.array([not _tokens(t) for t in texts], dtype=bool)


def exact_comparisons(n: int, g: int) -> int:
    """Similarity calls of the exact reward: ``n g (n - 1) g``."""
    return n * g * (n - 1) * g


def approx_comparisons(n: int, g: int, kappa: int, s: int) -> int:
    """Similarity calls of the approximation: ``n g min(kappa, n-1) min(s, g)``."""
    return n * g * min(kappa, n - 1) * min(s, g)


def group_similarity_rewards(
    rollouts: Sequence[Sequence[str]],
    sim: str | PairSimilarity = "bleu2",
    gold: Sequence[str] | None = None,
    gold_weight: float = 0.0,
    return_count: bool = False,
) -> np.ndarray | tuple[np.ndarray, int]:
    """Exact group similarity reward of every rollout of one paraphrase set.

    ``r_ij = mean_{i' != i, j'} sim(y_ij, y_i'j') + w * max_a F1(y_ij, a)`` (Hamman et al.,
    NeurIPS 2025, arXiv 2510.04392); all ``n g (n-1) g`` pairs go to ONE batched ``sim`` call.

    Parameters
    ----------
    rollouts
        ``rollouts[i][j]`` = rollout ``j`` of paraphrase ``i`` (``n`` lists of ``g`` strings).
    sim
        Similarity name (``"bleu2"``, ``"rougel"``, ``"f1"``, ``"cosine"``) or a batched
        callable ``sim(hyps, refs) -> array`` of aligned pair similarities.
    gold
        Gold answer aliases of the set (optional).
    gold_weight
        ``w`` of the gold F1 term (ignored without ``gold``).
    return_count
        Also return the number of similarity evaluations.

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, int)
        Rewards of shape ``(n, g)`` (and the comparison count).
    """
    n, g = _check_rollouts(rollouts)
    f = get_similarity(sim)
    flat = [y for r in rollouts for y in r]
    member = np.repeat(np.arange(n), g)
    hi, ri = np.nonzero(member[:, None] != member[None, :])  # all cross-member pairs, row-major
    vals = np.asarray(f([flat[k] for k in hi], [flat[k] for k in ri]), dtype=float)
    empty = _empty_mask(flat)
    vals[empty[hi] | empty[ri]] = 0.0
    rewards = vals.reshape(n * g, (n - 1) * g).mean(axis=1).reshape(n, g)
    if gold_weight and gold:
        rewards = rewards + gold_weight * gold_f1(flat, gold).reshape(n, g)
    return (rewards, int(vals.size)) if return_count else rewards


def approx_group_similarity_rewards(
    rollouts: Sequence[Sequence[str]],
    kappa: int = 3,
    s: int = 1,
    rng: np.random.Generator | int | None = None,
    sim: str | PairSimilarity = "bleu2",
    gold: Sequence[str] | None = None,
    gold_weight: float = 0.0,
) -> tuple[np.ndarray, int]:
    """Unbiased sampled group similarity reward (``n g kappa s`` similarity calls).

    For each paraphrase ``i``: draw ``kappa`` other paraphrases without replacement and ``s``
    rollouts of each without replacement, once; the ``kappa s`` references are shared by the
    ``g`` rollouts of ``i``: ``r^_ij = mean_{y in R_i} sim(y_ij, y)`` (+ ``w F1``). See the
    module docstring for the unbiasedness argument. ``kappa >= n - 1`` and ``s >= g`` reduce to
    the exact reward.

    Parameters
    ----------
    rollouts
        ``n`` lists of ``g`` rollouts.
    kappa
        Other paraphrases drawn per paraphrase (clipped to ``n - 1``).
    s
        Rollouts drawn per drawn paraphrase (clipped to ``g``).
    rng
        ``numpy.random.Generator`` or seed (``None``: seed 0, for determinism).
    sim, gold, gold_weight
        As in :func:`group_similarity_rewards`.

    Returns
    -------
    (numpy.ndarray, int)
        Rewards ``(n, g)`` and the number of similarity evaluations made.
    """
    n, g = _check_rollouts(rollouts)
    if kappa < 1 or s < 1:
        raise ValueError(f"kappa and s must be >= 1, got kappa={kappa}, s={s}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(0 if rng is None else rng)
    k, ss = min(kappa, n - 1), min(s, g)
    f = get_similarity(sim)
    flat = [y for r in rollouts for y in r]
    empty = _empty_mask(flat)
    hi: list[int] = []
    ri: list[int] = []
    for i in range(n):
        others = np.delete(np.arange(n), i)
        chosen = gen.choice(others, size=k, replace=False)
        ref_i = [int(o) * g + int(j) for o in chosen for j in gen.choice(g, size=ss, replace=False)]
        for j in range(g):
            hi.extend([i * g + j] * len(ref_i))
            ri.extend(ref_i)
    vals = np.asarray(f([flat[x] for x in hi], [flat[x] for x in ri]), dtype=float)
    vals[empty[hi] | empty[ri]] = 0.0
    rewards = vals.reshape(n, g, k * ss).mean(axis=2)
    if gold_weight and gold:
        rewards = rewards + gold_weight * gold_f1(flat, gold).reshape(n, g)
    return rewards, int(vals.size)
