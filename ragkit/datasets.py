"""Dataset loaders: every dataset becomes a list of :class:`~ragkit.types.QARecord`.

Supported datasets (:func:`load_dataset`):

* ``hotpotqa`` -- HotpotQA (Yang et al., 2018), distractor setting: 10 paragraphs, 2 gold
  (the titles in ``supporting_facts``). ``setting="fullwiki"`` loads the hub's ``fullwiki``
  config; its records carry the hub's context paragraphs, and the evaluation runner is meant to
  retrieve candidates with a retriever from the pooled corpus (``--retriever bm25|dense|hybrid``).
* ``msmarco`` -- MS MARCO QnA v1.1 / v2.1 (Nguyen et al., 2016): Bing passages, gold =
  ``is_selected``; an answer ``"No Answer Present."`` means no answer.
* ``nq-open`` -- NQ-open (Lee et al., 2019; Kwiatkowski et al., 2019) in the oracle format of
  "Lost in the Middle" (Liu et al., 2024): ``ctxs`` with the gold passage; the hub's ``nq_open``
  has no passages (closed-book or retriever use).

Each loads from a local file (``path``) or, without a path, from the Hugging Face hub through
``datasets.load_dataset`` (needs network access).

:func:`detect_format` is the ONE format detector: it tells the three schemas apart from a file's
*content* (its first record's keys), never from the file name; JSON array, the official
column-wise MS MARCO JSON and (gzipped) JSONL are all read by content as well.
:func:`load_records` reads any of them, plus ragkit's own QA JSONL and paraphrase-set JSONL (the
training files).

Data that does not ship with the package (the full HotpotQA, MS MARCO and NQ-open files) is found
through ONE setting, the environment variable ``RAGKIT_DATA`` (:func:`data_dir`), so that no code
or example carries a machine's folder layout.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ragkit.io import parse_json, read_jsonl
from ragkit.types import Passage, QARecord

__all__ = [
    "DATA_ENV",
    "data_dir",
    "data_path",
    "load_records",
    "SAMPLE_HOTPOTQA",
    "DATASET_NAMES",
    "detect_format",
    "format_of_record",
    "hotpotqa_record",
    "load_hotpotqa",
    "msmarco_record",
    "load_msmarco",
    "nq_open_record",
    "load_nq_open",
    "load_dataset",
    "pooled_corpus",
    "sample_records",
    "sample_corpus",
]

logger = logging.getLogger(__name__)

DATASET_NAMES: tuple[str, ...] = ("hotpotqa", "msmarco", "nq-open")
MSMARCO_NO_ANSWER = "No Answer Present."

SAMPLE_HOTPOTQA = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"


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


def _columns_to_rows(obj: Any, name: str) -> list[dict[str, Any]]:
    """``{"is_selected": [...], "passage_text": [...]}`` -> list of row dicts (or pass rows through)."""
    if isinstance(obj, Mapping):
        keys = list(obj)
        n = len(obj[keys[0]]) if keys else 0
        if any(len(obj[k]) != n for k in keys):
            raise ValueError(f"{name}: columns have different lengths {[len(obj[k]) for k in keys]}")
        return [{k: obj[k][i] for k in keys} for i in range(n)]
    if isinstance(obj, list):
        return [dict(x) for x in obj]
    raise ValueError(f"{name}: expected a dict of columns or a list of rows, got {type(obj).__name__}")


def msmarco_record(raw: Mapping[str, Any], version: str = "v1.1") -> QARecord:
    """Convert one MS MARCO QnA record (v1.1/v2.1 hub or JSON-array schema) into a ``QARecord``.

    Passage ids are ``"{query_id}-{j}"`` in the given (Bing) order; gold ids are the passages with
    ``is_selected == 1``. Answers equal to ``"No Answer Present."`` (and empty strings) are
    dropped, so such a query has no answers.
    """
    try:
        qid = str(raw["query_id"])
        question = str(raw["query"])
        rows = _columns_to_rows(raw["passages"], f"MS MARCO query {qid}")
    except KeyError as e:
        raise ValueError(
            f"record is not in the MS MARCO QnA schema (missing {e}); expected keys "
            "query_id, query, passages{is_selected, passage_text, url}, answers"
        ) from e
    passages: list[Passage] = []
    gold: list[str] = []
    for j, r in enumerate(rows):
        pid = f"{qid}-{j}"
        sel = bool(int(r.get("is_selected", 0) or 0))
        passages.append(
            Passage(id=pid, text=str(r.get("passage_text", "")), metadata={"url": r.get("url", ""), "gold": sel})
        )
        if sel:
            gold.append(pid)
    answers = tuple(
        str(a) for a in (raw.get("answers") or []) if str(a).strip() and str(a).strip() != MSMARCO_NO_ANSWER
    )
    wfa = [str(a) for a in (raw.get("wellFormedAnswers") or []) if str(a).strip() and str(a) != "[]"]
    return QARecord(
        id=qid,
        question=question,
        answers=answers,
        passages=tuple(passages),
        gold_ids=tuple(gold),
        metadata={
            "dataset": "msmarco",
            "version": version,
            "query_type": raw.get("query_type"),
            "well_formed_answers": wfa,
        },
    )


def load_msmarco(
    path: str | os.PathLike[str], limit: int | None = None, version: str = "v1.1"
) -> list[QARecord]:
    """Read MS MARCO QnA from a local JSON array (``[{query_id, query, passages, answers}, ...]``),
    a JSONL file (one record a line, ``.gz`` ok) or the official column-wise JSON
    (``{"query_id": {"0": ...}, "query": {...}, ...}``)."""
    rows = _read_rows(path, "MS MARCO")
    if limit is not None:
        rows = rows[:limit]
    return [msmarco_record(r, version) for r in rows]


def _open_text(p: Path) -> Any:
    """Open a text file, gunzipping it when its first bytes are the gzip magic number; a UTF-8
    byte-order mark at its start is dropped (``utf-8-sig``)."""
    with open(p, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(p, "rt", encoding="utf-8-sig")
    return open(p, encoding="utf-8-sig")


def _is_columnwise(obj: Mapping[str, Any]) -> bool:
    """The official MS MARCO layout: ``{"query_id": {"0": ...}, "query": {"0": ...}, ...}``."""
    return isinstance(obj.get("query_id"), Mapping)


def _checked_file(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} file not found: {p}")
    if p.is_dir():
        raise ValueError(f"{p} is a folder; pass the data file inside it")
    return p


def _first_record(p: Path) -> dict[str, Any] | None:
    """The first line's record when the file is JSONL (``None``: a JSON document, array or columns)."""
    try:
        with _open_text(p) as f:
            first = next((ln for ln in itertools.islice(f, 50) if ln.strip()), None)
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not UTF-8 text ({e.reason}); pass a HotpotQA, MS MARCO or NQ-open data file "
                         "(JSON or JSONL, gzipped or not)") from None
    except (EOFError, OSError, zlib.error) as e:
        raise ValueError(f"{p}: cannot be read ({e}); a damaged or cut-short .gz? download it again") from None
    if first is None:
        raise ValueError(f"{p} is empty; pass a HotpotQA, MS MARCO or NQ-open data file")
    try:
        obj = parse_json(first, f"{p}:1")
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and not _is_columnwise(obj) else None


def _read_rows(path: str | os.PathLike[str], what: str = "data") -> list[dict[str, Any]]:
    """All records of a local data file, its layout told by content.

    A JSON array of records, the column-wise MS MARCO JSON, a single JSON object holding one record,
    or JSONL (one record a line; gzipped or not, whatever the file is called).
    """
    p = _checked_file(path, what)
    if _first_record(p) is not None:
        return read_jsonl(p)  # gzipped or not, whatever the file is called
    with _open_text(p) as f:
        try:
            data = parse_json(f.read(), p)
        except UnicodeDecodeError as e:
            raise ValueError(f"{p}: not UTF-8 text ({e.reason}); pass a JSON or JSONL data file") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: neither JSONL nor a JSON document ({e.msg} at line {e.lineno}); "
                             "pass one record a line (JSONL) or a JSON array of records") from e
    if isinstance(data, list):
        bad = next((i for i, r in enumerate(data) if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise ValueError(f"{p}: item {bad} of the JSON array is not an object (a record)")
        return [dict(r) for r in data]
    if isinstance(data, Mapping) and _is_columnwise(data):
        keys = list(data["query_id"])
        return [{col: (data[col].get(k) if isinstance(data[col], Mapping) else None) for col in data}
                for k in keys]
    if isinstance(data, Mapping):
        return [dict(data)]
    raise ValueError(f"{p}: expected JSON records, got a JSON {type(data).__name__}")


def format_of_record(raw: Mapping[str, Any]) -> str | None:
    """``"hotpotqa"``, ``"msmarco"`` or ``"nq-open"`` from one record's keys (``None``: unknown).

    HotpotQA has ``context`` and ``supporting_facts``; MS MARCO QnA has ``query_id`` (or ``query``
    and ``passages``); NQ-open has ``ctxs`` (oracle format) or ``question`` with ``answers``/``answer``
    (hub format).
    """
    keys = set(raw)
    if {"context", "supporting_facts"} <= keys:
        return "hotpotqa"
    if "query_id" in keys or {"query", "passages"} <= keys:
        return "msmarco"
    if "ctxs" in keys or ("question" in keys and ({"answers", "answer"} & keys)):
        return "nq-open"
    return None


def detect_format(path: str | os.PathLike[str]) -> str:
    """The dataset format of a local file, ``"hotpotqa"``, ``"msmarco"`` or ``"nq-open"``, from its content.

    Reads the first record (for JSONL only the first non-empty line) and applies
    :func:`format_of_record`; the file name plays no part.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Empty file, or a first record of none of the three schemas.
    """
    p = _checked_file(path, "data")
    rec = _first_record(p)
    if rec is None:
        rows = _read_rows(p)
        if not rows:
            raise ValueError(f"{p} holds no record")
        rec = rows[0]
    fmt = format_of_record(rec)
    if fmt is None:
        raise ValueError(f"cannot tell the dataset format of {p} (first record's keys: {sorted(rec)}); "
                         "pass the dataset name: hotpotqa, msmarco or nq-open")
    return fmt


def nq_open_record(raw: Mapping[str, Any], index: int = 0) -> QARecord:
    """Convert one NQ-open record into a ``QARecord``.

    Oracle format (``question, answers[], ctxs[{id?, title, text, hasanswer, isgold}]``): the
    contexts become passages (id = ``ctx["id"]`` or ``"nq{index}-{j}"``), gold = ``isgold``
    (``hasanswer`` when no ``isgold`` flag exists). The hub's ``nq_open`` schema
    (``question, answer[]``) gives a record without passages. Record id = ``raw["id"]`` or
    ``"nq{index}"``.
    """
    if "question" not in raw:
        raise ValueError(f"NQ-open record {index} has no 'question' key; keys are {sorted(raw)}")
    answers = raw.get("answers", raw.get("answer"))
    if isinstance(answers, str):
        answers = [answers]
    if not answers:
        raise ValueError(f"NQ-open record {index} has no 'answers'/'answer' aliases")
    rid = str(raw.get("id", f"nq{index}"))
    passages: list[Passage] = []
    gold: list[str] = []
    for j, c in enumerate(raw.get("ctxs") or []):
        pid = str(c.get("id") or f"{rid}-{j}")
        is_gold = bool(c.get("isgold", c.get("hasanswer", False)))
        passages.append(
            Passage(
                id=pid,
                text=str(c.get("text", "")),
                title=str(c.get("title") or ""),
                metadata={"hasanswer": bool(c.get("hasanswer", False)), "gold": is_gold},
            )
        )
        if is_gold:
            gold.append(pid)
    return QARecord(
        id=rid,
        question=str(raw["question"]),
        answers=tuple(str(a) for a in answers),
        passages=tuple(passages),
        gold_ids=tuple(gold),
        metadata={"dataset": "nq-open"},
    )


def load_nq_open(path: str | os.PathLike[str], limit: int | None = None) -> list[QARecord]:
    """Read NQ-open from a local (gzipped) JSONL file in the oracle or the hub schema."""
    rows = _read_rows(path, "NQ-open")
    if limit is not None:
        rows = rows[:limit]
    return [nq_open_record(r, i) for i, r in enumerate(rows)]


def _canonical(name: str) -> str:
    key = name.lower().replace("_", "-").strip()
    aliases = {
        "hotpotqa": "hotpotqa",
        "hotpot-qa": "hotpotqa",
        "hotpot": "hotpotqa",
        "msmarco": "msmarco",
        "ms-marco": "msmarco",
        "nq-open": "nq-open",
        "nqopen": "nq-open",
        "nq": "nq-open",
    }
    if key not in aliases:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    return aliases[key]


def _hub_rows(hub_id: str, config: str | None, split: str, limit: int | None) -> Iterable[Mapping[str, Any]]:
    """Rows of a hub dataset split through ``datasets.load_dataset`` (network needed)."""
    import datasets

    sl = split if limit is None else f"{split}[:{int(limit)}]"
    ds = datasets.load_dataset(hub_id, config, split=sl) if config else datasets.load_dataset(hub_id, split=sl)
    if limit is not None and len(ds) > limit:
        ds = ds.select(range(limit))
    return ds


def load_dataset(
    name: str | None,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    split: str | None = None,
    setting: str | None = None,
) -> list[QARecord]:
    """Load an evaluation dataset as ``QARecord`` objects.

    Parameters
    ----------
    name
        ``"hotpotqa"``, ``"msmarco"`` or ``"nq-open"``; ``None`` or ``"auto"`` with a ``path``:
        told from the file's content (:func:`detect_format`).
    path
        Local file in the dataset's format (a file of another format is refused); ``None`` loads from the
        Hugging Face hub
        (``hotpot_qa``/``distractor|fullwiki``, ``ms_marco``/``v1.1|v2.1``, ``nq_open``).
    limit
        Keep the first ``limit`` records.
    split
        Hub split (default ``"validation"``); ignored for local files.
    setting
        HotpotQA: ``"distractor"`` (default) or ``"fullwiki"``; MS MARCO: ``"v1.1"`` (default) or
        ``"v2.1"``. Ignored for NQ-open.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for all records), got {limit}")
    if name is None or str(name).lower() == "auto":
        if path is None:
            raise ValueError("load_dataset needs a dataset name or a data file to detect it from")
        ds = detect_format(path)
    else:
        ds = _canonical(name)
        if path is not None:
            try:
                found: str | None = detect_format(path)
            except ValueError:  # unknown or empty: the loader below names what is wrong
                found = None
            if found is not None and found != ds:
                raise ValueError(f"{path} holds {found} records, not {ds}; pass dataset {found!r} "
                                 "(or 'auto') or the right file")
    split = split or "validation"
    if ds == "hotpotqa":
        setting = setting or "distractor"
        if setting not in ("distractor", "fullwiki"):
            raise ValueError(f"HotpotQA setting must be 'distractor' or 'fullwiki', got {setting!r}")
        rows = _read_rows(path, "HotpotQA") if path is not None else list(_hub_rows("hotpot_qa", setting, split, limit))
        if limit is not None:
            rows = rows[:limit]
        recs = [hotpotqa_record(r) for r in rows]
        if setting == "fullwiki":
            recs = [
                QARecord(r.id, r.question, r.answers, r.passages, r.gold_ids, {**r.metadata, "setting": "fullwiki"})
                for r in recs
            ]
        return recs
    if ds == "msmarco":
        version = setting or "v1.1"
        if version not in ("v1.1", "v2.1"):
            raise ValueError(f"MS MARCO version must be 'v1.1' or 'v2.1', got {version!r}")
        if path is not None:
            return load_msmarco(path, limit, version)
        return [msmarco_record(r, version) for r in _hub_rows("ms_marco", version, split, limit)]
    if path is not None:
        return load_nq_open(path, limit)
    return [nq_open_record(r, i) for i, r in enumerate(_hub_rows("nq_open", None, split, limit))]


def pooled_corpus(records: Iterable[QARecord]) -> list[Passage]:
    """All records' passages in one corpus, de-duplicated by id (first occurrence wins)."""
    seen: dict[str, Passage] = {}
    for rec in records:
        for p in rec.passages:
            seen.setdefault(p.id, Passage(id=p.id, title=p.title, text=p.text))
    return list(seen.values())


def load_hotpotqa(path: str | os.PathLike[str], limit: int | None = None) -> list[QARecord]:
    """Read HotpotQA records from a local JSONL file (distractor-setting schema)."""
    if limit is not None and limit < 1:  # rows[:-1] would read "all but the last" silently
        raise ValueError(f"limit must be >= 1 (or None for all records), got {limit}")
    rows = _read_rows(path, "HotpotQA")
    if limit is not None:
        rows = rows[:limit]
    return [hotpotqa_record(r) for r in rows]


def sample_records(limit: int | None = None) -> list[QARecord]:
    """The bundled 100-question HotpotQA dev sample (CC BY-SA 4.0)."""
    return load_hotpotqa(SAMPLE_HOTPOTQA, limit)


def sample_corpus() -> list[Passage]:
    """The bundled sample's paragraphs pooled into one corpus, de-duplicated by title (id)."""
    return pooled_corpus(sample_records())


DATA_ENV = "RAGKIT_DATA"
"""The environment variable naming the folder of datasets that do not ship with ragkit."""


def data_dir() -> Path:
    """The folder of datasets outside the package: ``$RAGKIT_DATA``.

    Unset, a source checkout falls back to ``../shared/data`` beside the repository (the layout of
    the machines the committed results were measured on); that fallback is a convenience for the
    checkout only, and every documented command names ``$RAGKIT_DATA``.
    """
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def data_path(*parts: str) -> Path:
    """A path inside :func:`data_dir`.

    Raises
    ------
    FileNotFoundError
        When the data folder does not exist: the message says to set ``RAGKIT_DATA`` (or to pass
        the data file explicitly).
    """
    base = data_dir()
    if not base.is_dir():
        raise FileNotFoundError(
            f"data folder {base} not found: set the environment variable {DATA_ENV} to the folder holding "
            "the datasets (e.g. hotpotqa/dev.jsonl), or pass the data file explicitly")
    return base.joinpath(*parts)


def _qa_record(r: Mapping[str, Any], i: int) -> QARecord:
    ans = r.get("answers", r.get("answer", ()))
    return QARecord(id=str(r.get("id", i)), question=r["question"],
                    answers=tuple([ans] if isinstance(ans, str) else ans),
                    passages=tuple(Passage.from_dict(x) for x in r.get("passages", ())),
                    gold_ids=tuple(r.get("gold_ids", ())))


def load_records(path: str | os.PathLike[str], limit: int | None = None) -> list[Any]:
    """Read a file of questions in any format ragkit knows, told from its first record's keys.

    * ``paraphrases`` -> :class:`ragkit.paraphrase.ParaphraseSet` (``ParaphraseSet.to_dict`` lines);
    * ``context`` + ``supporting_facts`` -> HotpotQA (distractor setting);
    * ``query_id`` (or ``query`` + ``passages``) -> MS MARCO QnA; ``ctxs`` -> NQ-open (oracle format);
    * otherwise ragkit's QA JSONL, ``{id?, question, answers|answer, passages?, gold_ids?}`` with
      passages as :meth:`Passage.to_dict <ragkit.types.Passage.to_dict>` records (ids default to the
      line number).

    Returns
    -------
    list
        :class:`~ragkit.types.QARecord` objects, or :class:`~ragkit.paraphrase.ParaphraseSet` objects
        for a paraphrase-set file.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        An empty file, or a record of none of these formats (the message names the line).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for all records), got {limit}")
    p = _checked_file(path, "data")
    first = _first_record(p)
    if first is None:
        rows = _read_rows(p)
        first = rows[0] if rows else None
    if first is None:
        raise ValueError(f"{p} has no records")
    if "paraphrases" in first:
        from ragkit.paraphrase import ParaphraseSet

        return [ParaphraseSet.from_dict(r) for r in _read_rows(p)[:limit]]
    fmt = format_of_record(first)
    if fmt in ("hotpotqa", "msmarco") or (fmt == "nq-open" and "ctxs" in first):
        return load_dataset(fmt, p, limit=limit)
    out = []
    for i, r in enumerate(_read_rows(p)[:limit]):
        if "question" not in r:
            raise ValueError(f"{p} line {i + 1} has no 'question'; expected HotpotQA, MS MARCO, NQ-open, "
                             "ragkit QA or paraphrase-set JSONL")
        out.append(_qa_record(r, i))
    return out
