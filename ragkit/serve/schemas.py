"""Request and response shapes of the rerank endpoints: Cohere v1/v2 and Hugging Face TEI.

The shapes are pydantic models parsed straight from the request bytes
(:meth:`pydantic.BaseModel.model_validate_json`, whose Rust JSON parser refuses what Python's
``json`` turns into a server error: nesting deeper than 200 levels, numbers beyond 4,300 digits,
lone UTF-16 surrogates). Every refusal becomes a :class:`RequestError` that names the field at
fault (``documents[3]``) and the fix; the server answers it with the error's status, 422 for a
malformed field and 413 for a limit of :class:`~ragkit.serve.ServeSettings` (``max_documents``,
``max_chars``, ``max_request_chars``), which the models read from the validation context.

>>> req = parse_request(CohereRerankRequest, b'{"query": "q", "documents": ["a", {"text": "b"}]}')
>>> req.documents, req.top_n
(['a', 'b'], None)
"""

from __future__ import annotations

import math
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ragkit.serve.settings import ServeSettings
from ragkit.types import RankedList

__all__ = [
    "AttributeRequest",
    "CohereDocument",
    "CohereRerankRequest",
    "CohereRerankResponse",
    "CohereResult",
    "RequestError",
    "TEIRerankRequest",
    "TEIResult",
    "cohere_response",
    "effect",
    "parse_request",
    "sigmoid",
    "tei_response",
]

_DEFAULT_SETTINGS = ServeSettings()


class RequestError(Exception):
    """A refused request: HTTP ``status``, the ``field`` at fault and extra response ``headers``."""

    def __init__(self, status: int, field: str, message: str, headers: dict[str, str] | None = None,
                 kind: str = "Validation") -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message
        self.headers = headers
        self.kind = kind


def sigmoid(x: float) -> float:
    """``1 / (1 + exp(-x))`` without overflow (the score a Cohere client expects, in [0, 1])."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


# ----------------------------------------------------------------------------- field validators
def _settings(info: ValidationInfo) -> ServeSettings:
    ctx = info.context
    return ctx["settings"] if isinstance(ctx, dict) and "settings" in ctx else _DEFAULT_SETTINGS


def _field_name(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def has_visible_text(value: str) -> bool:
    """Whether ``value`` holds a character other than whitespace, control, format (zero-width) or separator.

    Stops at the first visible character, so a long text costs one step.
    """
    for ch in value:
        if not ch.isspace() and unicodedata.category(ch)[0] not in "CZ":
            return True
    return False


def _document(value: str, info: ValidationInfo) -> str:
    """A document: valid, visible text of any length (a long one is read by the reranker's long-document rule)."""
    return _text(value, info, limit=False)


def _text(value: str, info: ValidationInfo, limit: bool = True) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError("surrogate", "holds a lone UTF-16 surrogate ({bad}); send valid Unicode text",
                                  {"bad": ascii(value[e.start:e.end])}) from None
    if not has_visible_text(value):
        raise PydanticCustomError(
            "empty", "is empty (nothing but whitespace, control or zero-width characters); send some text")
    max_chars = _settings(info).max_chars
    if limit and len(value) > max_chars:
        raise PydanticCustomError("too_long", "has {n} characters, more than the server's limit of {limit} "
                                  "(max_chars); shorten it or split it", {"n": len(value), "limit": max_chars})
    return value


def _strict_str(value: Any) -> Any:
    # pydantic's StrictStr would do, but its message names Python types; this one names JSON types
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "must be a string, got {got}", {"got": _json_type(value)})
    return value


def _document_text(value: Any) -> Any:
    """A Cohere document: a string, or an object whose ``text`` is one."""
    if isinstance(value, dict):
        if "text" not in value:
            raise PydanticCustomError("document", "is an object without a `text` string")
        return value["text"]
    return value


def _document_count(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, list):
        if not value:
            raise PydanticCustomError("empty", "is empty; send at least one text")
        limit = _settings(info).max_documents
        if len(value) > limit:
            raise PydanticCustomError("too_many", "has {n} entries, more than the server's limit of {limit} "
                                      "(max_documents); send fewer per request", {"n": len(value), "limit": limit})
    return value


Text = Annotated[str, BeforeValidator(_strict_str), AfterValidator(_text)]
"""A query or document: a string with a visible character, at most ``max_chars`` long."""

Documents = Annotated[list[Annotated[str, BeforeValidator(_strict_str), BeforeValidator(_document_text),
                                     AfterValidator(_document)]],
                      BeforeValidator(_document_count)]
"""One to ``max_documents`` texts (Cohere's ``{"text": ...}`` objects are read as their text)."""


class _Request(BaseModel):
    """Fields every rerank request shares; unknown fields are ignored (clients send ``model`` etc.)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    query: Text
    documents_field: ClassVar[str] = "documents"

    def texts(self) -> list[str]:
        """The documents to rank, in request order."""
        raise NotImplementedError

    @model_validator(mode="after")
    def _work_budget(self, info: ValidationInfo) -> _Request:
        settings = _settings(info)
        cap, q = settings.max_pair_chars, len(self.query)
        work = sum(min(q + len(d), cap) for d in self.texts())
        if work > settings.max_request_chars:
            raise PydanticCustomError(
                "too_much_work", "holds {work} characters of (query, document) pairs (each pair counted up to "
                "{cap}, max_pair_chars), more than the server's per-request work budget of {limit} "
                "(max_request_chars); send fewer or shorter documents per request",
                {"work": work, "cap": cap, "limit": settings.max_request_chars})
        return self


# ----------------------------------------------------------------------------- Cohere
class CohereRerankRequest(_Request):
    """``POST /v1/rerank`` and ``/v2/rerank``: ``{"query", "documents", "top_n"?, "return_documents"?}``."""

    documents: Documents
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    return_documents: StrictBool | None = None
    model: str | None = None

    def texts(self) -> list[str]:
        return list(self.documents)


class CohereDocument(BaseModel):
    """A returned document (``return_documents``)."""

    text: str


class CohereResult(BaseModel):
    """One ranked document: its request ``index`` and ``relevance_score`` (see ``docs/serving.md``);
    with MoI also its ``utility`` and ``effect`` (fields Cohere clients ignore)."""

    index: int
    relevance_score: float
    document: CohereDocument | None = None
    utility: float | None = None
    effect: str | None = None


class CohereRerankResponse(BaseModel):
    """The Cohere rerank response, best first."""

    id: str
    results: list[CohereResult]
    meta: dict[str, Any]


def effect(utility: float, threshold: float) -> str:
    """``helps`` above ``+threshold``, ``hurts`` below ``-threshold``, else ``neutral``."""
    return "helps" if utility > threshold else "hurts" if utility < -threshold else "neutral"


def cohere_response(req: CohereRerankRequest, ranked: RankedList, model_name: str,
                    score: Callable[[float], float] = sigmoid, meta: dict[str, Any] | None = None,
                    effect_threshold: float | None = None) -> dict[str, Any]:
    """The Cohere response body for ``ranked`` (passage ids are request indices).

    ``score`` maps the reranker's raw score to ``relevance_score``; ``meta`` adds fields to the
    response's ``meta``; with ``effect_threshold`` (MoI) each result carries its ``utility`` (the
    raw score) and ``effect``.
    """
    hits = list(ranked)[: req.top_n] if req.top_n else list(ranked)
    moi = effect_threshold is not None
    results = [CohereResult(index=int(h.passage.id), relevance_score=score(h.score),
                            document=CohereDocument(text=req.documents[int(h.passage.id)])
                            if req.return_documents else None,
                            utility=float(h.score) if moi else None,
                            effect=effect(h.score, effect_threshold) if moi else None) for h in hits]
    resp = CohereRerankResponse(id=str(uuid.uuid4()), results=results,
                                meta={"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                                      "model": model_name, **(meta or {})})
    return resp.model_dump(exclude_none=True)


class AttributeRequest(_Request):
    """``POST /v1/attribute``: ``{"query", "documents", "answer"}``."""

    documents: Documents
    answer: Text

    def texts(self) -> list[str]:
        return list(self.documents)


# ----------------------------------------------------------------------------- TEI
class TEIRerankRequest(_Request):
    """``POST /rerank`` (text-embeddings-inference): ``{"query", "texts", "raw_scores"?, "return_text"?}``."""

    documents_field: ClassVar[str] = "texts"

    texts_: Documents = Field(alias="texts")
    raw_scores: StrictBool | None = None
    return_text: StrictBool | None = None
    truncate: StrictBool | None = None

    def texts(self) -> list[str]:
        return list(self.texts_)


class TEIResult(BaseModel):
    """One ranked text: its request ``index`` and ``score`` (raw, or sigmoid of it)."""

    index: int
    score: float
    text: str | None = None


def tei_response(req: TEIRerankRequest, ranked: RankedList,
                 score: Callable[[float], float] = sigmoid) -> list[dict[str, Any]]:
    """The TEI response body for ``ranked``, best first (``score``: raw score -> reported score)."""
    texts = req.texts()
    return [TEIResult(index=int(h.passage.id), score=float(h.score) if req.raw_scores else score(h.score),
                      text=texts[int(h.passage.id)] if req.return_text else None).model_dump(exclude_none=True)
            for h in ranked]


# ----------------------------------------------------------------------------- parsing
M = TypeVar("M", bound=BaseModel)

_LIMIT_ERRORS = {"too_long", "too_many", "too_much_work"}
_HINTS = {"query": "send the search query as a string", "documents": "send a list of texts",
          "texts": "send a list of texts"}


def _json_type(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "object",
            type(None): "null"}.get(type(v), type(v).__name__)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _message(err: dict[str, Any], field: str) -> str:
    kind, inp = err["type"], err.get("input")
    if kind == "json_invalid":
        return f"the request `body` is not valid JSON ({err['msg']}); send a JSON object"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"the request `body` must be a JSON object, got {_json_type(inp)}"
    if kind == "missing":
        return f"`{field}` is missing; {_HINTS.get(field, 'send it')}"
    if kind == "bool_type":
        return f"`{field}` must be true or false, got {_short(inp)}"
    if kind in ("int_type", "greater_than_equal", "int_from_float", "int_parsing"):
        return f"`{field}` must be an integer >= 1, got {_short(inp)}"
    if kind == "list_type":
        return f"`{field}` must be a list, got {_json_type(inp)}"
    if kind == "string_type":
        return f"`{field}` must be a string, got {_json_type(inp)}"
    if kind == "too_much_work":
        return f"the request {err['msg']}"
    return f"`{field}` {err['msg']}"


def parse_request(model: type[M], raw: bytes | str, settings: ServeSettings | None = None) -> M:
    """``model`` parsed from the request body ``raw``, the limits read from ``settings``.

    Raises
    ------
    RequestError
        422 for a malformed body or field, 413 for a field over a limit; the first problem is reported.
    """
    try:
        return model.model_validate_json(raw, context={"settings": settings or _DEFAULT_SETTINGS})
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = [p for p in err["loc"] if p != "function-after[_work_budget(), _Request]"]
        field = getattr(model, "documents_field", "documents") if err["type"] == "too_much_work" else _field_name(loc)
        status = 413 if err["type"] in _LIMIT_ERRORS else 422
        raise RequestError(status, field, _message(err, field)) from None
