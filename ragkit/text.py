"""Answer text: the ONE answer extractor and the ONE answer normaliser of ragkit.

Evaluation defines which answer is scored, and every other part (the generator, the debiasing
outcomes, the PS-GRPO rewards) reads a model's answer with the same function,
:func:`extract_answer`, and compares answers after the same normalisation,
:func:`normalize_answer`.

Answer extraction (:func:`extract_answer`)
------------------------------------------
Applied in this order to a raw completion:

1. **Stop strings** (optional ``stops``): cut at the earliest occurrence of any stop string found
   *after the completion's leading white space* (a ``"\\n"`` stop does not end an answer that
   starts on a new line before it has begun). This is exactly where decoding stops in
   :meth:`ragkit.generation.Generator.generate`, so extracting from a raw sampled completion
   (PS-GRPO) and from an already cut generation (evaluation) gives the same answer.
2. **First non-empty line**, stripped.
3. **Lead-ins removed**, repeatedly and case-insensitively: ``"The answer is"`` (with or without
   a colon), ``"Answer:"``, ``"A:"`` and a citation marker such as ``"[3]"``.
4. **Surrounding white space and double quotes** stripped.

Reconciliation: the former PS-GRPO ``clean_completion`` ignored a stop string at the very start
of the completion and removed only ``"Answer:"``; the former ``Generator.clean_answer`` did not
cut at stop strings itself. Both now call :func:`extract_answer` with evaluation's rules above,
so an answer the reward sees is the answer the metric scores.

Normalisation and SQuAD scores
------------------------------
:func:`normalize_answer`, :func:`exact_match`, :func:`f1_precision_recall` and :func:`f1_score`
reproduce the official HotpotQA evaluation script (Yang et al., EMNLP 2018), itself derived from
SQuAD v1.1 (Rajpurkar et al., EMNLP 2016): lowercase, drop ASCII punctuation, drop the articles
``a|an|the``, collapse white space; token F1 over the normalised tokens, where a prediction or
reference that normalises to ``yes``, ``no`` or ``noanswer`` scores 0 unless both are equal.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "normalize_answer",
    "extract_answer",
    "cut_at_stop",
    "exact_match",
    "f1_precision_recall",
    "f1_score",
]

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")
_LEAD = re.compile(r"^\s*(?:the\s+answer\s+is\s*:?|answer\s*:|a\s*:|\[\d+\])\s*", re.IGNORECASE)


def normalize_answer(s: str) -> str:
    """SQuAD/HotpotQA answer normalisation (Rajpurkar et al., 2016; Yang et al., 2018).

    ``white_space_fix(remove_articles(remove_punc(lower(s))))``: lowercase, delete every
    character of ``string.punctuation``, replace the words ``a``, ``an``, ``the`` by a space,
    then join the white-space-split tokens with single spaces.

    Examples
    --------
    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    s = str(s).lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def cut_at_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest stop string found after ``text``'s leading white space.

    ``None`` when no stop string occurs there. Empty stop strings are ignored.

    Examples
    --------
    >>> cut_at_stop("\\nParis\\nQuestion: x", ["\\n"])
    6
    >>> cut_at_stop("Paris", ["\\n"]) is None
    True
    """
    if isinstance(stops, str):
        raise ValueError(f"stops must be a sequence of strings, got the string {stops!r}; wrap it: [{stops!r}]")
    start = len(text) - len(text.lstrip())
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def extract_answer(completion: str, stops: Sequence[str] = ()) -> str:
    """The answer inside a model completion (the rules of the module docstring).

    Parameters
    ----------
    completion
        Raw generated text (already cut at stop strings or not).
    stops
        Stop strings of the prompt template; the completion is cut at the first one found after
        its leading white space (``()``: no cut).

    Returns
    -------
    str
        The answer, possibly empty.

    Examples
    --------
    >>> extract_answer('The answer is: [2] "Arthur\\'s Magazine"\\nmore')
    "Arthur's Magazine"
    >>> extract_answer("Paris Question: next", stops=["\\n", "Question:"])
    'Paris'
    """
    text = str(completion)
    cut = cut_at_stop(text, stops) if stops else None
    if cut is not None:
        text = text[:cut]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    prev = None
    while prev != first:
        prev, first = first, _LEAD.sub("", first, count=1)
    return first.strip().strip('"').strip()


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalised prediction equals the normalised reference, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def f1_precision_recall(prediction: str, reference: str) -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) as in the official HotpotQA script.

    With ``P`` and ``G`` the normalised token multisets, ``c = |P ∩ G|``,
    ``precision = c/|P|``, ``recall = c/|G|``, ``F1 = 2·p·r/(p+r)``; 0 when ``c = 0``, and 0 when
    either side normalises to ``yes``/``no``/``noanswer`` and the two differ.
    """
    pred = normalize_answer(prediction)
    ref = normalize_answer(reference)
    if (pred in _SPECIAL or ref in _SPECIAL) and pred != ref:
        return 0.0, 0.0, 0.0
    p_toks, r_toks = pred.split(), ref.split()
    common = Counter(p_toks) & Counter(r_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(p_toks)
    recall = same / len(r_toks)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_score(prediction: str, reference: str) -> float:
    """Token F1 of the HotpotQA script (see :func:`f1_precision_recall`)."""
    return f1_precision_recall(prediction, reference)[0]
