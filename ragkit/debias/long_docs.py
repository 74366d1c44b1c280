"""Long documents for pair-scoring rerankers: a per-document token cap, truncation and chunking.

A cross-encoder reads a (query, document) pair of at most ``L`` tokens (its ``max_length``);
everything past that is silently dropped. :class:`LongDocs` makes the choice explicit:

* ``max_tokens_per_doc`` caps how many document tokens are read at all (``truncation_side``
  ``"right"`` keeps the beginning, ``"left"`` the end);
* without chunking, the document is further cut to the encoder's budget
  ``B = L - s - |q|`` (``s`` special tokens of a pair, ``|q|`` the query's tokens, at most ``L // 2``);
* with chunking, the (capped) document is cut into windows of ``c`` tokens (``chunk_tokens``,
  at most ``B``) starting every ``r`` tokens (``chunk_stride``, default ``3c / 4``: neighbouring
  chunks overlap by a quarter, so that a sentence cut at one boundary is whole in the next
  chunk), the last window ending at the document's end; each chunk is scored with the query and
  the document's score is ``max_j f(q, chunk_j)`` (``"max"``: the passage-level evidence rule of
  Dai & Callan, "Deeper Text Understanding for IR with Contextual Neural Language Modeling",
  SIGIR 2019, arXiv 1905.09217, "MaxP") or ``f(q, chunk_1)`` (``"first"``, their "FirstP",
  the same as truncating at ``c`` tokens).

:func:`cut_pairs` does the cutting on TEXT, before any pair is tokenised: it tokenises each
distinct document once (only its first or last ``8 n + 64`` characters when it needs ``n``
tokens, widened when that is not enough) and slices the text at the token offsets. A request of
1,000 documents of 20,000 characters therefore never materialises 1,000 full-length encodings
(tokenising the full pairs first is what made the resident memory of ``ragkit serve`` grow
twenty-fold on such a request). A document that fits is passed through unchanged, so its score
is exactly what it was without this module.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CutPairs", "LongDocStats", "LongDocs", "cut_pairs"]

logger = logging.getLogger(__name__)

_SIDES = ("right", "left")
_AGGREGATES = ("max", "first")


@dataclass(frozen=True)
class LongDocs:
    """How a pair-scoring reranker reads documents longer than its encoder.

    Parameters
    ----------
    max_tokens_per_doc
        Most document tokens read (``None``: no cap beyond the encoder's own budget when not
        chunking; every token when chunking).
    truncation_side
        ``"right"`` drops the end of a long document (keeps its beginning), ``"left"`` its
        beginning.
    chunking
        ``None`` (truncate to the encoder's budget), ``"max"`` (score every chunk, keep the best)
        or ``"first"`` (score the first chunk only).
    chunk_tokens
        Document tokens per chunk (``None``: the encoder's budget given the query; larger values
        are clamped to it).
    chunk_stride
        Tokens between the starts of two chunks (``None``: three quarters of the chunk size).
    """

    max_tokens_per_doc: int | None = None
    truncation_side: str = "right"
    chunking: str | None = None
    chunk_tokens: int | None = None
    chunk_stride: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_doc", "chunk_tokens", "chunk_stride"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {v!r}")
        if self.truncation_side not in _SIDES:
            raise ValueError(f"truncation_side must be 'right' (keep the beginning) or 'left' (keep the end), "
                             f"got {self.truncation_side!r}")
        if self.chunking not in (None, *_AGGREGATES):
            raise ValueError(f"chunking must be None, 'max' or 'first', got {self.chunking!r}")
        if self.chunking is None and (self.chunk_tokens is not None or self.chunk_stride is not None):
            raise ValueError("chunk_tokens / chunk_stride are set but chunking is off; pass chunking='max' "
                             "(or 'first') to chunk long documents")
        if self.chunk_tokens is not None and self.chunk_stride is not None and self.chunk_stride > self.chunk_tokens:
            raise ValueError(f"chunk_stride ({self.chunk_stride}) is larger than chunk_tokens ({self.chunk_tokens}): "
                             "tokens between chunks would never be read; use a stride <= the chunk size")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class LongDocStats:
    """What the long-document rule did to one query's documents.

    Attributes
    ----------
    documents
        Documents scored.
    truncated
        Documents of which some tokens were never read (the cap, or the encoder's budget
        without chunking).
    chunked
        Documents scored as two or more chunks.
    sequences
        Encoder sequences the documents cost (``documents`` when nothing is chunked).
    """

    documents: int = 0
    truncated: int = 0
    chunked: int = 0
    sequences: int = 0

    def __add__(self, other: LongDocStats) -> LongDocStats:
        return LongDocStats(self.documents + other.documents, self.truncated + other.truncated,
                            self.chunked + other.chunked, self.sequences + other.sequences)

    def to_dict(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


@dataclass
class CutPairs:
    """The result of :func:`cut_pairs`.

    Attributes
    ----------
    units
        Distinct (query text, document piece) pairs to score.
    lengths
        Tokens of each unit as the encoder sees it (query + piece + special tokens).
    owners
        For each input pair, the indices of its units (one unless chunked).
    truncated
        For each input pair, whether some document tokens were never read.
    """

    units: list[tuple[str, str]]
    lengths: list[int]
    owners: list[list[int]]
    truncated: list[bool]

    def stats(self, pairs: Sequence[int]) -> LongDocStats:
        """The :class:`LongDocStats` of the input pairs ``pairs`` (indices)."""
        return LongDocStats(len(pairs), sum(self.truncated[i] for i in pairs),
                            sum(len(self.owners[i]) > 1 for i in pairs), sum(len(self.owners[i]) for i in pairs))

    def details(self, pairs: Sequence[int]) -> dict[str, Any]:
        """The ``info.details["long_docs"]`` of one ranking: :meth:`stats` of the pairs ``pairs`` and,
        per pair in that order, whether it was ``truncated`` and its ``chunks`` (encoder sequences)."""
        return {**self.stats(pairs).to_dict(), "per_document": {
            "truncated": [bool(self.truncated[i]) for i in pairs], "chunks": [len(self.owners[i]) for i in pairs]}}

    def aggregate(self, unit_scores: Any) -> list[float]:
        """Each input pair's score from its units' scores: the best chunk's (``"first"`` and
        truncation leave one unit per pair, so the maximum serves every rule)."""
        return [float(max(unit_scores[u] for u in us)) for us in self.owners]


def _offsets(tokenizer: Any, texts: list[str]) -> list[list[tuple[int, int]]]:
    """Character spans of each text's tokens (no special tokens)."""
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False,
                    return_token_type_ids=False, truncation=False, verbose=False)
    return [[(int(a), int(b)) for a, b in offs] for offs in enc["offset_mapping"]]


def _window(text: str, chars: int, side: str) -> tuple[str, int]:
    """The first (``right``) or last (``left``) ``chars`` characters of ``text``, cut at whitespace
    so that no word is split (its tokens are then exactly those of the full text); with the offset
    of the window in ``text``."""
    if len(text) <= chars:
        return text, 0
    if side == "right":
        seg = text[:chars]
        cut = max(seg.rfind(" "), seg.rfind("\n"), seg.rfind("\t"))
        return (seg[:cut] if cut > 0 else seg), 0
    start = len(text) - chars
    seg = text[start:]
    cut = min((i for i in (seg.find(" "), seg.find("\n"), seg.find("\t")) if i >= 0), default=-1)
    if cut > 0:
        return seg[cut:], start + cut
    return seg, start


def _doc_tokens(tokenizer: Any, docs: list[str], need: list[float],
                side: str) -> list[tuple[list[tuple[int, int]], bool]]:
    """Token spans of each document: all of them, or (``need[i]`` finite) the first/last ``need[i]``
    and whether the document has more (read from a character window of the text, widened until it
    holds more than ``need[i]`` tokens or the whole text)."""
    out: list[tuple[list[tuple[int, int]], bool] | None] = [None] * len(docs)
    todo = list(range(len(docs)))
    chars = {i: (len(docs[i]) if math.isinf(need[i]) else int(8 * need[i] + 64)) for i in todo}
    while todo:
        windows = [_window(docs[i], chars[i], side) for i in todo]
        spans = _offsets(tokenizer, [w for w, _ in windows])
        again = []
        for i, (w, start), offs in zip(todo, windows, spans):
            whole = len(w) == len(docs[i])
            if not whole and len(offs) <= need[i]:  # the window held too few tokens: widen it
                chars[i] *= 4
                again.append(i)
                continue
            offs = [(a + start, b + start) for a, b in offs]
            n = need[i]
            more = len(offs) > n or not whole
            if not math.isinf(n) and len(offs) > n:
                offs = offs[: int(n)] if side == "right" else offs[len(offs) - int(n):]
            out[i] = (offs, more)
        todo = again
    return [o for o in out if o is not None]


def _slice(text: str, offs: list[tuple[int, int]], a: int, b: int) -> str:
    return text[offs[a][0] : offs[b - 1][1]]


def cut_pairs(tokenizer: Any, pairs: Sequence[tuple[str, str]], max_length: int, policy: LongDocs) -> CutPairs:
    """Cut (query, document) pairs to an encoder's budget on text (see the module docstring).

    Parameters
    ----------
    tokenizer
        A fast Hugging Face tokenizer (it reports token offsets).
    pairs
        ``(query text, document text)`` pairs.
    max_length
        The encoder's most tokens per pair.
    policy
        The long-document rule.

    Returns
    -------
    CutPairs
        Distinct units to score, their lengths, and each pair's units.
    """
    specials = int(tokenizer.num_special_tokens_to_add(pair=True))
    q_cap = max(1, max_length // 2)
    queries = list(dict.fromkeys(q for q, _ in pairs))
    q_toks = _doc_tokens(tokenizer, queries, [float(q_cap)] * len(queries), "right")
    q_text: dict[str, tuple[str, int]] = {}
    for q, (offs, more) in zip(queries, q_toks):
        if more and offs:
            logger.info("a query of more than %d tokens is cut to its first %d (half the encoder's %d)",
                        q_cap, q_cap, max_length)
            q_text[q] = (_slice(q, offs, 0, len(offs)), len(offs))
        else:
            q_text[q] = (q, len(offs))

    cap = math.inf if policy.max_tokens_per_doc is None else float(policy.max_tokens_per_doc)
    budgets = [max(1, max_length - specials - q_text[q][1]) for q, _ in pairs]
    need: dict[str, float] = {}
    for (_, d), b in zip(pairs, budgets):
        n = cap if policy.chunking == "max" else min(cap, float(min(b, policy.chunk_tokens or b)))
        need[d] = max(need.get(d, 0.0), n)
    docs = list(need)
    d_toks = dict(zip(docs, _doc_tokens(tokenizer, docs, [need[d] for d in docs], policy.truncation_side)))

    index: dict[tuple[str, str], int] = {}
    lengths: list[int] = []
    owners: list[list[int]] = []
    truncated: list[bool] = []

    def add(q: str, piece: str, n_tokens: int) -> int:
        qt, q_len = q_text[q]
        k = index.setdefault((qt, piece), len(index))
        if k == len(lengths):
            lengths.append(q_len + n_tokens + specials)
        return k

    for (q, d), budget in zip(pairs, budgets):

        offs, more = d_toks[d]
        n = len(offs)
        if policy.chunking is None:
            keep = min(n, budget, int(cap) if not math.isinf(cap) else n)
            cut = more or keep < n
            if not cut:
                owners.append([add(q, d, n)])
            elif policy.truncation_side == "right":
                owners.append([add(q, _slice(d, offs, 0, keep), keep)])
            else:
                owners.append([add(q, _slice(d, offs, n - keep, n), keep)])
            truncated.append(cut)
            continue
        size = min(policy.chunk_tokens or budget, budget)
        stride = min(policy.chunk_stride or max(1, size * 3 // 4), size)
        if policy.chunking == "first":
            keep = min(n, size)
            cut = more or keep < n
            a, b = (0, keep) if policy.truncation_side == "right" else (n - keep, n)
            owners.append([add(q, _slice(d, offs, a, b) if cut else d, keep)])
            truncated.append(cut)
            continue
        if n <= size:
            owners.append([add(q, _slice(d, offs, 0, n) if more else d, n)])
        else:
            starts = list(range(0, n - size + 1, stride))
            if starts[-1] + size < n:
                starts.append(n - size)
            owners.append([add(q, _slice(d, offs, s, s + size), size) for s in starts])
        truncated.append(more)
    return CutPairs(list(index), lengths, owners, truncated)
