"""experiments/distill/distill.py on tiny real models: MoI's default design as the teacher, the profile for the
placement, and the given order beside BM25 in the ranking-only block."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench(load_bench) -> ModuleType:
    return load_bench("distill")


def test_default_moi_teacher_profile_placement_and_given_order(
    bench: ModuleType, tiny_lm_dir: Path, tiny_encoder_dir: Path, hotpot_dev_records: list[dict],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGKIT_NO_PROGRESS", "1")
    from ragkit.debias import PositionProfile
    from ragkit.debias.student import DistilledReranker

    student = tmp_path / "student"
    DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0).save_pretrained(student)
    dev = tmp_path / "dev.jsonl"
    recs = [dict(r) for r in hotpot_dev_records[:3]]
    # one question with 9 paragraphs (HotpotQA dev has some): the 10-slot profile must be resized for it
    ctx, gold_titles = recs[1]["context"], set(recs[1]["supporting_facts"]["title"])
    drop = max(i for i, t in enumerate(ctx["title"]) if t not in gold_titles)
    recs[1]["context"] = {key: [v for i, v in enumerate(vals) if i != drop] for key, vals in ctx.items()}
    dev.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    w = np.linspace(1.0, 0.1, 10)  # primacy: the heaviest slot is the first, unlike the recency default
    prof = tmp_path / "profile.json"
    PositionProfile(w, k=10).save(prof)
    out, cache = tmp_path / "d.json", tmp_path / "cache.jsonl"
    assert bench.main(["--out", str(out), "--cache", str(cache), "--dev-file", str(dev), "--n-dev", "3",
                       "--methods", "retriever,moi,student", "--teacher", "moi", "--student", str(student),
                       "--model", str(tiny_lm_dir), "--passage-max-tokens", "8", "--batch", "2",
                       "--profile", str(prof), "--ranking-only-n", "3"]) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    assert set(res["methods"]) == {"retriever", "moi", "student"}
    assert res["comparison"]["teacher"] == "moi" and "rerank_speedup_vs_teacher" in res["comparison"]
    assert res["profile"].endswith("profile.json")
    # paired intervals: their means are the differences of the table's means (ranx's MRR, our F1)
    ci, m = res["comparison"]["paired_ci95"], res["methods"]
    assert set(ci) == {"moi - retriever", "student - retriever", "student - moi"}
    for pair, d in ci.items():
        a, b = pair.split(" - ")
        for metric in ("mrr@10", "f1"):
            assert d[metric][0] == pytest.approx(m[a][metric] - m[b][metric])
            assert d[metric][1] <= d[metric][0] <= d[metric][2]
    rows = [json.loads(line) for line in cache.read_text(encoding="utf-8").splitlines()]
    assert {r["method"] for r in rows} == {"retriever", "moi", "student"}
    assert sorted(len(r["order"]) for r in rows if r["method"] == "student") == [9, 10, 10]
    for r in rows:
        if r["method"] == "student":
            assert r["order"][0] == r["ranking"][0]  # best passage into the profile's heaviest slot
        if r["method"] == "moi":
            assert r["generator_calls"] > 2  # interventions + the answer

    # the given order, scored by hand: MRR@10 of the first gold paragraph in the dataset's order
    titles = [r["context"]["title"] for r in recs]
    gold = [set(r["supporting_facts"]["title"]) for r in recs]
    mrr = np.mean([1.0 / (1 + next(i for i, t in enumerate(ts) if t in g)) for ts, g in zip(titles, gold)])
    assert res["ranking_only"]["given"]["mrr@10"] == pytest.approx(mrr)
    assert res["ranking_only"]["n"] == 3
