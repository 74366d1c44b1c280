"""Dataset loaders: every dataset becomes a list of :class:`~ragkit.types.QARecord`.

(Only the local HotpotQA reader exists yet; the evaluation issue extends this module.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.io import read_jsonl
from ragkit.types import Passage, QARecord

__all__ = ["SAMPLE_HOTPOTQA", "hotpotqa_record", "load_hotpotqa", "sample_records", "sample_corpus"]

SAMPLE_HOTPOTQA = Path(__file__).resolve().parents[1] / "data" / "hotpotqa_dev_sample.jsonl"


def hotpotqa_record(raw: Mapping[str, Any]) -> QARecord:
    """Convert one HotpotQA record (HF ``hotpot_qa`` schema) into a ``QARecord``.

    A paragraph's id is its Wikipedia title; its text is the concatenation of its sentences.
    The gold passages are the titles named in ``supporting_facts.title``.
    """
    try:
        ctx = raw["context"]
        titles, sents = ctx["title"], ctx["sentences"]
        gold = list(dict.fromkeys(raw["supporting_facts"]["title"]))
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"record {raw.get('id', '?')!r} is not in the HotpotQA schema (missing {e}); "
            "expected keys id, question, answer, supporting_facts{title}, context{title, sentences}"
        ) from e
    passages = tuple(
        Passage(id=t, title=t, text="".join(s).strip(), metadata={"gold": t in gold})
        for t, s in zip(titles, sents)
    )
    return QARecord(
        id=str(raw["id"]),
        question=str(raw["question"]),
        answers=(str(raw["answer"]),) if raw.get("answer") is not None else (),
        passages=passages,
        gold_ids=tuple(gold),
        metadata={"type": raw.get("type"), "level": raw.get("level"), "dataset": "hotpotqa"},
    )


def load_hotpotqa(path: str | os.PathLike[str], limit: int | None = None) -> list[QARecord]:
    """Read HotpotQA records from a local JSONL file (distractor-setting schema)."""
    rows = read_jsonl(path)
    if limit is not None:
        rows = rows[:limit]
    return [hotpotqa_record(r) for r in rows]


def sample_records(limit: int | None = None) -> list[QARecord]:
    """The bundled 100-question HotpotQA dev sample (CC BY-SA 4.0)."""
    return load_hotpotqa(SAMPLE_HOTPOTQA, limit)


def sample_corpus() -> list[Passage]:
    """The bundled sample's paragraphs pooled into one corpus, de-duplicated by title (id)."""
    seen: dict[str, Passage] = {}
    for rec in sample_records():
        for p in rec.passages:
            seen.setdefault(p.id, Passage(id=p.id, title=p.title, text=p.text))
    return list(seen.values())
