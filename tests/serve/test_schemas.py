"""The Cohere and TEI request/response shapes (``ragkit.serve.schemas``), without a server."""

from __future__ import annotations

import json

import pytest

from ragkit.serve import RequestError, ServeSettings
from ragkit.serve.schemas import (
    CohereRerankRequest,
    TEIRerankRequest,
    cohere_response,
    parse_request,
    tei_response,
)
from ragkit.types import Passage, RankedList

LIMITS = ServeSettings(max_documents=4, max_chars=50, max_request_chars=120)


def _refused(model: type, body: object | bytes, settings: ServeSettings = LIMITS) -> RequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body)
    with pytest.raises(RequestError) as e:
        parse_request(model, raw, settings)
    return e.value


def test_cohere_request_reads_strings_and_text_objects_and_ignores_unknown_fields() -> None:
    req = parse_request(CohereRerankRequest, json.dumps(
        {"query": "q", "documents": ["a", {"text": "b", "title": "t"}], "top_n": 1, "return_documents": True,
         "model": "m", "rank_fields": ["text"], "max_chunks_per_doc": 3}), LIMITS)
    assert req.texts() == ["a", "b"] and req.top_n == 1 and req.return_documents is True


@pytest.mark.parametrize(("body", "status", "field", "words"), [
    ({"query": "q" * 51, "documents": ["a"]}, 413, "query", "max_chars"),
    ({"query": "q", "documents": ["a"] * 5}, 413, "documents", "max_documents"),
    ({"query": "q" * 40, "documents": ["a" * 10] * 3}, 413, "documents", "max_request_chars"),
    ({"query": "\u200b\u200d\ufeff", "documents": ["a"]}, 422, "query", "zero-width"),
    ({"query": "\x00\x00", "documents": ["a"]}, 422, "query", "control"),
    ({"query": "q", "documents": ["a", "\u2060 "]}, 422, "documents[1]", "empty"),
    ({"query": "q", "documents": ["a", {"text": 7}]}, 422, "documents[1]", "string"),
    ({"query": "q", "documents": ["a"], "top_n": -2}, 422, "top_n", ">= 1"),
    ({"query": "q", "documents": ["a"], "return_documents": 1}, 422, "return_documents", "true or false"),
])
def test_cohere_refusals_name_the_field(body: dict, status: int, field: str, words: str) -> None:
    e = _refused(CohereRerankRequest, body)
    assert (e.status, e.field) == (status, field)
    assert f"`{field}`" in e.message or field == "documents" and "request" in e.message
    assert words in e.message


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"query": ' + b"7" * 5000 + b', "texts": ["a"]}',
                                 b'{"query": "q", "texts": ["a"], "raw_scores": ' + b"1" * 5000 + b"}",
                                 b'{"query": "\\ud800", "texts": ["a"]}', b'{"query": "q", "texts": ["\xff"]}',
                                 b""])
def test_hostile_json_is_a_422_naming_the_body(raw: bytes) -> None:
    e = _refused(TEIRerankRequest, raw)
    assert e.status == 422 and e.field in ("body", "query", "raw_scores"), e.message


def test_responses_follow_the_rankers_order() -> None:
    ranked = RankedList.from_scores([Passage("0", "a"), Passage("1", "b")], [-1.0, 2.0])
    cohere = cohere_response(parse_request(CohereRerankRequest, '{"query": "q", "documents": ["a", "b"], '
                                           '"return_documents": true, "top_n": 1}'), ranked, "m")
    assert [r["index"] for r in cohere["results"]] == [1] and cohere["results"][0]["document"] == {"text": "b"}
    assert 0.88 < cohere["results"][0]["relevance_score"] < 0.89 and cohere["meta"]["model"] == "m"
    tei = tei_response(parse_request(TEIRerankRequest, '{"query": "q", "texts": ["a", "b"], "raw_scores": true}'),
                       ranked)
    assert tei == [{"index": 1, "score": 2.0}, {"index": 0, "score": -1.0}]
