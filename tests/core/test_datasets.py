"""Dataset loaders on the real shared files and on a monkeypatched hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragkit import datasets as D
from ragkit.types import QARecord


def test_hotpotqa_local(shared_data: Path) -> None:
    recs = D.load_dataset("hotpotqa", shared_data / "hotpotqa" / "dev.jsonl", limit=5)
    assert len(recs) == 5 and all(isinstance(r, QARecord) for r in recs)
    for r in recs:
        assert len(r.passages) == 10
        assert len(r.gold_ids) == 2 and set(r.gold_ids) <= {p.id for p in r.passages}
        assert r.answers


def test_msmarco_local(shared_data: Path) -> None:
    path = shared_data / "msmarco" / "qna_v1.1_sample.json"
    recs = D.load_dataset("msmarco", path)
    raw = json.loads(path.read_text())
    assert len(recs) == len(raw) == 150
    r0, raw0 = recs[0], raw[0]
    assert r0.id == str(raw0["query_id"]) and r0.question == raw0["query"]
    assert len(r0.passages) == len(raw0["passages"]["passage_text"])
    sel = [f"{raw0['query_id']}-{j}" for j, s in enumerate(raw0["passages"]["is_selected"]) if s]
    assert list(r0.gold_ids) == sel
    assert sum(1 for r in recs if not r.answers) == sum(1 for x in raw if not x["answers"])


def test_msmarco_no_answer_present(tmp_path: Path) -> None:
    raw = [{
        "query_id": 7, "query": "q?", "query_type": "description",
        "passages": {"is_selected": [0, 1], "passage_text": ["a", "b"], "url": ["u1", "u2"]},
        "answers": ["No Answer Present."], "wellFormedAnswers": [],
    }]
    p = tmp_path / "m.json"
    p.write_text(json.dumps(raw))
    (r,) = D.load_msmarco(p)
    assert r.answers == () and r.gold_ids == ("7-1",)


def test_nq_open_local(shared_data: Path) -> None:
    recs = D.load_dataset("nq-open", shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", limit=10)
    assert len(recs) == 10
    assert recs[0].question == "who got the first nobel prize in physics"
    assert recs[0].answers == ("Wilhelm Conrad Röntgen",)
    assert recs[0].gold_ids == (recs[0].passages[0].id,)
    assert len({r.id for r in recs}) == 10


def test_unknown_dataset_and_bad_limit() -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        D.load_dataset("squad", "x")
    with pytest.raises(ValueError, match="limit"):
        D.load_dataset("hotpotqa", "x", limit=0)


def test_hub_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls: list[tuple] = []
    tables = {
        "hotpot_qa": [{
            "id": "h1", "question": "q?", "answer": "yes", "type": "comparison", "level": "hard",
            "supporting_facts": {"title": ["A", "B"], "sent_id": [0, 0]},
            "context": {"title": ["A", "C", "B"], "sentences": [["a1 ", "a2"], ["c"], ["b"]]},
        }],
        "ms_marco": [{
            "query_id": 1, "query": "what?", "query_type": "x",
            "passages": {"is_selected": [1, 0], "passage_text": ["p0", "p1"], "url": ["u", "v"]},
            "answers": ["ans"], "wellFormedAnswers": [],
        }],
        "nq_open": [{"question": "who?", "answer": ["him", "her"]}, {"question": "when?", "answer": ["now"]}],
    }

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None,
                          **kw: object) -> datasets.Dataset:
        calls.append((path, name, split))
        return datasets.Dataset.from_list(tables[path])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    (h,) = D.load_dataset("hotpotqa", limit=1, setting="fullwiki")
    assert h.gold_ids == ("A", "B") and h.passages[0].text == "a1 a2" and h.metadata["setting"] == "fullwiki"
    (m,) = D.load_dataset("msmarco", setting="v2.1")
    assert m.gold_ids == ("1-0",) and m.metadata["version"] == "v2.1"
    nq = D.load_dataset("nq-open", limit=2)
    assert [r.answers for r in nq] == [("him", "her"), ("now",)] and nq[0].passages == ()
    assert calls == [("hotpot_qa", "fullwiki", "validation[:1]"), ("ms_marco", "v2.1", "validation"),
                     ("nq_open", None, "validation[:2]")]


def test_sample_records_and_corpus_still_work() -> None:
    recs = D.sample_records(3)
    assert len(recs) == 3
    corpus = D.sample_corpus()
    assert len({p.id for p in corpus}) == len(corpus)
    assert D.pooled_corpus(recs)[0].id == recs[0].passages[0].id


def test_one_format_detector_reads_content_not_names(shared_data: Path, tmp_path: Path) -> None:
    """Files renamed to mislead (a HotpotQA file called ``nq_marco.json``...) are told apart by content."""
    import gzip
    import shutil

    hot = tmp_path / "nq_marco.json"  # JSONL content under a JSON, "nq" and "marco" name
    hot.write_text("".join(ln for _, ln in zip(range(3), open(shared_data / "hotpotqa" / "dev.jsonl"))))
    marco = tmp_path / "hotpot.jsonl"  # a JSON array under a JSONL name
    shutil.copy(shared_data / "msmarco" / "qna_v1.1_sample.json", marco)
    nq = tmp_path / "data.bin"  # gzipped JSONL without a .gz suffix
    with gzip.open(shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", "rb") as f:
        nq.write_bytes(gzip.compress(b"".join(f.readline() for _ in range(4))))
    assert [D.detect_format(p) for p in (hot, marco, nq)] == ["hotpotqa", "msmarco", "nq-open"]
    assert len(D.load_dataset("auto", hot)) == 3
    assert len(D.load_dataset(None, marco, limit=5)) == 5
    assert len(D.load_dataset("auto", nq)) == 4
    with pytest.raises(ValueError, match="holds hotpotqa records, not msmarco"):
        D.load_dataset("msmarco", hot)


def test_detect_format_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        D.detect_format(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        D.detect_format(tmp_path / "empty.jsonl")
    (tmp_path / "odd.jsonl").write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(ValueError, match="cannot tell the dataset format.*foo"):
        D.detect_format(tmp_path / "odd.jsonl")
    with pytest.raises(ValueError, match="is a folder"):
        D.detect_format(tmp_path)
    with pytest.raises(ValueError, match="needs a dataset name"):
        D.load_dataset("auto")
