"""Small, frozen value types shared by every part of ragkit.

``Passage`` and ``Query`` are inputs, ``Hit`` is one scored passage and ``RankedList`` is the
result of a retriever or a reranker for one query; its ``info`` (:class:`RankInfo`) carries what
the reranker knows besides the order (cost, fallback, diagnostics), so that a ranking returns its
whole answer and concurrent calls never share state. They are frozen dataclasses, so they compare
by value and can be used as dictionary keys (``metadata`` is excluded from hashing).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

__all__ = ["Passage", "Query", "Hit", "RankInfo", "RankedList", "QARecord", "RagkitError", "MissingExtraError",
           "EXTRAS", "missing_modules", "require_extra", "as_passages", "as_query"]


class RagkitError(Exception):
    """An error in what ragkit was asked to do (bad input, a missing file, a refused write).

    Its message names the problem and the fix; the command line prints it as one line
    (``ragkit: error: <message>``) and exits with status 1. Subclass it for specific cases.
    """


EXTRAS: dict[str, tuple[str, str]] = {
    # import name: (ragkit extra that installs it, PyPI package)
    "peft": ("train", "peft"),
    "trl": ("train", "trl==1.16.0"),
    "datasets": ("train", "datasets"),
    "yaml": ("train", "pyyaml"),
    "starlette": ("serve", "starlette"),
    "uvicorn": ("serve", "uvicorn"),
    "prometheus_client": ("serve", "prometheus-client"),
    "httpx": ("remote", "httpx"),
    "spacy": ("msmarco", "spacy"),
    "matplotlib": ("plots", "matplotlib"),
    "ranx": ("eval", "ranx"),
    "langchain_core": ("langchain", "langchain-core"),
    "llama_index.core": ("llamaindex", "llama-index-core"),
    "haystack": ("haystack", "haystack-ai"),
}
"""The optional dependencies: which ``pip install "ragkit[EXTRA]"`` brings each (``pyproject.toml``)."""


class MissingExtraError(RagkitError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The names in ``modules`` that cannot be imported (found without importing them)."""
    import importlib.util

    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a missing parent package, or a module set to None in sys.modules
            found = False
        if not found:
            out.append(name)
    return out


def require_extra(modules: Iterable[str], what: str) -> None:
    """Raise :class:`MissingExtraError` naming the extras to install when any of ``modules`` is missing.

    Parameters
    ----------
    modules
        Import names, keys of :data:`EXTRAS` (``"peft"``, ``"matplotlib"``, ...).
    what
        What needs them, for the message (``"ragkit train cord --lora"``).
    """
    missing = missing_modules(modules)
    if not missing:
        return
    extras = sorted({EXTRAS[m][0] for m in missing if m in EXTRAS})
    packages = " ".join(EXTRAS[m][1] if m in EXTRAS else m for m in missing)
    how = f'pip install "ragkit[{",".join(extras)}]"' if extras else f"pip install {packages}"
    verb = "is" if len(missing) == 1 else "are"
    raise MissingExtraError(f"{what} needs {', '.join(missing)}, which {verb} not installed: {how} "
                            f"(or pip install {packages})")


@dataclass(frozen=True)
class Passage:
    """A unit of text that can be retrieved and put into a prompt.

    Parameters
    ----------
    id
        Unique identifier inside a corpus.
    text
        Body text.
    title
        Optional title (HotpotQA paragraphs and Wikipedia passages have one).
    metadata
        Free-form JSON-serialisable extra fields (labels, source url, ...). Not hashed.
    """

    id: str
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Passage.id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"Passage.text must be a string, got {type(self.text).__name__}")

    @property
    def contents(self) -> str:
        """Title and text joined as they are indexed and shown to a generator."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the corpus JSONL line format)."""
        out: dict[str, Any] = {"id": self.id, "text": self.text}
        if self.title:
            out["title"] = self.title
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Passage:
        """Build from a corpus JSONL record ``{"id", "text", "title"?, "metadata"?}``."""
        if "id" not in d or "text" not in d:
            raise ValueError(
                f"a passage record needs 'id' and 'text' keys, got keys {sorted(d)}; "
                'write corpus lines as {"id": ..., "text": ..., "title": ...}'
            )
        pid, text = d["id"], d["text"]
        if pid is None or text is None:
            raise ValueError(
                f"a passage record has a null {'id' if pid is None else 'text'} "
                f"(id {pid!r}); give every passage a string id and a string text"
            )
        if isinstance(pid, bool) or not isinstance(pid, (str, int)):
            raise ValueError(f"passage id {pid!r} is a {type(pid).__name__}; ids are strings (or integers)")
        if not isinstance(text, str):
            raise ValueError(f"passage {pid!r} has a {type(text).__name__} text; texts are strings")
        return cls(
            id=str(pid),
            text=text,
            title=str(d.get("title") or ""),
            metadata=dict(d.get("metadata") or {}),
        )


@dataclass(frozen=True)
class Query:
    """A question, with optional reference answers and an id."""

    text: str
    id: str = ""
    answers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("Query.text must be a non-empty string; got an empty query")
        if not isinstance(self.answers, tuple):
            object.__setattr__(self, "answers", tuple(self.answers))


@dataclass(frozen=True)
class Hit:
    """One passage with its score and 0-based rank inside a ``RankedList``."""

    passage: Passage
    score: float
    rank: int

    @property
    def id(self) -> str:
        return self.passage.id


@dataclass(frozen=True)
class RankInfo:
    """What a reranker knows about one ranking besides the order: its cost and its diagnostics.

    It travels on the ranking (:attr:`RankedList.info`) instead of on the reranker, so each call
    gets its own, also when calls run concurrently.

    Attributes
    ----------
    generator_calls
        Sequences this query sent through the generator (interventions generated or scored, the
        final answer); 0 for rerankers without a generator.
    forward_passes, tokens_prefilled, tokens_generated, seconds
        Model forward passes, prompt tokens run through the model, tokens decoded and wall-clock
        seconds of the call that produced this ranking. A batched call cannot split them per
        query: they are the whole call's, shared by its ``batch_queries`` queries (``rank`` is a
        batch of one). Token counts are 0 where the backend does not count them (a remote server).
    batch_queries
        Queries ranked by that call.
    fallback
        ``True`` when the reranker gave up and returned the input (retriever) order, e.g. MoI's
        interventions did not separate the passages; ``fallback_reason`` says why.
    fallback_reason
        One sentence naming why (``""`` without a fallback).
    details
        Backend diagnostics, JSON-ready (MoI: utilities, outcomes, interventions, prompt order, ...);
        read-only.
    """

    generator_calls: int = 0
    forward_passes: int = 0
    tokens_prefilled: int = 0
    tokens_generated: int = 0
    seconds: float = 0.0
    batch_queries: int = 1
    fallback: bool = False
    fallback_reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.details, MappingProxyType):
            object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def with_(self, **changes: Any) -> RankInfo:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return replace(self, **changes)

    def to_dict(self, details: bool = True) -> dict[str, Any]:
        """JSON-ready dict (``details=False``: the cost and fallback fields only)."""
        out: dict[str, Any] = {
            "generator_calls": self.generator_calls,
            "forward_passes": self.forward_passes,
            "tokens_prefilled": self.tokens_prefilled,
            "tokens_generated": self.tokens_generated,
            "seconds": self.seconds,
            "batch_queries": self.batch_queries,
            "fallback": self.fallback,
            "fallback_reason": self.fallback_reason,
        }
        if details:
            out["details"] = dict(self.details)
        return out


@dataclass(frozen=True)
class RankedList:
    """Ranked hits for one query, best first.

    Parameters
    ----------
    hits
        Hits in rank order; their ``rank`` fields are 0..n-1.
    query
        The query these hits answer (optional).
    info
        The reranker's cost and diagnostics for this ranking (:class:`RankInfo`; empty for a
        retriever's list). Not compared or hashed: two lists with the same hits are equal.
    """

    hits: tuple[Hit, ...]
    query: Query | None = None
    info: RankInfo = field(default_factory=RankInfo, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.hits, tuple):
            object.__setattr__(self, "hits", tuple(self.hits))

    @classmethod
    def from_scores(
        cls, passages: Sequence[Passage], scores: Sequence[float], query: Query | None = None,
        info: RankInfo | None = None,
    ) -> RankedList:
        """Sort ``passages`` by ``scores`` (descending; ties keep the input order)."""
        if len(passages) != len(scores):
            raise ValueError(f"{len(passages)} passages but {len(scores)} scores")
        order = sorted(range(len(passages)), key=lambda i: (-float(scores[i]), i))
        hits = tuple(Hit(passages[i], float(scores[i]), r) for r, i in enumerate(order))
        return cls(hits, query, info if info is not None else RankInfo())

    def with_(self, query: Query | None = None, info: RankInfo | None = None) -> RankedList:
        """The same hits with another ``query`` and/or ``info`` (the others kept)."""
        return RankedList(self.hits, self.query if query is None else query, self.info if info is None else info)

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __getitem__(self, i: int) -> Hit:
        return self.hits[i]

    def top_k(self, k: int) -> RankedList:
        """The first ``k`` hits as a new ``RankedList``."""
        if k <= 0:
            raise ValueError(f"k must be >= 1, got {k}")
        return RankedList(self.hits[:k], self.query, self.info)

    def ids(self) -> list[str]:
        """Passage ids in rank order."""
        return [h.passage.id for h in self.hits]

    def passages(self) -> list[Passage]:
        """Passages in rank order."""
        return [h.passage for h in self.hits]

    def scores(self) -> list[float]:
        """Scores in rank order."""
        return [h.score for h in self.hits]

    def to_run_dict(self) -> dict[str, float]:
        """``{doc_id: score}`` for one query, as ranx's ``Run`` takes it.

        Scores are made strictly decreasing by rank (ties broken by rank) so that evaluation
        tools that sort by score reproduce exactly this order.
        """
        out: dict[str, float] = {}
        n = len(self.hits)
        for h in self.hits:
            out[h.passage.id] = float(n - h.rank)
        return out

    def to_trec(self, query_id: str, run_name: str = "ragkit") -> list[str]:
        """TREC run lines ``qid Q0 docid rank score run_name`` (1-based rank)."""
        return [
            f"{query_id} Q0 {h.passage.id} {h.rank + 1} {h.score:.6f} {run_name}"
            for h in self.hits
        ]


@dataclass(frozen=True)
class QARecord:
    """One evaluation or training example, whatever the dataset.

    Parameters
    ----------
    id
        Question id from the dataset.
    question
        The question text.
    answers
        Reference answers (aliases); may be empty (MS MARCO "No Answer Present.").
    passages
        Candidate passages in the dataset's given order (HotpotQA's 10 paragraphs, MS MARCO's
        Bing passages, NQ-open's contexts).
    gold_ids
        Ids of the passages that support the answer.
    metadata
        Dataset-specific extras (question type, paraphrases, ...). Not hashed.
    """

    id: str
    question: str
    answers: tuple[str, ...] = ()
    passages: tuple[Passage, ...] = ()
    gold_ids: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("answers", "passages", "gold_ids"):
            v = getattr(self, name)
            if not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(v))

    @property
    def query(self) -> Query:
        return Query(text=self.question, id=self.id, answers=self.answers)


def as_passages(items: Iterable[Passage | str | Mapping[str, Any]]) -> list[Passage]:
    """Coerce strings, dicts or passages into ``Passage`` objects.

    Strings get ids ``"0", "1", ...`` by position; dicts go through :meth:`Passage.from_dict`.
    """
    out: list[Passage] = []
    for i, it in enumerate(items):
        if isinstance(it, Passage):
            out.append(it)
        elif isinstance(it, str):
            out.append(Passage(id=str(i), text=it))
        elif isinstance(it, Mapping):
            out.append(Passage.from_dict(it))
        else:
            raise TypeError(f"cannot make a Passage from {type(it).__name__}")
    return out


def as_query(q: Query | str) -> Query:
    """Coerce a string into a ``Query``."""
    return q if isinstance(q, Query) else Query(text=q)
