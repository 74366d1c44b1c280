"""One student folder: written by ``save_pretrained``, loaded by sentence-transformers and by ragkit,
and served by the ``ragkit serve`` command (a real subprocess on 127.0.0.1)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from ragkit.debias.student import META_FILE, DistilledReranker

QUERY = "which river flows past the zebra castle?"
DOCS = ["The castle stands on a hill.", "A zebra river flows past the castle walls.", "Paris is in France."]


@pytest.fixture(scope="module")
def student_dir(tiny_reranker: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny_reranker.metadata.update({"loss": "ranknet", "label_generators": ["SmolLM2-135M-Instruct"],
                                   "label_sources": ["moi:cyclic/consensus"], "num_queries": 48,
                                   "metrics": {"mrr@10": 0.61}})
    return tiny_reranker.save_pretrained(tmp_path_factory.mktemp("students") / "tiny-student")


def test_save_pretrained_folder_loads_everywhere(tiny_reranker: Any, student_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    assert (student_dir / META_FILE).exists() and (student_dir / "model.safetensors").exists()
    card = (student_dir / "README.md").read_text(encoding="utf-8")
    for needle in ("library_name: sentence-transformers", "Mixture-of-Intervention", "SmolLM2-135M-Instruct",
                   "moi:cyclic/consensus", "| mrr@10 | 0.61 |", "| loss | ranknet |",
                   "ragkit serve --reranker student:tiny-student"):
        assert needle in card, needle
    want = tiny_reranker.score_pairs([QUERY], [[_p(d, i) for i, d in enumerate(DOCS)]])[0]
    ce = CrossEncoder(str(student_dir), device="cpu")  # plain sentence-transformers
    got_ce = np.asarray(ce.predict([(QUERY, d) for d in DOCS], activation_fn=None, convert_to_numpy=True))
    assert np.allclose(got_ce.reshape(-1), want, atol=1e-5)
    back = DistilledReranker.from_pretrained(student_dir, device="cpu")
    assert back.metadata["metrics"] == {"mrr@10": 0.61}
    assert back.rank(QUERY, DOCS).ids() == tiny_reranker.rank(QUERY, DOCS).ids()
    if os.environ.get("HF_HUB_OFFLINE") == "1":  # no network here: the upload refuses clearly
        with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE"):
            tiny_reranker.push_to_hub("someone/tiny-student")


def _p(text: str, i: int) -> Any:
    from ragkit.types import Passage

    return Passage(str(i), text)


def test_ragkit_serve_command_serves_the_folder(tiny_reranker: Any, student_dir: Path, ragkit_serve: Any) -> None:
    proc, url = ragkit_serve(["--reranker", f"student:{student_dir}", "--device", "cpu", "--max-documents", "5",
                              "--log-level", "warning", "--max-batch-tokens", "1024", "--forward-cost-tokens", "0"],
                             env={**os.environ, "RAGKIT_API_KEY": "k3y"})
    try:
        assert "settings" not in httpx.get(url + "/health").json()  # the open view shows no setting
        assert httpx.get(url + "/health?detail=1").status_code == 401
        health = httpx.get(url + "/health?detail=1", headers={"Authorization": "Bearer k3y"}).json()
        assert health["settings"]["max_documents"] == 5 and health["settings"]["api_key"] == "set"
        body = {"query": QUERY, "texts": DOCS, "raw_scores": True}
        assert httpx.post(url + "/rerank", json=body).status_code == 401  # RAGKIT_API_KEY is honoured
        r = httpx.post(url + "/rerank", json=body, headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 200
        expected = tiny_reranker.rank(QUERY, DOCS)
        assert [x["index"] for x in r.json()] == [int(i) for i in expected.ids()]
        assert [x["score"] for x in r.json()] == pytest.approx(expected.scores(), abs=1e-5)
        too_many = httpx.post(url + "/rerank", json={"query": QUERY, "texts": DOCS * 2},
                              headers={"Authorization": "Bearer k3y"})
        assert too_many.status_code == 413 and "max_documents" in json.dumps(too_many.json())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
