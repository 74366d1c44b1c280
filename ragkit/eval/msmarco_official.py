"""The MS MARCO QnA leaderboard's answer metrics: BLEU-1..4 and ROUGE-L as its evaluation script
computes them.

The MS MARCO v2.1 QnA leaderboard (Nguyen et al., "MS MARCO: A Human Generated MAchine Reading
COmprehension Dataset", 2016; Bajaj et al., arXiv:1611.09268) scores answers with
``Evaluation/ms_marco_eval.py`` of ``microsoft/MSMARCO-Question-Answering``, which calls the COCO
caption scorers (Chen et al., "Microsoft COCO Captions: Data Collection and Evaluation Server",
arXiv:1504.00325, the ``pycocoevalcap`` ``Bleu`` and ``Rouge`` classes). This module is an
independent implementation of that protocol:

**Normalisation.** Every answer (reference and candidate) goes through spaCy's rule-based English
tokenizer (no model; ``spacy.blank("en")``); each token is stripped of surrounding white space and
lower-cased, and the tokens are joined with single spaces. A run of several spaces becomes an
empty token (kept: it yields a double space). A reference list containing ``"No Answer Present."``
marks a no-answer query: those queries are left out of BLEU and ROUGE-L.

**BLEU-n** (Papineni et al., "BLEU: a Method for Automatic Evaluation of Machine Translation",
ACL 2002), corpus level, n-grams of the white-space split of the normalised strings. With
``c_k`` = clipped matching k-grams (each k-gram of the candidate counted at most as often as in
the reference that has it most often) and ``g_k = max(0, |cand| - k + 1)`` summed over the
queries::

    BLEU-n = (prod_{k=1..n} (c_k + 1e-15) / (g_k + 1e-9)) ** (1/n) * BP
    BP     = exp(1 - r / t)  if t / r < 1 else 1,   t / r = (T + 1e-15) / (R + 1e-9)

where ``T`` is the total candidate length and ``R`` the sum over queries of the reference length
closest to the candidate's length (``"closest"``; a tie takes the shorter reference).

**ROUGE-L** (Lin, "ROUGE: A Package for Automatic Evaluation of Summaries", ACL 2004 workshop),
on the split at single spaces, ``beta = 1.2``. Per query, with ``LCS`` the longest common
subsequence of tokens and the maxima taken separately over the references::

    P = max_r LCS(c, r) / |c|,   R = max_r LCS(c, r) / |r|
    ROUGE-L = (1 + beta^2) P R / (R + beta^2 P)   (0 when P or R is 0)

and the corpus score is the mean over queries.

Two granularities:

* :func:`corpus_scores` -- the leaderboard numbers (corpus BLEU, mean ROUGE-L, no-answer
  queries excluded): use these beside published tables.
* :func:`answer_metrics` -- one question at a time (what the evaluation runner stores per
  question): ROUGE-L is the same per-query value, so its mean over answerable questions equals
  the corpus ROUGE-L; ``bleuN_official`` is BLEU-n of a one-question corpus, whose mean is *not*
  the corpus BLEU (a ratio of sums).

spaCy's tokenizer rules have changed a little since the 2018 script (spaCy 2.0); numbers can
differ in the last digit from tables computed then.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

__all__ = [
    "NO_ANSWER",
    "MAX_BLEU_ORDER",
    "ROUGE_BETA",
    "normalize",
    "bleu_scores",
    "rouge_l",
    "answer_metrics",
    "corpus_scores",
]

NO_ANSWER = "No Answer Present."
MAX_BLEU_ORDER = 4
ROUGE_BETA = 1.2
_TINY = 1e-15
_SMALL = 1e-9


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from ragkit.types import require_extra

    require_extra(["spacy"], "the MS MARCO official metrics (spaCy's English tokenizer)")
    import spacy

    return spacy.blank("en").tokenizer


def normalize(text: str) -> str:
    """Tokenise ``text`` with spaCy's English rules, strip and lower-case every token, join with
    single spaces (the script's ``normalize_batch``)."""
    if not isinstance(text, str):
        raise TypeError(f"answers must be strings, got {type(text).__name__}")
    return " ".join(str(t).strip().lower() for t in _tokenizer()(text))


def _ngrams(words: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    c: Counter[tuple[str, ...]] = Counter()
    for k in range(1, n + 1):
        for i in range(len(words) - k + 1):
            c[tuple(words[i:i + k])] += 1
    return c


def _bleu_stats(cand: str, refs: Sequence[str], n: int) -> tuple[int, int, list[int], list[int]]:
    """(candidate length, closest reference length, clipped matches per order, guesses per order)
    for normalised strings."""
    words = cand.split()
    ref_words = [r.split() for r in refs]
    max_ref: dict[tuple[str, ...], int] = {}
    for rw in ref_words:
        for g, cnt in _ngrams(rw, n).items():
            if cnt > max_ref.get(g, 0):
                max_ref[g] = cnt
    t = len(words)
    r = min((abs(len(rw) - t), len(rw)) for rw in ref_words)[1]
    correct = [0] * n
    for g, cnt in _ngrams(words, n).items():
        correct[len(g) - 1] += min(max_ref.get(g, 0), cnt)
    guess = [max(0, t - k + 1) for k in range(1, n + 1)]
    return t, r, correct, guess


def _bleu_from_stats(t: int, r: int, correct: Sequence[int], guess: Sequence[int]) -> list[float]:
    ratio = (t + _TINY) / (r + _SMALL)
    bp = math.exp(1 - 1 / ratio) if ratio < 1 else 1.0
    out, prod = [], 1.0
    for k in range(len(correct)):
        prod *= (correct[k] + _TINY) / (guess[k] + _SMALL)
        out.append(prod ** (1.0 / (k + 1)) * bp)
    return out


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def _rouge_normalized(cand: str, refs: Sequence[str], beta: float) -> float:
    c = cand.split(" ")
    prec, rec = [], []
    for ref in refs:
        rt = ref.split(" ")
        lcs = _lcs(rt, c)
        prec.append(lcs / len(c))
        rec.append(lcs / len(rt))
    p, r = max(prec), max(rec)
    if p == 0 or r == 0:
        return 0.0
    return (1 + beta ** 2) * p * r / (r + beta ** 2 * p)


def _refs(references: str | Iterable[str]) -> list[str]:
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        raise ValueError("no reference answers given; pass at least one reference string")
    return refs


def bleu_scores(prediction: str, references: str | Iterable[str],
                max_order: int = MAX_BLEU_ORDER) -> list[float]:
    """BLEU-1..``max_order`` of one prediction as a one-query corpus (formula in the module
    docstring); raw strings, normalised here."""
    if max_order < 1:
        raise ValueError(f"max_order must be >= 1, got {max_order}")
    refs = [normalize(r) for r in _refs(references)]
    return _bleu_from_stats(*_bleu_stats(normalize(prediction), refs, max_order))


def rouge_l(prediction: str, references: str | Iterable[str], beta: float = ROUGE_BETA) -> float:
    """ROUGE-L of one prediction against its references (module docstring: precision and recall
    are maximised separately over the references, ``beta = 1.2``)."""
    refs = [normalize(r) for r in _refs(references)]
    return _rouge_normalized(normalize(prediction), refs, beta)


def answer_metrics(prediction: str, references: str | Iterable[str]) -> dict[str, float]:
    """Per-question ``rougeL_official`` and ``bleu1_official`` .. ``bleu4_official``.

    Empty when the question has no answer (no references or ``"No Answer Present."``), as the
    leaderboard leaves those questions out.
    """
    refs = [references] if isinstance(references, str) else list(references)
    if not refs or NO_ANSWER in refs:
        return {}
    cand = normalize("" if prediction == NO_ANSWER else prediction)
    nrefs = [normalize(r) for r in refs]
    out = {"rougeL_official": _rouge_normalized(cand, nrefs, ROUGE_BETA)}
    for k, b in enumerate(_bleu_from_stats(*_bleu_stats(cand, nrefs, MAX_BLEU_ORDER)), 1):
        out[f"bleu{k}_official"] = b
    return out


def corpus_scores(predictions: Sequence[str],
                  references: Sequence[str | Sequence[str]]) -> dict[str, float]:
    """The leaderboard's scores over a set of questions.

    Parameters
    ----------
    predictions
        One answer string per question (``"No Answer Present."`` is scored as an empty answer).
    references
        The reference answers of each question (a string or a list of strings).

    Returns
    -------
    dict
        ``bleu_1`` .. ``bleu_4`` (corpus BLEU), ``rouge_l`` (mean ROUGE-L) and ``n`` (questions
        scored), over the questions whose references are not ``"No Answer Present."``.
    """
    if len(predictions) != len(references):
        raise ValueError(
            f"{len(predictions)} predictions but {len(references)} reference lists; "
            "give one prediction per question"
        )
    t_sum = r_sum = 0
    correct = [0] * MAX_BLEU_ORDER
    guess = [0] * MAX_BLEU_ORDER
    rouges: list[float] = []
    for pred, ref in zip(predictions, references):
        refs = _refs(ref)
        if NO_ANSWER in refs:
            continue
        cand = normalize("" if pred == NO_ANSWER else pred)
        nrefs = [normalize(r) for r in refs]
        t, r, c, g = _bleu_stats(cand, nrefs, MAX_BLEU_ORDER)
        t_sum, r_sum = t_sum + t, r_sum + r
        correct = [a + b for a, b in zip(correct, c)]
        guess = [a + b for a, b in zip(guess, g)]
        rouges.append(_rouge_normalized(cand, nrefs, ROUGE_BETA))
    if not rouges:
        raise ValueError("every question is a no-answer question; nothing to score")
    out = {f"bleu_{k}": b for k, b in
           enumerate(_bleu_from_stats(t_sum, r_sum, correct, guess), 1)}
    out["rouge_l"] = sum(rouges) / len(rouges)
    out["n"] = float(len(rouges))
    return out
