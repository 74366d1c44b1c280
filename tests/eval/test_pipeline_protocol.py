"""The retrieve-N, rerank, prompt-K protocol of ``ragkit eval``: pooled corpus, ledger, resume, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragkit.datasets import load_hotpotqa
from ragkit.eval.runner import EvalConfig, candidates_for, pipeline_corpus, run_eval, select_questions, split_method


@pytest.fixture(scope="module")
def hotpot_file(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """The first 6 HotpotQA dev records as a file (60 paragraphs, 2 gold each)."""
    out = tmp_path_factory.mktemp("hp") / "h6.jsonl"
    with open(shared_data / "hotpotqa" / "dev.jsonl", encoding="utf-8") as f:
        out.write_text("".join(line for _, line in zip(range(6), f)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def tiny_gen(tiny_lm_dir: Path):
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=12, show_progress=False)


def _cfg(hotpot_file: Path, **kw) -> EvalConfig:
    base = dict(dataset="hotpotqa", data_file=str(hotpot_file), retriever="bm25", candidates=8, k=3,
                max_new_tokens=2, n_bootstrap=20, chunk_size=1)
    base.update(kw)
    return EvalConfig(**base)


def test_corpus_pools_every_record_whatever_limit_says(hotpot_file: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.jsonl"
    first = load_hotpotqa(hotpot_file)[0]
    # a passage that repeats the first question word for word: BM25 must rank it first for that question
    extra.write_text(json.dumps({"id": "extra-1", "title": "Extra", "text": first.question}) + "\n", encoding="utf-8")
    cfg = _cfg(hotpot_file, limit=2, corpus=(str(extra),))
    pool = load_hotpotqa(hotpot_file)
    qs = select_questions(cfg, pool)
    assert [r.id for r in qs] == [r.id for r in pool[:2]]
    corpus = pipeline_corpus(cfg, pool)
    assert len(corpus) == len({p.id for r in pool for p in r.passages}) + 1
    cands = candidates_for(cfg, qs, pool=pool)
    assert all(len(c) == 8 for c in cands)
    assert cands[0].ids()[0] == "extra-1"
    # 25 candidates: more than the 2 evaluated records' 20 paragraphs and the extra passage together
    deep = candidates_for(_cfg(hotpot_file, limit=2, candidates=25, corpus=(str(extra),)), qs, pool=pool)
    later = {p.id for r in pool[2:] for p in r.passages} - {p.id for r in pool[:2] for p in r.passages}
    assert all(len(c) == 25 and set(c.ids()) & later for c in deep)  # distractors of questions beyond the limit
    assert select_questions(EvalConfig(offset=4, limit=5), pool) == pool[4:6]


def test_protocol_rows_and_ledger(hotpot_file: Path, tiny_gen, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    rep = run_eval(_cfg(hotpot_file, limit=2, methods=("none", "upr", "icr", "moi", "moi@prune")), out=out,
                   generator=tiny_gen, show_progress=False)
    data = json.loads(out.read_text())
    assert data["protocol"]["candidates"] == 8 and data["protocol"]["k"] == 3
    assert data["protocol"]["corpus_passages"] == 60  # all 6 records, not the 2 evaluated
    rows = {(r["method"], r["qid"]): r for r in data["outputs"]}
    for (m, _), r in rows.items():
        assert len(r["candidates"]) == 8 and sorted(r["ranking"]) == sorted(r["candidates"])
        assert r["prompt"] == [r["candidates"][i] for i in r["order"]]
        assert 1 <= len(r["prompt"]) <= 3 if m == "moi@prune" else len(r["prompt"]) == 3
        assert r["gold_ids"] and isinstance(r["fallback"], bool)
        assert set(r["cost"]) == {"generator_calls", "forwards", "tokens_prefilled", "tokens_generated", "seconds"}
        assert r["cost"]["tokens_prefilled"] > 0 and r["cost"]["forwards"] >= 1
        assert {"ndcg@10", "mrr@10", "recall@3", "em", "f1"} <= set(r["metrics"])
        gold = set(r["gold_ids"])
        assert r["metrics"]["recall@3"] == len(gold & set(r["prompt"])) / len(gold)
    qid = data["outputs"][0]["qid"]
    calls = {m: rows[(m, qid)]["cost"]["generator_calls"] for m in ("none", "upr", "icr", "moi")}
    assert calls == {"none": 1, "upr": 9, "icr": 3, "moi": 10}  # N + 1, 2 + 1, (N + 1) + 1 with N = 8
    tok = {m: rows[(m, qid)]["cost"]["tokens_prefilled"] for m in ("none", "upr", "icr", "moi")}
    assert tok["none"] < tok["icr"] < tok["upr"] < tok["moi"]
    # the 'none' prompt is prefilled once: exactly its tokens
    from ragkit.generation.fitting import encode_prompts

    r = rows[("none", qid)]
    cands = {p.id: p for rec in load_hotpotqa(hotpot_file) for p in rec.passages}
    prompt = tiny_gen.build_prompt(r["question"], [cands[i] for i in r["prompt"]])
    assert tok["none"] == len(encode_prompts(tiny_gen.tokenizer, [prompt])[0])
    pr = rows[("moi@prune", qid)]
    assert 0.0 <= pr["harmful_share"] <= 1.0 and isinstance(pr["abstain"], bool)
    assert rep["aggregate"]["moi@prune"]["prompt_passages_per_question"] <= 3
    assert rep["aggregate"]["moi"]["cost_per_question"]["tokens_prefilled"] == pytest.approx(
        sum(rows[("moi", q)]["cost"]["tokens_prefilled"] for q in {k[1] for k in rows}) / 2)
    assert "recall@3" in rep["paired"]["upr - none"]


def test_interrupted_run_resumes_to_the_same_rows(hotpot_file: Path, tiny_gen, tmp_path: Path) -> None:
    cfg = _cfg(hotpot_file, limit=3, methods=("none", "upr"))
    full = run_eval(cfg, out=tmp_path / "a.json", generator=tiny_gen, show_progress=False)

    def stop(n: int) -> None:
        if n >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_eval(cfg, out=tmp_path / "b.json", generator=tiny_gen, show_progress=False, on_chunk=stop)
    assert (tmp_path / "b.json.partial.jsonl").exists()
    resumed = run_eval(cfg, out=tmp_path / "b.json", generator=tiny_gen, show_progress=False)
    assert resumed["timing"]["resumed_items"] == 2

    def strip(rows):
        return [{k: ({c: x for c, x in v.items() if c != "seconds"} if k == "ranking_cost" else v)
                 for k, v in r.items() if k not in ("seconds", "cost")} for r in rows]

    assert strip(resumed["outputs"]) == strip(full["outputs"])


_SAME = ("ranking", "order", "prompt", "prediction", "utilities", "fallback", "abstain", "harmful", "candidates")


def _rows(rep: dict, method: str) -> dict:
    return {r["qid"]: r for r in rep["outputs"] if r["method"] == method}


def test_placement_variant_reuses_the_base_ranking(hotpot_file: Path, tiny_gen, tmp_path: Path) -> None:
    """``moi@prune`` beside ``moi`` places and answers from ``moi``'s ranking: the rows a separate
    ``moi@prune`` run gives, at the cost of one ranking, with the ranking still in its ledger."""
    from ragkit.generation.base import metered

    kw = dict(limit=3, chunk_size=2, method_kwargs={"moi": {"blend": 0}, "moi@prune": {"blend": 0}})
    with metered() as work:
        both = run_eval(_cfg(hotpot_file, methods=("moi", "moi@prune"), **kw), out=tmp_path / "both.json",
                        generator=tiny_gen, show_progress=False)
    alone = run_eval(_cfg(hotpot_file, methods=("moi@prune",), **kw), out=tmp_path / "alone.json",
                     generator=tiny_gen, show_progress=False)
    base, reused, solo = _rows(both, "moi"), _rows(both, "moi@prune"), _rows(alone, "moi@prune")
    assert list(reused) == list(solo) and len(solo) == 3
    for q, r in reused.items():
        assert r["utilities"] and "abstain" in r
        assert {f: r.get(f) for f in _SAME} == {f: solo[q].get(f) for f in _SAME}
        assert r["ranking"] == base[q]["ranking"] and r["utilities"] == base[q]["utilities"]
        assert r["ranking_reused_from"] == "moi" and "ranking_reused_from" not in solo[q]
        # the ledger: the base's ranking share, plus this row's own answer; as much work as ranking anew
        assert r["ranking_cost"] == base[q]["ranking_cost"]
        rc = r["ranking_cost"]
        assert 0 < rc["tokens_prefilled"] < base[q]["cost"]["tokens_prefilled"]
        assert rc["generator_calls"] == 9 and r["cost"]["generator_calls"] == solo[q]["cost"]["generator_calls"] == 10
        for key in ("forwards", "tokens_prefilled", "tokens_generated"):
            assert r["cost"][key] > rc[key] or key == "tokens_generated"
            assert r["cost"][key] == pytest.approx(solo[q]["cost"][key], abs=0.011)
        assert r["seconds"] == r["cost"]["seconds"] >= rc["seconds"]
    # the model work actually done: the rows' ledgers count the ranking twice, the run did it once
    charged = sum(r["cost"]["tokens_prefilled"] for r in both["outputs"])
    once = charged - sum(r["ranking_cost"]["tokens_prefilled"] for r in reused.values())
    assert work.tokens_prefilled == pytest.approx(once, abs=1) and work.tokens_prefilled < charged - 100


def test_ranking_reuse_needs_the_same_reranker_settings(hotpot_file: Path) -> None:
    from ragkit.eval.runner import ranking_sources

    methods = ("none", "moi@prune", "moi", "upr@both_ends", "moi_loo@prune")
    assert ranking_sources(_cfg(hotpot_file, methods=methods)) == {"moi@prune": "moi"}
    same = {"moi": {"blend": 0}, "moi@prune": {"blend": 0, "top_k": 2}}
    assert ranking_sources(_cfg(hotpot_file, methods=methods, method_kwargs=same)) == {"moi@prune": "moi"}
    for other in ({"moi": {"blend": 0}, "moi@prune": {"blend": 1}}, {"moi@prune": {"blend": 0}},
                  {"moi": {"lam": 0.5}}):
        assert ranking_sources(_cfg(hotpot_file, methods=methods, method_kwargs=other)) == {}


def test_reuse_after_a_resume_gives_the_same_rows(hotpot_file: Path, tiny_gen, tmp_path: Path) -> None:
    """The base listed after its variant still ranks first; after an interruption the base's resumed
    rows are not in memory, so the variant ranks those questions itself, and the rows do not change."""
    cfg = _cfg(hotpot_file, limit=2, methods=("moi@prune", "moi"))
    alone = _rows(run_eval(_cfg(hotpot_file, limit=2, methods=("moi@prune",)), out=tmp_path / "a.json",
                           generator=tiny_gen, show_progress=False), "moi@prune")

    def stop(n: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # after moi's first question
        run_eval(cfg, out=tmp_path / "b.json", generator=tiny_gen, show_progress=False, on_chunk=stop)
    rep = run_eval(cfg, out=tmp_path / "b.json", generator=tiny_gen, show_progress=False)
    assert [r["method"] for r in rep["outputs"]] == ["moi@prune", "moi@prune", "moi", "moi"]
    rows = _rows(rep, "moi@prune")
    first, second = (r["qid"] for r in rep["outputs"][:2])
    assert "ranking_reused_from" not in rows[first] and rows[second]["ranking_reused_from"] == "moi"
    for q, r in rows.items():
        assert {f: r.get(f) for f in _SAME} == {f: alone[q].get(f) for f in _SAME}


def test_protocol_settings_are_checked_before_any_model_loads(hotpot_file: Path) -> None:
    with pytest.raises(ValueError, match="smaller than -k"):
        _cfg(hotpot_file, candidates=2, k=3)
    with pytest.raises(ValueError, match="prune keeps passages by their leave-one-out"):
        split_method("upr@prune")
    with pytest.raises(ValueError, match="unknown placement"):
        split_method("moi@sideways")
    with pytest.raises(FileNotFoundError, match="--corpus"):
        _cfg(hotpot_file, corpus=("/no/such/corpus.jsonl",))
    assert split_method("moi@prune") == ("moi", "prune") and split_method("icr") == ("icr", None)
    # the defaults keep an earlier run's fingerprint; the pipeline settings change it
    assert EvalConfig(k=4).fingerprint() == EvalConfig(k=4, offset=3).fingerprint()
    assert EvalConfig(k=4).fingerprint() != EvalConfig(k=4, candidates=8).fingerprint()


@pytest.mark.slow
def test_cli_pipeline_command(hotpot_file: Path, tiny_lm_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.cli import main

    out = tmp_path / "cli.json"
    argv = ["eval", "--model", str(tiny_lm_dir), "--data-file", str(hotpot_file), "--retriever", "bm25",
            "--candidates", "20", "-k", "3", "--methods", "none,upr,icr,moi", "--limit", "1",
            "--passage-max-tokens", "8", "--max-new-tokens", "2", "--bootstrap", "10", "--device", "cpu",
            "--out", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    assert data["protocol"] == {"candidates": 20, "k": 3, "retriever": "bm25", "corpus_passages": 60, "offset": 0}
    assert [len(r["prompt"]) for r in data["outputs"]] == [3, 3, 3, 3]
    assert "tokens prefilled/q" in capsys.readouterr().out
    assert main(argv) == 0  # a finished run again: everything recomputed from nothing left over


def test_cross_encoder_spec_in_the_pipeline(hotpot_file: Path, tiny_encoder_dir: Path, tiny_gen,
                                            tmp_path: Path) -> None:
    """``cross-encoder:NAME`` (a folder here; a hub id such as ``cross-encoder/ms-marco-MiniLM-L6-v2`` for
    users) reranks the N candidates and its top K reach the prompt."""
    from ragkit.debias.student import DistilledReranker

    folder = tmp_path / "ce"
    DistilledReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=64, seed=0).model.save(str(folder))
    name = f"cross-encoder:{folder}"
    rep = run_eval(_cfg(hotpot_file, limit=2, methods=("none", name)), out=tmp_path / "ce.json",
                   generator=tiny_gen, show_progress=False)
    from ragkit.debias import get_reranker

    ce = get_reranker(name, device="cpu")
    for r in (r for r in rep["outputs"] if r["method"] == name):
        cands = {p.id: p for rec in load_hotpotqa(hotpot_file) for p in rec.passages}
        want = ce.rank(r["question"], [cands[i] for i in r["candidates"]]).ids()
        assert r["ranking"] == want and r["prompt"] == want[:3]
        assert r["cost"]["generator_calls"] == 1  # the encoder is not the generator: one answer


def test_headline_is_holm_corrected_across_its_rows() -> None:
    from ragkit.eval.runner import headline
    from ragkit.eval.stats import holm

    rows = []
    for i in range(30):
        gain = 1.0 if i % 3 else 0.0  # "b" puts a gold passage in the prompt for 20 of 30 questions
        for m, rec, f1 in (("a", 0.0, 0.5), ("b", gain, 0.5), ("c", 0.0, 0.5 + (0.1 if i % 2 else -0.1))):
            rows.append({"method": m, "qid": f"q{i}",
                         "metrics": {"recall@3": rec, "ndcg@10": rec, "f1": f1, "em": 0.0}})
    h = headline(rows, "hotpotqa", ("a", "b", "c"), k=3, n_bootstrap=500, seed=0)
    assert h["baseline"] == "a" and h["family"] == 8  # 2 methods x (recall@3, ndcg@10, f1, em)
    by = {(r["method"], r["metric"]): r for r in h["rows"]}
    assert [r["p_holm"] for r in h["rows"]] == holm([r["p"] for r in h["rows"]])
    assert by[("b", "recall@3")]["holds"] and by[("b", "recall@3")]["holm_lo"] > 0
    assert by[("b", "recall@3")]["mean"] == pytest.approx(20 / 30)
    assert not by[("c", "f1")]["holds"] and by[("c", "f1")]["holm_lo"] < 0 < by[("c", "f1")]["holm_hi"]
    # the Holm interval is at least as wide as the plain 95% one
    assert all(r["holm_lo"] <= r["lo"] + 1e-12 and r["holm_hi"] >= r["hi"] - 1e-12 for r in h["rows"])
