"""``llm:MODEL``: the yes/no relevance logit of a tiny random causal LM, against a hand computation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

QUERY = "which river flows through the zebra castle?"
DOCS = ["The castle stands on a hill above the town.", "A zebra river flows past the old castle walls.",
        "Paris is the capital of France.", "x"]


@pytest.fixture(scope="module")
def reranker(tiny_lm_dir: Path) -> Any:
    from ragkit.debias import get_reranker

    return get_reranker(f"llm:{tiny_lm_dir}", device="cpu", dtype="float32", batch_size=3)


def _by_hand(rr: Any, query: str, doc: str) -> float:
    """Render the chat by hand, run the model on the one unpadded sequence, read z_yes - z_no."""
    import torch

    from ragkit.debias.llm_reranker import SYSTEM_PROMPT

    tok = rr.tokenizer
    user = f"<Instruct>: {rr.instruction}\n<Query>: {query}\n<Document>: {doc}"
    text = tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    with torch.no_grad():
        z = rr.model(input_ids=torch.tensor([ids])).logits[0, -1]
    yes, no = tok.encode("yes", add_special_tokens=False)[0], tok.encode("no", add_special_tokens=False)[0]
    return float(z[yes] - z[no])


def test_scores_are_the_yes_no_log_odds(reranker: Any) -> None:
    got = reranker.rank(QUERY, DOCS)
    want = {str(i): _by_hand(reranker, QUERY, d) for i, d in enumerate(DOCS)}
    assert {h.id: h.score for h in got} == pytest.approx(want, abs=1e-4)
    assert got.ids() == sorted(want, key=lambda i: (-want[i], int(i)))
    assert len(set(want.values())) == len(DOCS)  # a random model still separates the documents
    assert reranker.forward_passes == len(DOCS)
    # batched with other queries (other lengths, padding on the right): the same scores
    merged = reranker.rank_many(["capital of France", QUERY], [DOCS[2:], DOCS])
    assert merged[1].scores() == pytest.approx(got.scores(), abs=1e-4)


def test_long_documents_and_registry(reranker: Any, tiny_lm_dir: Path) -> None:
    from ragkit.debias import available_rerankers, get_reranker
    from ragkit.debias.long_docs import LongDocs
    from ragkit.debias.presets import resolve_method

    assert "llm:MODEL" in available_rerankers() and resolve_method(f"llm:{tiny_lm_dir}").loads_encoder
    long_doc = " ".join(["the castle wall is old"] * 400)
    rr = get_reranker(f"llm:{tiny_lm_dir}", device="cpu", dtype="float32", max_length=1024,
                      long_docs=LongDocs(max_tokens_per_doc=40))
    stats = rr.rank(QUERY, [long_doc, "x"]).info.details["long_docs"]
    assert stats["truncated"] == 1 and stats["documents"] == 2 and stats["per_document"]["truncated"] == [True, False]
    with pytest.raises(TypeError, match="takes no"):
        get_reranker(f"llm:{tiny_lm_dir}", seed=3)
    with pytest.raises(ValueError, match="names no model"):
        get_reranker("llm:")
