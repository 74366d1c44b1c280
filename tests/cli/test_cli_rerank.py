"""``ragkit rerank`` / ``ask`` / ``bias-profile`` on the tiny random LM."""

from __future__ import annotations

import json

from ragkit.cli import main
from ragkit.datasets import SAMPLE_HOTPOTQA
from ragkit.io import write_jsonl


def test_rerank_cli(tiny_lm_dir, tmp_path, capsys) -> None:
    f = tmp_path / "p.jsonl"
    write_jsonl(f, [{"id": f"x{i}", "text": f"passage {i} text", "score": 3.0 - i} for i in range(3)])
    out = tmp_path / "r.json"
    rc = main(["rerank", "--query", "which passage?", "--passages", str(f), "--model", str(tiny_lm_dir),
               "--design", "prior", "--budget", "2", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert sorted(r["id"] for r in res["ranking"]) == ["x0", "x1", "x2"] and len(res["orderings"]) == 2
    assert (res["design"], res["outcome"]) == ("prior", "question")  # --design overrides the preset's only
    # the default (issue 20): leave-one-out with the question's likelihood, k + 1 interventions
    capsys.readouterr()
    rc = main(["rerank", "--query", "which passage?", "--passages", str(f), "--model", str(tiny_lm_dir),
               "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and (res["reranker"], res["design"], res["outcome"]) == ("moi", "loo", "question")
    assert len(res["orderings"]) == 4 and res["generator_calls"] == 4 and res["tokens_prefilled"] > 0
    # the random model's interventions do not separate the passages: the output says it kept the input order
    assert res["fallback"] is True and res["fallback_reason"]
    assert [r["id"] for r in res["ranking"]] == ["x0", "x1", "x2"]
    assert f"fell back to the input order: {res['fallback_reason']}" in capsys.readouterr().out
    rc = main(["rerank", "--query", "which passage?", "--passages", str(f), "--model", str(tiny_lm_dir),
               "--reranker", "moi_cyclic", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and (res["design"], res["outcome"]) == ("cyclic", "consensus") and len(res["orderings"]) == 3
    capsys.readouterr()
    assert main(["rerank", "--query", "q", "--passages", str(f), "--model", str(tiny_lm_dir), "--budget", "3"]) == 1
    assert "loo design" in capsys.readouterr().err  # refused before the model is loaded
    assert main(["rerank", "--query", "q", "--passages", str(f), "--budget", "0"]) == 2  # a usage error
    assert "budget" in capsys.readouterr().err
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert main(["rerank", "--query", "q", "--passages", str(empty)]) == 1


def test_ask_and_bias_profile_cli(tiny_lm_dir, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RAGKIT_CACHE", str(tmp_path / "cache"))  # bias-profile also caches the profile
    out = tmp_path / "a.json"
    rc = main(["ask", "Which magazine was started first?", "-k", "3", "--model", str(tiny_lm_dir),
               "--design", "prior", "--budget", "2", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["moi"] and len(res["passages"]) == 3 and "answer" in res
    assert "Answer:" in capsys.readouterr().out
    prof, png = tmp_path / "prof.json", tmp_path / "prof.png"
    rc = main(["bias-profile", "--data", str(SAMPLE_HOTPOTQA), "--k", "3", "--limit", "2", "--model",
               str(tiny_lm_dir), "--out", str(prof), "--plot", str(png)])
    assert rc == 0 and png.stat().st_size > 1000
    w = json.loads(prof.read_text())["weights"]
    assert len(w) == 3 and abs(sum(w) - 1) < 1e-9
