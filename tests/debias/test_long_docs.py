"""Long documents in the cross-encoder rerankers: text cut before tokenising, truncation sides, chunk-then-max."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.debias.long_docs import LongDocs, LongDocStats, cut_pairs

QUERY = "which river flows through the zebra castle?"
FILLER = ("The committee met again on Tuesday to discuss the budget of the harbour, the repairs of the old mill "
          "and the timetable of the autumn fair, but no decision was taken. ")
ANSWER = "The Zebra river flows through the zebra castle."


@pytest.fixture(scope="module")
def model(tiny_encoder_dir: Path) -> Any:
    """A tiny random one-output cross-encoder (2-layer BERT, hidden 32, pairs truncated at 64 tokens)."""
    from ragkit.debias.student import DistilledReranker

    return DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0).model


@pytest.fixture(scope="module")
def texts(hotpot_dev_records: list[dict]) -> list[str]:
    """Real paragraphs (HotpotQA dev), short and joined into long ones."""
    paras = ["".join(sents) for r in hotpot_dev_records for sents in r["context"]["sentences"]]
    joined = [" ".join(paras[i : i + 12]) for i in range(0, 48, 12)]
    return ["Paris is the capital of France.", "x", *paras[:6], *joined]


def _ids(tok: Any, q: str, d: str, max_length: int, **kw: Any) -> list[int]:
    return tok(q, d, max_length=max_length, **kw)["input_ids"]


def test_cut_pairs_read_what_the_tokenizer_would(model: Any, texts: list[str]) -> None:
    tok = model.tokenizer
    pairs = [(QUERY, t) for t in texts]
    cut = cut_pairs(tok, pairs, 64, LongDocs())
    assert len(cut.owners) == len(pairs) and all(len(o) == 1 for o in cut.owners)
    assert len(cut.units) == len(pairs) - 1  # the first joined text starts with paragraph 0: the same cut
    for (q, d), us, trunc in zip(pairs, cut.owners, cut.truncated):
        uq, ud = cut.units[us[0]]
        full = tok(q, d)["input_ids"]
        assert trunc == (len(full) > 64)
        if not trunc:
            assert (uq, ud) == (q, d)  # a document that fits is passed unchanged
        # the cut text holds exactly the tokens the tokenizer keeps when it truncates the document
        assert tok(uq, ud)["input_ids"] == _ids(tok, q, d, 64, truncation="only_second")
        assert cut.lengths[us[0]] == len(tok(uq, ud)["input_ids"])
    assert sum(cut.truncated) >= 4
    # "left" keeps the end: the cut document's tokens are the last ones of the full document
    left = cut_pairs(tok, pairs, 64, LongDocs(truncation_side="left"))
    for (q, d), us in zip(pairs, left.owners):
        uq, ud = left.units[us[0]]
        body = tok(d, add_special_tokens=False)["input_ids"]
        kept = tok(ud, add_special_tokens=False)["input_ids"]
        assert kept == body[len(body) - len(kept):]
        assert len(tok(uq, ud)["input_ids"]) == min(64, len(tok(q, d)["input_ids"]))


def test_a_long_query_keeps_half_the_budget(model: Any) -> None:
    tok = model.tokenizer
    query = " ".join(["which river flows through the zebra castle"] * 12)
    cut = cut_pairs(tok, [(query, FILLER * 3), (query, "short")], 64, LongDocs())
    (uq, ud), (uq2, _) = (cut.units[o[0]] for o in cut.owners)
    assert uq == uq2 and len(tok(uq, add_special_tokens=False)["input_ids"]) == 32
    assert len(tok(uq, ud)["input_ids"]) == 64 == cut.lengths[cut.owners[0][0]]


def test_max_tokens_per_doc_and_chunks(model: Any, texts: list[str]) -> None:
    tok = model.tokenizer
    long_doc = texts[-1]
    body = tok(long_doc, add_special_tokens=False)["input_ids"]
    capped = cut_pairs(tok, [(QUERY, long_doc), (QUERY, "short")], 64, LongDocs(max_tokens_per_doc=20))
    assert len(tok(capped.units[0][1], add_special_tokens=False)["input_ids"]) == 20
    assert capped.truncated == [True, False] and capped.units[1] == (QUERY, "short")

    cut = cut_pairs(tok, [(QUERY, long_doc)], 64, LongDocs(chunking="max", chunk_tokens=40, chunk_stride=30))
    pieces = [cut.units[u][1] for u in cut.owners[0]]
    starts = list(range(0, len(body) - 40 + 1, 30))
    if starts[-1] + 40 < len(body):
        starts.append(len(body) - 40)
    assert len(pieces) == len(starts) and cut.truncated == [False]
    for s, piece in zip(starts, pieces):  # every chunk is a window of the document's own tokens
        assert tok(piece, add_special_tokens=False)["input_ids"] == body[s : s + 40]
    # chunk size defaults to the encoder's budget (64 - 3 specials - query tokens), stride to 3/4 of it
    q_len = len(tok(QUERY, add_special_tokens=False)["input_ids"])
    dflt = cut_pairs(tok, [(QUERY, long_doc)], 64, LongDocs(chunking="max"))
    budget = 64 - 3 - q_len
    assert max(dflt.lengths) == 64
    assert len(dflt.owners[0]) == len(range(0, len(body) - budget + 1, budget * 3 // 4)) + 1
    # "first" scores the first chunk only: the same as truncating at the chunk size
    first = cut_pairs(tok, [(QUERY, long_doc)], 64, LongDocs(chunking="first", chunk_tokens=40))
    assert len(first.owners[0]) == 1 and first.truncated == [True]
    assert tok(first.units[0][1], add_special_tokens=False)["input_ids"] == body[:40]


def test_chunked_end_of_document_counts(model: Any) -> None:
    """The answer sentence at the end of a long document: truncation never reads it, chunk-then-max does."""
    long_doc = FILLER * 20 + ANSWER
    docs = [FILLER, long_doc, "Paris is the capital of France."]
    plain = CrossEncoderReranker(model)
    chunked = CrossEncoderReranker(model, long_docs=LongDocs(chunking="max"))
    r_plain = plain.rank(QUERY, docs)
    assert LongDocStats(**{k: v for k, v in r_plain.info.details["long_docs"].items() if k != "per_document"}) == \
        LongDocStats(documents=3, truncated=1, chunked=0, sequences=3)
    # truncated: the long document reads as its beginning, the same text as the filler alone
    assert dict(zip(r_plain.ids(), r_plain.scores()))["1"] == pytest.approx(
        float(plain.score_pairs([QUERY], [[_p(plain.cut([(QUERY, long_doc)]).units[0][1])]])[0][0]), abs=1e-5)
    r = chunked.rank(QUERY, docs)
    stats = r.info.details["long_docs"]
    assert (stats["documents"], stats["truncated"], stats["chunked"]) == (3, 0, 1) and stats["sequences"] > 3
    cut = chunked.cut([(QUERY, long_doc)])
    scores = plain.score_pairs([QUERY], [[_p(t) for _, t in cut.units]])[0]
    assert dict(zip(r.ids(), r.scores()))["1"] == pytest.approx(float(np.max(scores)), abs=1e-5)
    assert cut.units[-1][1].endswith(ANSWER)  # the last chunk ends at the document's end
    assert (chunked.docs_chunked, chunked.docs_truncated, plain.docs_truncated) == (1, 0, 1)
    # merged queries keep their own counts
    merged = chunked.rank_many([QUERY, "capital of France"], [docs, docs[2:]])
    assert [m.info.details["long_docs"]["chunked"] for m in merged] == [1, 0]


def test_huge_documents_are_cut_before_tokenising(model: Any) -> None:
    """1,000 documents of 20,000 characters: the tokenizer sees a window of each, never the whole text."""
    seen: list[int] = []

    class Counting:  # the real tokenizer, recording how many characters it is handed
        def __init__(self, tok: Any) -> None:
            self.tok = tok
            self.is_fast = True

        def __call__(self, texts: Any, *args: Any, **kw: Any) -> Any:
            seen.append(sum(map(len, texts)) if isinstance(texts, list) else len(texts))
            return self.tok(texts, *args, **kw)

        def num_special_tokens_to_add(self, pair: bool) -> int:
            return self.tok.num_special_tokens_to_add(pair=pair)

    docs = [f"doc {i} " + (FILLER * 200)[: 20_000 - 10] for i in range(1000)]
    cut = cut_pairs(Counting(model.tokenizer), [(QUERY, d) for d in docs], 64, LongDocs())
    assert all(cut.truncated) and len(cut.units) == 1000
    assert sum(seen) < 0.05 * sum(map(len, docs))


def test_settings_are_checked(model: Any, tmp_path: Path) -> None:
    from ragkit.debias import get_reranker
    from ragkit.debias.student import DistilledReranker

    with pytest.raises(ValueError, match="truncation_side"):
        LongDocs(truncation_side="middle")
    with pytest.raises(ValueError, match="chunking"):
        LongDocs(chunking="mean")
    with pytest.raises(ValueError, match="chunking is off"):
        LongDocs(chunk_tokens=100)
    with pytest.raises(ValueError, match="max_tokens_per_doc"):
        LongDocs(max_tokens_per_doc=0)
    with pytest.raises(ValueError, match="stride"):
        LongDocs(chunking="max", chunk_tokens=10, chunk_stride=20)
    with pytest.raises(TypeError, match="LongDocs"):
        CrossEncoderReranker(model, long_docs={"chunking": "max"})  # type: ignore[arg-type]
    folder = DistilledReranker(model, {"seed": 0}).save_pretrained(tmp_path / "s")
    rule = LongDocs(max_tokens_per_doc=30, truncation_side="left")
    for rr in (DistilledReranker.load(folder, device="cpu", long_docs=rule),
               DistilledReranker.from_pretrained(folder, device="cpu", long_docs=rule),
               get_reranker(f"student:{folder}", device="cpu", long_docs=rule),
               get_reranker(f"cross-encoder:{folder}", device="cpu", long_docs=rule)):
        assert rr.long_docs == rule


def _p(text: str) -> Any:
    from ragkit.types import Passage

    return Passage(id="0", text=text)
