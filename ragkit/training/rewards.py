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

Similarities: :mod:`ragkit.similarity` (``"bleu2"`` default, ``"rougel"``, ``"f1"``,
``"cosine"``), all in [0, 1] on SQuAD-normalised tokens; the group reward functions zero the
pairs with an empty side for all similarities, so empty answers never agree with anything.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from ragkit.similarity import PairSimilarity, get_similarity, is_empty_answer

logger = logging.getLogger(__name__)

__all__ = [
    "gold_f1",
    "group_similarity_rewards",
    "approx_group_similarity_rewards",
    "exact_comparisons",
    "approx_comparisons",
]


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
    empty = is_empty_answer(flat)
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
    empty = is_empty_answer(flat)
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
