"""Paraphrase sets for consistency training and evaluation (PS-GRPO / Con-RAG).

A *paraphrase set* is one question asked in several ways. PS-GRPO (Hamman et al., "Improving
Consistency in Retrieval-Augmented Systems with Group Similarity Rewards", NeurIPS 2025,
arXiv 2510.04392) samples answers for every member of a set and rewards answers that agree
with the answers given to the *other* members; the Con-RAG consistency metrics compare the
outputs across the members.

Convention (used by every paraphraser here): ``paraphrase(questions, n)`` returns, for each
question, exactly ``n`` paraphrases that are pairwise distinct and distinct from the original
(compared after lower-casing, removing punctuation and collapsing white space). The original
is **not** included; a :class:`ParaphraseSet` adds it back as its first member when asked.

Paraphrasers
------------
:class:`RuleParaphraser`
    Offline and deterministic: question-word reorderings ("What is X?" -> "X is what?"),
    a small synonym table, request frames ("Tell me ...", "I want to know ...",
    "Do you know ...", "Can you tell me ..."), contractions and their expansions.
:class:`LLMParaphraser`
    One batched, sampled ``Generator.generate`` call with a few-shot rewrite prompt; outputs
    are cleaned, de-duplicated and (optionally) screened by a :class:`RewriteFilter`, further
    samples are drawn for the questions still short (``tries``), and the rule paraphraser fills
    any shortfall. :meth:`LLMParaphraser.paraphrase_with_report` returns the rewrites with how
    each was made (:class:`ParaphraseReport`).

:func:`set_diversity` measures how different a set's wordings are (mean pairwise token Jaccard,
share of pairs identical after answer normalisation).
"""

from __future__ import annotations

import logging
import re
import string
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ragkit.text import normalize_answer
from ragkit.types import Passage, QARecord, RankedList


class TextGenerator(Protocol):
    """What :class:`LLMParaphraser` needs of a generator (``ragkit.generation.Generator`` fits)."""

    def generate(self, prompts: Sequence[str], max_new_tokens: int = ..., stop: Sequence[str] | None = ...,
                 temperature: float = ..., n: int = ..., seed: int = ..., top_p: float = ...) -> Any: ...


class Searcher(Protocol):
    """What :func:`build_paraphrase_sets` needs of a retriever (every ``ragkit.retrievers`` one fits)."""

    def search(self, queries: Sequence[str], k: int = ...) -> list[RankedList]: ...


logger = logging.getLogger(__name__)

__all__ = [
    "Paraphraser",
    "RuleParaphraser",
    "LLMParaphraser",
    "ParaphraseReport",
    "ParaphraseSet",
    "RewriteFilter",
    "build_paraphrase_sets",
    "keeps_question_form",
    "key_terms",
    "paraphrase_key",
    "set_diversity",
    "token_jaccard",
]

_PUNCT_RE = re.compile(f"[{re.escape(string.punctuation)}]")


def paraphrase_key(text: str) -> str:
    """De-duplication key of a question: lower-cased, punctuation removed, spaces collapsed.

    Two paraphrases are "the same" when their keys are equal. (This is a string identity test,
    not answer normalisation; answers are compared with ``ragkit.eval.metrics``.)
    """
    return " ".join(_PUNCT_RE.sub(" ", text.lower()).split())


def _check_inputs(questions: Sequence[str], n: int) -> list[str]:
    if isinstance(questions, str):
        raise ValueError("questions must be a list of strings, not a single string; wrap it: [q]")
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative integer (paraphrases per question), got {n!r}")
    out = []
    for i, q in enumerate(questions):
        if not isinstance(q, str) or not q.strip():
            raise ValueError(f"questions[{i}] must be a non-empty string, got {q!r}")
        out.append(" ".join(q.split()))
    return out


class Paraphraser:
    """Base class: ``paraphrase(questions, n)`` -> ``n`` distinct rewrites per question.

    Subclasses implement :meth:`_paraphrase`; the base class validates the input and checks
    the output convention (exactly ``n`` strings, distinct, none equal to the original).
    """

    name: str = "base"

    def paraphrase(self, questions: Sequence[str], n: int) -> list[list[str]]:
        """Return ``n`` paraphrases of each question (the original is not included).

        Parameters
        ----------
        questions
            Questions to rewrite.
        n
            Paraphrases per question.

        Returns
        -------
        list[list[str]]
            ``out[i]`` holds ``n`` pairwise-distinct rewrites of ``questions[i]``.
        """
        qs = _check_inputs(questions, n)
        if not qs or n == 0:
            return [[] for _ in qs]
        out = self._paraphrase(qs, int(n))
        if len(out) != len(qs):  # pragma: no cover - guards subclasses
            raise RuntimeError(f"{type(self).__name__} returned {len(out)} lists for {len(qs)} questions")
        for q, ps in zip(qs, out):
            keys = {paraphrase_key(p) for p in ps}
            if len(ps) != n or len(keys) != n or paraphrase_key(q) in keys:  # pragma: no cover
                raise RuntimeError(f"{type(self).__name__} broke the paraphrase convention for {q!r}")
        return out

    def _paraphrase(self, questions: list[str], n: int) -> list[list[str]]:
        raise NotImplementedError


# ----------------------------------------------------------------------------- rule-based
_SYNONYMS: tuple[tuple[str, str], ...] = (
    ("film", "movie"),
    ("films", "movies"),
    ("located", "situated"),
    ("famous", "well-known"),
    ("largest", "biggest"),
    ("larger", "bigger"),
    ("began", "started"),
    ("begin", "start"),
    ("founded", "established"),
    ("created", "made"),
    ("wrote", "authored"),
    ("written", "authored"),
    ("born", "birthed"),
    ("also", "as well"),
    ("American", "US"),
    ("country", "nation"),
    ("town", "municipality"),
    ("song", "track"),
    ("singer", "vocalist"),
    ("died", "passed away"),
    ("member", "part"),
    ("company", "firm"),
    ("magazine", "periodical"),
    ("known", "recognised"),
    ("named", "called"),
    ("older", "born earlier"),
)
_CONTRACTIONS: tuple[tuple[str, str], ...] = (
    ("what is", "what's"),
    ("who is", "who's"),
    ("where is", "where's"),
    ("when is", "when's"),
    ("how is", "how's"),
    ("is not", "isn't"),
    ("was not", "wasn't"),
    ("are not", "aren't"),
    ("does not", "doesn't"),
    ("did not", "didn't"),
)
_WH = ("what", "which", "who", "whom", "whose", "when", "where", "why", "how")
_AUX = ("is", "was", "are", "were")
_WH_AUX_RE = re.compile(r"^(what|who|which)\s+(is|was|are|were)\s+(.+)$", re.IGNORECASE)
_IN_WHAT_RE = re.compile(r"^in\s+(what|which)\s+(.+)$", re.IGNORECASE)
_FRAMES: tuple[str, ...] = (
    "Tell me {e}.",
    "I want to know {e}.",
    "Do you know {e}?",
    "Can you tell me {e}?",
    "Could you tell me {e}?",
    "I would like to know {e}.",
    "Please tell me {e}.",
    "I'm curious: {q}",
    "Question: {q}",
    "{q} Please answer briefly.",
    "Quick question, {ql}",
    "Here is my question: {q}",
)


def _strip_q(q: str) -> str:
    return q.strip().rstrip("?.! ").strip()


def _lower_first(s: str) -> str:
    if len(s) > 1 and s[1].isupper():  # acronym ("US", "NBA")
        return s
    return s[:1].lower() + s[1:]


def _upper_first(s: str) -> str:
    return s[:1].upper() + s[1:]


def _embedded(q: str) -> str | None:
    """An embedded-question form, or ``None`` when the question does not start with a wh-word.

    "What is X?" -> "what X is" (subject-aux inversion undone); other wh-questions are kept
    as they are ("which magazine was started first"). Declarative questions ("The band ... in
    what city?") and yes/no questions get ``None``: the frames then use a colon form.
    """
    body = _strip_q(q)
    m = _WH_AUX_RE.match(body)
    if m:
        wh, aux, rest = m.groups()
        return f"{wh.lower()} {rest} {aux.lower()}"
    first = body.split()[0].lower() if body.split() else ""
    if first in _WH or (first == "in" and _IN_WHAT_RE.match(body)):
        return _lower_first(body)
    return None


def _reorderings(q: str) -> list[str]:
    """Question-word movements that keep the meaning."""
    body = _strip_q(q)
    out: list[str] = []
    m = _WH_AUX_RE.match(body)
    if m:
        wh, aux, rest = m.groups()
        out.append(f"{_upper_first(rest)} {aux.lower()} {wh.lower()}?")
    m = _IN_WHAT_RE.match(body)
    if m:
        wh, rest = m.groups()
        out.append(f"{_upper_first(wh.lower())} {rest}?")
    words = body.split()
    if words and words[0].lower() == "which":
        out.append("What " + " ".join(words[1:]) + "?")
    elif words and words[0].lower() == "what" and len(words) > 2 and words[1].lower() not in _AUX:
        out.append("Which " + " ".join(words[1:]) + "?")
    return out


def _swap_words(text: str, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """One rewrite per applicable pair (both directions, whole words, case of the first letter kept).

    A lower-case entry matches whatever the case of its first letter ("who is" also swaps a
    sentence-initial "Who is"); an entry with a capital ("US", "American") is a name and matches
    only as written, so the pronoun "us" never becomes "American".
    """
    out = []
    for a, b in pairs:
        for src, dst in ((a, b), (b, a)):
            flags = re.IGNORECASE if src == src.lower() else 0
            pat = re.compile(rf"\b{re.escape(src)}\b", flags)
            if pat.search(text):

                def repl(mt: re.Match[str], dst: str = dst) -> str:
                    return _upper_first(dst) if mt.group(0)[0].isupper() else dst

                out.append(pat.sub(repl, text, count=1))
    return out


def _rule_candidates(q: str) -> list[str]:
    """Every rule rewrite of ``q`` in a fixed order (may contain duplicates)."""
    body = _strip_q(q)
    e = _embedded(q)
    ql = _lower_first(q)
    base = [q if q.endswith("?") else body + "?"]
    first: list[str] = []
    first += _reorderings(q)
    for f in _FRAMES:
        if "{e}" in f and e is None:  # "Tell me {e}." -> "Tell me: <question>"
            f = f.split("{e}")[0].rstrip() + ": {q}"
        first.append(f.format(e=e, q=base[0], ql=ql if ql.endswith("?") else ql + "?"))
    first += _swap_words(base[0], _SYNONYMS)
    first += _swap_words(base[0], _CONTRACTIONS)
    # second order: synonyms / contractions inside the frames and reorderings
    second: list[str] = []
    for c in first[:6]:
        second += _swap_words(c, _SYNONYMS)
        second += _swap_words(c, _CONTRACTIONS)
    return first + second


class RuleParaphraser(Paraphraser):
    """Offline, deterministic rule-based paraphrases.

    Candidates (question-word reorderings, request frames such as "Tell me ..." /
    "I want to know ..." / "Do you know ...", synonym swaps from a small table, contractions
    and their expansions, and second-order combinations of these) are generated in a fixed
    order, de-duplicated with :func:`paraphrase_key`, shuffled with a generator seeded by
    ``(seed, crc32(question))`` and the first ``n`` are returned. The same ``(seed, question)``
    always gives the same list, whatever else is in the batch.

    Parameters
    ----------
    seed
        Seed of the per-question shuffle.
    shuffle
        ``False`` keeps the fixed candidate order (reorderings first, then frames).

    Raises
    ------
    ValueError
        When a question has fewer than ``n`` distinct rule rewrites (at least 12 frames always
        apply, so this only happens for ``n`` above about 14).
    """

    name = "rule"

    def __init__(self, seed: int = 0, shuffle: bool = True) -> None:
        self.seed = int(seed)
        self.shuffle = bool(shuffle)

    def candidates(self, question: str) -> list[str]:
        """All distinct rule rewrites of ``question`` (original excluded), in shuffled order."""
        q = " ".join(question.split())
        seen = {paraphrase_key(q)}
        uniq: list[str] = []
        for c in _rule_candidates(q):
            c = " ".join(c.split())
            k = paraphrase_key(c)
            if k and k not in seen:
                seen.add(k)
                uniq.append(c)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, zlib.crc32(q.encode("utf-8"))])
            uniq = [uniq[i] for i in rng.permutation(len(uniq))]
        return uniq

    def _paraphrase(self, questions: list[str], n: int) -> list[list[str]]:
        out = []
        for q in questions:
            cands = self.candidates(q)
            if len(cands) < n:
                raise ValueError(
                    f"RuleParaphraser has only {len(cands)} distinct rewrites of {q!r} but n={n}; "
                    "lower n or use LLMParaphraser"
                )
            out.append(cands[:n])
        return out


# ----------------------------------------------------------------------------- LLM-based
_LLM_PROMPT = (
    "Rewrite the question in different words. Keep its exact meaning and all names.\n\n"
    "Question: Which city is the capital of France?\n"
    "Rewrite: What is the name of France's capital city?\n\n"
    "Question: Who wrote the novel Moby-Dick?\n"
    "Rewrite: Moby-Dick was written by which author?\n\n"
    "Question: {q}\n"
    "Rewrite:"
)
_PREFIX_RE = re.compile(r"^\s*(rewrite|question|paraphrase|answer)\s*\d*\s*[:.)-]\s*", re.IGNORECASE)


def clean_paraphrase(text: str, original: str, max_ratio: float = 3.0) -> str | None:
    """Clean one generated rewrite; ``None`` when it is unusable.

    First line only, leading labels ("Rewrite:", "Question 2:") and quotes removed, spaces
    collapsed. The rewrite of a question ends at its first question mark: small models run on
    with further questions of their own ("What is the elevation of the Peak Galleria? Is it
    above sea level? Is it ..."), which are not part of the rewrite. Rejected when empty, shorter
    than 3 words, longer than ``max_ratio`` times the original (in words) or identical to the
    original (:func:`paraphrase_key`).
    """
    line = text.strip().split("\n", 1)[0]
    line = _PREFIX_RE.sub("", line).strip().strip("\"'`“”‘’ ").strip()
    if original.rstrip().endswith("?") and "?" in line:
        line = line[: line.index("?") + 1]
    line = " ".join(line.split())
    if len(line.split()) < 3:
        return None
    if len(line.split()) > max_ratio * max(len(original.split()), 3):
        return None
    if paraphrase_key(line) == paraphrase_key(original):
        return None
    return line


def token_jaccard(a: str, b: str) -> float:
    """``|A ∩ B| / |A ∪ B|`` of the two texts' word sets (words of :func:`paraphrase_key`); 1.0 when both are empty."""
    ta, tb = set(paraphrase_key(a).split()), set(paraphrase_key(b).split())
    if not ta and not tb:
        return 1.0
    return len(ta & tb) / len(ta | tb)


_CAP_RE = re.compile(r"[A-Z][\w'’.-]*")
_POSSESSIVE_RE = re.compile(r"['’]s?$")
_OPENERS = frozenset({*_WH, *_AUX, "in", "on", "at", "for", "of", "to", "by", "from", "the", "a", "an", "do", "does",
                      "did", "has", "have", "had", "can", "could", "would", "will", "name", "tell", "between"})


def key_terms(question: str) -> set[str]:
    """The words a rewrite must keep to stay on topic: every number and every capitalised name.

    A capitalised word counts as a name unless it opens the question and is a function word
    ("Which", "In", "The", ...); possessive endings are dropped ("France's" -> "france"). Words are
    compared as :func:`paraphrase_key` words, so "1,000" keeps "1" and "000".
    """
    words = question.split()
    terms: set[str] = set()
    for i, w in enumerate(words):
        if _CAP_RE.match(w) and not (i == 0 and paraphrase_key(w) in _OPENERS):
            terms.update(paraphrase_key(_POSSESSIVE_RE.sub("", w.rstrip("?.!,;:"))).split())
    terms.update(t for t in paraphrase_key(question).split() if any(c.isdigit() for c in t))
    return terms


@dataclass(frozen=True)
class RewriteFilter:
    """Checks that a sampled rewrite is a real paraphrase of its question.

    A rewrite is rejected as

    * ``"copy"`` when its :func:`token_jaccard` with the original is ``>= max_jaccard`` (a prefix
      or one swapped word is not a new wording);
    * ``"off_topic"`` when it drops one of the original's :func:`key_terms` (numbers, names);
    * ``"leaks_answer"`` when it contains a gold answer (SQuAD-normalised, whole words) that the
      original does not: the rewrite would answer itself;
    * ``"not_a_question"`` when it loses the original's question form (:func:`keeps_question_form`):
      a question rewritten as a statement, a wh-question as a yes/no one, or the reverse.

    The question-form check is on by default because a small rewriter often answers or reframes
    instead of rewording ("Which is bigger, A or B?" -> "A is bigger than B."), and the other checks
    let that through: of 343 rewrites of HotpotQA questions by Qwen2.5-Coder-0.5B-Instruct, labelled
    by hand (``experiments/psgrpo/paraphrase_audit.json``), 201 asked another question; this check
    rejects 62 of those, 10 of the 142 that kept the question (cloze forms such as "... is which
    player?" pass; "... is [player's name]." does not) and none of the 245 rule rewrites of the same
    questions. The rest of the changed ones (a dropped hop, a reversed relation) need a reader or a
    model to catch.

    Parameters
    ----------
    max_jaccard
        Rewrites at or above this token overlap with the original are copies.
    keep_terms
        Apply the on-topic check.
    question_form
        Apply the question-form check.
    """

    max_jaccard: float = 0.8
    keep_terms: bool = True
    question_form: bool = True

    def reject(self, original: str, rewrite: str, answers: Sequence[str] = ()) -> str | None:
        """The reason ``rewrite`` fails (``"copy"``, ``"off_topic"``, ``"leaks_answer"``, ``"not_a_question"``) or
        ``None`` when it passes."""
        if token_jaccard(original, rewrite) >= self.max_jaccard:
            return "copy"
        if self.keep_terms and not key_terms(original) <= set(paraphrase_key(rewrite).split()):
            return "off_topic"
        orig, new = f" {normalize_answer(original)} ", f" {normalize_answer(rewrite)} "
        for a in answers:
            na = normalize_answer(a)
            if na and f" {na} " in new and f" {na} " not in orig:
                return "leaks_answer"
        if self.question_form and not keeps_question_form(original, rewrite):
            return "not_a_question"
        return None


_WH_WORD_RE = re.compile(rf"\b(?:{'|'.join(_WH)})\b", re.IGNORECASE)
_YES_NO_RE = re.compile(r"^(?:is|are|was|were|am|do|does|did|has|have|had|can|could|will|would|should|shall|may|"
                        r"might|must)\b", re.IGNORECASE)
_REQUEST_RE = re.compile(r"^(?:please\s+)?(?:tell me|i want to know|i would like to know|i'd like to know|name|give|"
                         r"list|identify|say)\b", re.IGNORECASE)
_FRAME_RE = re.compile(r"^(?:please\s+)?(?:(?:can|could|would|will)\s+you\s+(?:please\s+)?tell\s+me|do\s+you\s+know|"
                       r"i\s+wonder|i'm\s+curious|quick\s+question|question|here\s+is\s+my\s+question)\s*[:,]?\s*",
                       re.IGNORECASE)


def _question_kind(text: str) -> str:
    """``"yes_no"`` (starts with an auxiliary verb), ``"wh"`` (has an English wh-word) or ``"other"``.

    A request frame in front ("Can you tell me which ...", "Do you know: ...") is read past: it
    starts with an auxiliary but wraps the question that follows.
    """
    t = _FRAME_RE.sub("", text.strip(), count=1)
    if _YES_NO_RE.match(t):
        return "yes_no"
    return "wh" if _WH_WORD_RE.search(t) else "other"


def keeps_question_form(original: str, rewrite: str) -> bool:
    """Whether ``rewrite`` asks in the way ``original`` does.

    It must have a ``?`` when the original does (or be a request: "Tell me ...", "I would like to
    know ...", "Name ..."), keep a wh-word when the original is a
    wh-question, and not turn a yes/no question into a wh-question. The wh-words are English; in
    another language only the question mark is checked. A rewrite that drops the wh-word but keeps
    the question mark ("The sport played at the BayArena since 1958?") fails too: such echo-questions
    read as yes/no questions to a small model as often as not.
    """
    o, r = original.strip(), rewrite.strip()
    if "?" in o and not ("?" in r or _REQUEST_RE.match(r)):
        return False
    fo, fr = _question_kind(o), _question_kind(r)
    if fo == "wh" and fr != "wh":
        return False
    return not (fo == "yes_no" and fr == "wh")


@dataclass(frozen=True)
class ParaphraseReport:
    """What :meth:`LLMParaphraser.paraphrase_with_report` made, and how.

    Attributes
    ----------
    paraphrases
        ``n`` rewrites per question (the original excluded), sampled ones first.
    fallback
        Per question, how many of its rewrites came from the rule fallback (all tries short).
    tries
        Per question, the sampling rounds it took (``0`` when ``n == 0``).
    rejected
        Per question, rejected samples by reason (``"unusable"`` for :func:`clean_paraphrase`'s
        rejections and duplicates, else the :class:`RewriteFilter` reason).
    """

    paraphrases: list[list[str]]
    fallback: list[int]
    tries: list[int]
    rejected: list[dict[str, int]]

    @property
    def fallback_count(self) -> int:
        """Rewrites that came from the rule fallback, over all questions."""
        return int(sum(self.fallback))


class LLMParaphraser(Paraphraser):
    """Paraphrases sampled from a causal LM, optionally filtered, with rule-based fill-up.

    Each sampling round is **one** batched ``generator.generate(prompts, n=n_samples,
    temperature=temperature, seed=seed + round)`` call with a two-shot rewrite prompt
    (``n_samples = oversample * n``) over the questions still short of ``n`` rewrites. Each sample
    is cleaned (:func:`clean_paraphrase`), de-duplicated against the original and the rewrites kept
    so far, and screened by ``rewrite_filter`` when given; the first ``n`` that pass are kept. After
    ``tries`` rounds, :class:`RuleParaphraser` fills what is still missing: those that pass the filter
    first, then the others (the last resort, so a set always has ``n`` rewrites;
    :class:`ParaphraseReport` counts them).

    Parameters
    ----------
    generator
        A ``ragkit.generation.Generator`` (anything with its ``generate`` signature).
    seed
        Sampling seed of the first round (round ``t`` uses ``seed + t``) and the rule fallback's seed.
    temperature
        Sampling temperature (> 0).
    oversample
        Samples drawn per wanted paraphrase (duplicates and bad lines are common).
    max_new_tokens
        Length cap of one rewrite.
    prompt
        Prompt format with a ``{q}`` field; must end where the rewrite starts.
    tries
        Sampling rounds at most (>= 1).
    rewrite_filter
        Screens every cleaned sample (``None``: only :func:`clean_paraphrase`).
    """

    name = "llm"

    def __init__(
        self,
        generator: TextGenerator,
        seed: int = 0,
        temperature: float = 0.8,
        oversample: int = 2,
        max_new_tokens: int = 48,
        prompt: str = _LLM_PROMPT,
        top_p: float = 0.95,
        tries: int = 1,
        rewrite_filter: RewriteFilter | None = None,
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampled paraphrases, got {temperature}")
        if oversample < 1:
            raise ValueError(f"oversample must be >= 1, got {oversample}")
        if tries < 1:
            raise ValueError(f"tries must be >= 1 sampling round, got {tries}")
        if "{q}" not in prompt:
            raise ValueError("prompt must contain a '{q}' field for the question")
        self.generator = generator
        self.seed = int(seed)
        self.temperature = float(temperature)
        self.oversample = int(oversample)
        self.max_new_tokens = int(max_new_tokens)
        self.prompt = prompt
        self.top_p = float(top_p)
        self.tries = int(tries)
        self.rewrite_filter = rewrite_filter
        self.fallback = RuleParaphraser(seed=seed)

    def _paraphrase(self, questions: list[str], n: int) -> list[list[str]]:
        return self._report(questions, n, None).paraphrases

    def paraphrase_with_report(self, questions: Sequence[str], n: int,
                               answers: Sequence[Sequence[str]] | None = None) -> ParaphraseReport:
        """:meth:`paraphrase` with how each rewrite was made; ``answers`` (gold aliases per question)
        feed the filter's answer-leak check.

        Raises
        ------
        ValueError
            Bad questions or ``n`` (as :meth:`paraphrase`), or ``answers`` of another length.
        """
        qs = _check_inputs(questions, n)
        if answers is not None and len(answers) != len(qs):
            raise ValueError(f"answers must hold one list per question: {len(answers)} for {len(qs)} questions")
        if not qs or n == 0:
            return ParaphraseReport([[] for _ in qs], [0] * len(qs), [0] * len(qs), [{} for _ in qs])
        return self._report(qs, int(n), answers)

    def _report(self, questions: list[str], n: int, answers: Sequence[Sequence[str]] | None) -> ParaphraseReport:
        n_samples = max(2, self.oversample * n)
        kept: list[list[str]] = [[] for _ in questions]
        seen = [{paraphrase_key(q)} for q in questions]
        rejected: list[dict[str, int]] = [{} for _ in questions]
        tries = [0] * len(questions)
        for t in range(self.tries):
            todo = [i for i in range(len(questions)) if len(kept[i]) < n]
            if not todo:
                break
            samples: Any = self.generator.generate(
                [self.prompt.format(q=questions[i]) for i in todo], max_new_tokens=self.max_new_tokens, stop=["\n"],
                temperature=self.temperature, n=n_samples, seed=self.seed + t, top_p=self.top_p,
            )
            for i, outs in zip(todo, samples):
                tries[i] = t + 1
                for s in [outs] if isinstance(outs, str) else outs:
                    if len(kept[i]) == n:
                        break
                    c = clean_paraphrase(s, questions[i])
                    why = "unusable" if c is None or paraphrase_key(c) in seen[i] else None
                    if why is None and self.rewrite_filter is not None:
                        why = self.rewrite_filter.reject(questions[i], c, answers[i] if answers else ())  # type: ignore[arg-type]
                    if why is not None:
                        rejected[i][why] = rejected[i].get(why, 0) + 1
                        continue
                    seen[i].add(paraphrase_key(c))  # type: ignore[arg-type]
                    kept[i].append(c)  # type: ignore[arg-type]
        fallback = [0] * len(questions)
        for i, q in enumerate(questions):
            cands = self.fallback.candidates(q)
            if self.rewrite_filter is not None and len(kept[i]) < n:  # rule rewrites that pass the filter first
                rf, gold = self.rewrite_filter, answers[i] if answers else ()
                cands = sorted(cands, key=lambda c: rf.reject(q, c, gold) is not None)
            for c in cands:
                if len(kept[i]) == n:
                    break
                if paraphrase_key(c) not in seen[i]:
                    seen[i].add(paraphrase_key(c))
                    kept[i].append(c)
                    fallback[i] += 1
            if len(kept[i]) < n:
                raise ValueError(f"could not build {n} distinct paraphrases of {q!r}; lower n")
        report = ParaphraseReport(kept, fallback, tries, rejected)
        if report.fallback_count:
            logger.info("LLMParaphraser: %d of %d paraphrases came from the rule fallback",
                        report.fallback_count, n * len(questions))
        return report


def set_diversity(wordings: Sequence[str]) -> dict[str, float]:
    """How different a set's wordings are: ``{"mean_jaccard", "identical_share"}``.

    ``mean_jaccard`` is the mean :func:`token_jaccard` over the unordered pairs of wordings (lower
    is more diverse); ``identical_share`` the share of those pairs that are equal after SQuAD answer
    normalisation (lower case, no punctuation or articles). Both are 0.0 for fewer than two wordings.
    """
    pairs = [(a, b) for i, a in enumerate(wordings) for b in wordings[i + 1:]]
    if not pairs:
        return {"mean_jaccard": 0.0, "identical_share": 0.0}
    return {"mean_jaccard": float(np.mean([token_jaccard(a, b) for a, b in pairs])),
            "identical_share": float(np.mean([normalize_answer(a) == normalize_answer(b) for a, b in pairs]))}


# ----------------------------------------------------------------------------- sets
@dataclass(frozen=True)
class ParaphraseSet:
    """One question asked several ways, with the passages each member is answered from.

    Parameters
    ----------
    set_id
        Identifier of the set (the record id).
    original
        The question as given by the data.
    paraphrases
        Rewrites of ``original`` (the original excluded).
    answers
        Gold answers (aliases); may be empty.
    passages
        One passage list per member of :attr:`questions` (same length). Generator-level sets
        repeat the original's passages; end-to-end sets hold each member's own retrieval.
    include_original
        Whether :attr:`questions` starts with ``original``.
    shared_passages
        ``True`` when every member uses the original's passages.
    """

    set_id: str
    original: str
    paraphrases: tuple[str, ...]
    answers: tuple[str, ...] = ()
    passages: tuple[tuple[Passage, ...], ...] = ()
    include_original: bool = True
    shared_passages: bool = True
    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paraphrases", tuple(self.paraphrases))
        object.__setattr__(self, "answers", tuple(self.answers))
        object.__setattr__(self, "passages", tuple(tuple(p) for p in self.passages))
        if self.passages and len(self.passages) != len(self.questions):
            raise ValueError(
                f"ParaphraseSet {self.set_id!r}: {len(self.passages)} passage lists for "
                f"{len(self.questions)} questions; give one list per member"
            )

    @property
    def questions(self) -> tuple[str, ...]:
        """The members of the set: ``(original, *paraphrases)`` or just the paraphrases."""
        return ((self.original,) if self.include_original else ()) + self.paraphrases

    def __len__(self) -> int:
        return len(self.questions)

    def passages_for(self, i: int) -> tuple[Passage, ...]:
        """Passages of member ``i`` (empty when the set has none)."""
        return self.passages[i] if self.passages else ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (passages as ``Passage.to_dict``)."""
        return {
            "set_id": self.set_id, "original": self.original, "paraphrases": list(self.paraphrases),
            "answers": list(self.answers), "include_original": self.include_original,
            "shared_passages": self.shared_passages,
            "passages": [[p.to_dict() for p in ps] for ps in self.passages],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParaphraseSet:
        """Inverse of :meth:`to_dict`."""
        return cls(
            set_id=str(d["set_id"]), original=d["original"], paraphrases=tuple(d["paraphrases"]),
            answers=tuple(d.get("answers", ())),
            passages=tuple(tuple(Passage.from_dict(p) for p in ps) for ps in d.get("passages", ())),
            include_original=bool(d.get("include_original", True)),
            shared_passages=bool(d.get("shared_passages", True)),
        )


def build_paraphrase_sets(
    records: Sequence[QARecord],
    paraphraser: Paraphraser,
    n: int,
    retriever: Searcher | None = None,
    k: int = 10,
    include_original: bool = True,
    passage_filter: Callable[[QARecord], Sequence[Passage]] | None = None,
) -> list[ParaphraseSet]:
    """Paraphrase every record's question and attach passages to every member.

    Parameters
    ----------
    records
        Questions with gold answers and (for generator-level sets) candidate passages.
    paraphraser
        Produces ``n`` rewrites per question (one batched call for all records).
    n
        Rewrites per question; a set has ``n + 1`` members with ``include_original``.
    retriever
        End-to-end setting: every member retrieves its own top-``k`` (one batched ``search``
        over all members of all sets). ``None``: generator-level setting, every member shares
        the record's passages (``passage_filter(record)`` when given, else ``record.passages``).
    k
        Passages retrieved per member (end-to-end only).
    include_original
        Put the original question first in each set.
    passage_filter
        Optional function choosing the shared passages of a record (e.g. gold only, or first 5).
    """
    if retriever is not None and k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    recs = list(records)
    if not recs:
        return []
    for r in recs:
        if not isinstance(r, QARecord):
            raise ValueError(f"records must be QARecord objects, got {type(r).__name__}; "
                             "use ragkit.datasets.load_hotpotqa / hotpotqa_record")
    paras = paraphraser.paraphrase([r.question for r in recs], n)
    members = [((r.question,) if include_original else ()) + tuple(p) for r, p in zip(recs, paras)]
    if retriever is not None:
        flat = [q for m in members for q in m]
        ranked = retriever.search(flat, k=k)
        per: list[tuple[Passage, ...]] = [tuple(rl.passages()) for rl in ranked]
        passages_by_set = []
        i = 0
        for m in members:
            passages_by_set.append(tuple(per[i:i + len(m)]))
            i += len(m)
    else:
        passages_by_set = []
        for r, m in zip(recs, members):
            shared = tuple(passage_filter(r)) if passage_filter is not None else r.passages
            passages_by_set.append(tuple(shared for _ in m) if shared else ())
    return [
        ParaphraseSet(set_id=r.id, original=r.question, paraphrases=tuple(p), answers=r.answers,
                      passages=ps, include_original=include_original, shared_passages=retriever is None)
        for r, p, ps in zip(recs, paras, passages_by_set)
    ]
