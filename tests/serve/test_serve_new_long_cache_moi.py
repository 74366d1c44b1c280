"""``ragkit serve`` on localhost with the real Cohere SDK and httpx: long documents, the score cache, MoI's
signed utilities and ``/v1/attribute``, calibrated scores."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragkit.debias.long_docs import LongDocs
from ragkit.serve import ServeSettings, create_app

QUERY = "which river flows through the zebra castle?"
FILLER = ("The committee met again on Tuesday to discuss the budget of the harbour, the repairs of the old mill "
          "and the timetable of the autumn fair, but no decision was taken. ")
ANSWER = "The zebra river flows through the zebra castle, the river of the zebra castle."
MIDDLE = "Castles and rivers of the north."


@pytest.fixture(scope="module")
def keyword_student(tiny_encoder_dir: Path) -> Any:
    """A tiny student trained for seconds to score passages holding 'zebra river' high."""
    from ragkit.training.distill import train_student
    from ragkit.training.labels import LabelRecord

    labels = []
    for i in range(48):
        cut = (7 * i) % 150
        texts = [FILLER[cut:] + FILLER[:cut], FILLER[: 40 + 2 * i], f"{FILLER[: 3 * i]} {MIDDLE}",
                 f"{FILLER[cut:]} {ANSWER}" if i % 2 else ANSWER]
        order = [(i + j) % 4 for j in range(4)]
        labels.append(LabelRecord(qid=f"q{i}", question=QUERY, passage_ids=tuple(f"p{j}" for j in range(4)),
                                  texts=tuple(texts[j] for j in order),
                                  u=tuple((0.0, 0.0, 0.3, 1.0)[j] for j in order), answers=("x",),
                                  source="synthetic"))
    res = train_student(labels, None, base_model=str(tiny_encoder_dir), loss="ranknet", epochs=12, batch_size=8,
                        lr=5e-3, seed=0, max_length=128, device="cpu", report_loss=False, show_progress=False)
    return res.reranker


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_long_document_chunked_ranks_first_and_meta_counts(keyword_student: Any, live_server: Any) -> None:
    import cohere

    tok = keyword_student.model.tokenizer
    long_doc = FILLER * 140 + ANSWER  # about 5,000 tokens, the answer at the very end
    assert len(tok(long_doc, add_special_tokens=False)["input_ids"]) > 4000
    docs = [FILLER[:200], long_doc, MIDDLE, FILLER[:120]]
    plain = live_server(create_app(keyword_student, ServeSettings(model_name="student", cache_size=0)))
    co = cohere.ClientV2(base_url=plain.url, api_key="unused")
    res = co.rerank(model="student", query=QUERY, documents=docs)
    assert res.results[0].index == 2  # truncated to its beginning, the long document is filler
    meta = httpx.post(f"{plain.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()["meta"]
    assert (meta["truncated"], meta["chunked"]) == (1, 0)  # reported, never refused (no 413 for a long document)

    chunking = LongDocs(chunking="max", chunk_tokens=48)
    srv = live_server(create_app(keyword_student, ServeSettings(model_name="student", long_docs=chunking)))
    co = cohere.ClientV2(base_url=srv.url, api_key="unused")
    res = co.rerank(model="student", query=QUERY, documents=docs)
    assert res.results[0].index == 1  # chunk-then-max reads the answer at the end
    body = httpx.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()
    assert (body["meta"]["truncated"], body["meta"]["chunked"]) == (0, 1)
    # a capped document is truncated and says so
    capped = live_server(create_app(keyword_student, ServeSettings(long_docs=LongDocs(max_tokens_per_doc=50,
                                                                                      chunking="max"))))
    meta = httpx.post(f"{capped.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()["meta"]
    assert meta["truncated"] == 1
    assert _metric(capped.url, "ragkit_documents_truncated_total") == 1.0


def test_repeated_request_is_a_cache_hit(keyword_student: Any, live_server: Any) -> None:
    import cohere

    docs = [FILLER[:200], ANSWER, "Paris is the capital of France."]
    srv = live_server(create_app(keyword_student, ServeSettings(model_name="student", cache_size=100)))
    co = cohere.ClientV2(base_url=srv.url, api_key="unused")
    first = co.rerank(model="student", query=QUERY, documents=docs)
    assert (_metric(srv.url, "ragkit_cache_hits_total"), _metric(srv.url, "ragkit_cache_misses_total")) == (0, 3)
    passes = keyword_student.forward_passes
    again = co.rerank(model="student", query=QUERY, documents=docs)
    assert keyword_student.forward_passes == passes  # nothing ran through the encoder
    assert (_metric(srv.url, "ragkit_cache_hits_total"), _metric(srv.url, "ragkit_cache_misses_total")) == (3, 3)
    assert [(r.index, r.relevance_score) for r in again.results] == [(r.index, r.relevance_score)
                                                                      for r in first.results]
    assert httpx.get(f"{srv.url}/health?detail=1").json()["cache"] == {"size": 100, "entries": 3, "hits": 3,
                                                                        "misses": 3}
    # one new document: two hits, one miss, the same scores for the old ones
    mixed = httpx.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": [*docs, "x"]}).json()
    assert mixed["meta"]["cache_hits"] == 3
    assert {r["index"]: r["relevance_score"] for r in mixed["results"] if r["index"] < 3} == pytest.approx(
        {r.index: r.relevance_score for r in first.results})
    off = live_server(create_app(keyword_student, ServeSettings(cache_size=0)))
    httpx.post(f"{off.url}/v1/rerank", json={"query": QUERY, "documents": docs})
    assert "ragkit_cache_hits_total 0.0" in httpx.get(f"{off.url}/metrics").text
    assert "cache_hits" not in httpx.post(f"{off.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()[
        "meta"]


def test_calibrated_relevance_score(keyword_student: Any, live_server: Any) -> None:
    from ragkit.debias.calibration import PlattCalibration

    docs = [FILLER[:200], ANSWER, "Paris is the capital of France."]
    raw = {h.id: h.score for h in keyword_student.rank(QUERY, docs)}
    cal = PlattCalibration.fit([raw["0"], raw["1"], raw["2"], raw["1"] - 0.1], [0, 1, 0, 1])
    keyword_student.calibration = cal
    try:
        srv = live_server(create_app(keyword_student, ServeSettings(cache_size=0)))
        res = httpx.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()["results"]
        for r in res:
            z = cal.a * raw[str(r["index"])] + cal.b
            assert r["relevance_score"] == pytest.approx(1 / (1 + math.exp(-z)), abs=1e-6)
    finally:
        keyword_student.calibration = None


@pytest.fixture(scope="module")
def moi_reranker(tiny_lm_dir: Path) -> Any:
    from ragkit.debias import get_reranker
    from ragkit.generation import Generator

    gen = Generator(model=str(tiny_lm_dir), batch_size=16, max_length=1024, show_progress=False)
    return get_reranker("moi", gen)


def test_moi_effect_and_attribute(moi_reranker: Any, live_server: Any) -> None:
    import cohere

    docs = ["The zebra river flows through the castle.", "Paris is in France.", "Rivers carry water."]
    srv = live_server(create_app(moi_reranker, ServeSettings(model_name="moi-tiny", effect_threshold=0.01)))
    co = cohere.ClientV2(base_url=srv.url, api_key="unused")
    res = co.rerank(model="moi-tiny", query=QUERY, documents=docs)  # the SDK ignores the extra fields
    assert sorted(r.index for r in res.results) == [0, 1, 2]
    body = httpx.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()
    expected = moi_reranker.rank(QUERY, docs)
    utilities = {h.id: h.score for h in expected}
    for r in body["results"]:
        u = utilities[str(r["index"])]
        assert r["utility"] == pytest.approx(u, abs=1e-5)
        assert r["effect"] == ("helps" if u > 0.01 else "hurts" if u < -0.01 else "neutral")
    assert body["meta"]["abstain"] == (not any(u > 0.01 for u in utilities.values()))
    assert body["meta"]["fallback"] == expected.info.fallback
    assert "truncated" in body["meta"]

    # /v1/attribute: log p(answer | all) - log p(answer | all but one), checked by hand
    answer = "the zebra river"
    att = httpx.post(f"{srv.url}/v1/attribute", json={"query": QUERY, "documents": docs, "answer": answer}).json()
    gen = moi_reranker.moi.generator
    from ragkit.types import Passage

    ps = [Passage(id=str(i), text=d) for i, d in enumerate(docs)]
    full = float(gen.score([gen.build_prompt(QUERY, ps)], [answer]).sum[0])
    assert att["full_logprob"] == pytest.approx(full, abs=1e-4)
    got = {r["index"]: r["contribution"] for r in att["results"]}
    for i in range(3):
        loo = float(gen.score([gen.build_prompt(QUERY, ps[:i] + ps[i + 1:])], [answer]).sum[0])
        assert got[i] == pytest.approx(full - loo, abs=1e-4)
        assert (got[i] > 0) == (full > loo)  # the sign: positive when the document raises the answer's log-prob
    assert [r["index"] for r in att["results"]] == sorted(got, key=lambda i: -got[i])
    assert any(abs(v) > 1e-6 for v in got.values())


def test_attribute_needs_a_generator(keyword_student: Any, live_server: Any) -> None:
    srv = live_server(create_app(keyword_student, ServeSettings()))
    r = httpx.post(f"{srv.url}/v1/attribute", json={"query": QUERY, "documents": ["a"], "answer": "b"})
    assert r.status_code == 404 and "MoI" in r.json()["message"]
    r = httpx.post(f"{srv.url}/v1/attribute", json={"query": QUERY, "documents": ["a"]})
    assert r.status_code == 422 and r.json()["field"] == "answer"
