"""Position sweep and consistency metrics (tiny LM; hand-computed consistency values)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.datasets import load_nq_open, sample_records
from ragkit.eval.consistency import (
    evaluate_consistency,
    generator_consistency,
    jaccard,
    output_similarity,
    pairwise_mean,
    paraphrase_sets,
    retriever_consistency,
)
from ragkit.eval.sweep import default_slots, draw_distractors, position_sweep
from ragkit.types import Passage, QARecord, RankedList


@pytest.fixture(scope="module")
def tiny_gen(tiny_lm_dir: Path):
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=12, show_progress=False)


def test_default_slots() -> None:
    assert default_slots(10) == [0, 2, 5, 7, 9]
    assert default_slots(20) == [0, 5, 10, 15, 19]
    with pytest.raises(ValueError):
        default_slots(0)


def test_distractors_exclude_answer_aliases() -> None:
    def rec(i: int, text: str, ans: str) -> QARecord:
        p = Passage(id=f"p{i}", text=text)
        return QARecord(id=f"q{i}", question=f"q{i}?", answers=(ans,), passages=(p,), gold_ids=(p.id,))

    recs = [rec(0, "Paris is the capital", "Paris"), rec(1, "Berlin and Paris", "Berlin"),
            rec(2, "Rome is old", "Rome"), rec(3, "Madrid sun", "Madrid")]
    got = draw_distractors(recs[0], recs, 2, np.random.default_rng(0))
    assert {p.id for p in got} == {"p2", "p3"}  # p1 mentions Paris
    with pytest.raises(ValueError, match="distractors"):
        draw_distractors(recs[0], recs, 3, np.random.default_rng(0))


def test_position_sweep_tiny(tmp_path: Path, tiny_gen, shared_data: Path) -> None:
    pool = load_nq_open(shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", limit=40)
    res = position_sweep(tiny_gen, pool[:3], k=(4, 8), pool=pool, seed=1, max_new_tokens=3)
    d = res.to_dict()
    assert res.slots == {4: [0, 1, 2, 3], 8: [0, 2, 4, 6, 7]}
    assert len(res.rows) == 2 + 4 + 5
    assert all(r["n"] == 3 and np.isfinite(r["logprob"]) and r["logprob"] < 0 for r in res.rows)
    assert set(d["summary"]) == {"4", "8"}
    s = d["summary"]["8"]["logprob"]
    assert s["gap"] == pytest.approx(s["best"] - s["worst"]) and s["gap"] >= 0
    # each (question, slot) context holds k passages with the gold one at the slot
    assert len(d["per_question"]) == 3 * 11
    for rec in pool[:3]:
        rows = [r for r in d["per_question"] if r["qid"] == rec.id]
        gold = rec.gold_ids[0]
        assert all(r["gold_id"] == gold for r in rows)
        assert [r["passage_ids"] for r in rows if r["setting"] == "closed_book"] == [[]]
        assert [r["passage_ids"] for r in rows if r["setting"] == "oracle"] == [[gold]]
        distract = None
        for r in (r for r in rows if r["setting"] == "slot"):
            ids = r["passage_ids"]
            assert len(ids) == r["k"] and ids[r["slot"]] == gold and ids.count(gold) == 1
            rest = ids[: r["slot"]] + ids[r["slot"] + 1:]
            if r["k"] == 8:
                distract = distract or rest
                assert rest == distract  # the same 7 distractors in the same order at every slot
        for r in (r for r in rows if r["setting"] == "slot" and r["k"] == 4):
            assert r["passage_ids"][: r["slot"]] + r["passage_ids"][r["slot"] + 1:] == distract[:3]
    png = res.plot(tmp_path / "sweep.png")
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(d)  # JSON-ready
    # seeded: the same draw gives the same contexts and scores; EM-free mode only scores
    again = position_sweep(tiny_gen, pool[:3], k=(4, 8), pool=pool, seed=1, generate=False)
    assert again.row("slot", 8, 4)["logprob"] == pytest.approx(res.row("slot", 8, 4)["logprob"], abs=1e-4)
    assert np.isnan(again.row("oracle")["subspan_em"])


def test_position_sweep_equals_answering_and_scoring_each_context(tiny_gen, shared_data: Path) -> None:
    """Run as orderings with a shared prefix, each context still gets the answer of ``answer`` and
    the gold answer's log-prob of ``score``, the permutations included."""
    pool = load_nq_open(shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", limit=40)
    res = position_sweep(tiny_gen, pool[:3], k=(4, 8), pool=pool, seed=1, max_new_tokens=3, permutations=3)
    rows = res.per_question
    assert {r["setting"] for r in rows} == {"closed_book", "oracle", "slot", "permutation"}
    by_id = {p.id: p for r in pool for p in r.passages}
    recs = {r.id: r for r in pool}
    qs = [recs[r["qid"]].question for r in rows]
    ctxs = [[by_id[i] for i in r["passage_ids"]] for r in rows]
    assert [r["prediction"] for r in rows] == tiny_gen.answer(qs, ctxs, max_new_tokens=3)
    scored = [j for j, r in enumerate(rows) if r["setting"] != "permutation"]
    ref = tiny_gen.score([tiny_gen.build_prompt(qs[j], ctxs[j]) for j in scored],
                         [recs[rows[j]["qid"]].answers[0] for j in scored])
    np.testing.assert_allclose([rows[j]["logprob"] for j in scored], ref.mean, atol=1e-4)
    assert all(np.isnan(r["logprob"]) for r in rows if r["setting"] == "permutation")
    only_scored = position_sweep(tiny_gen, pool[:3], k=(4, 8), pool=pool, seed=1, generate=False)
    np.testing.assert_allclose([r["logprob"] for r in only_scored.per_question],
                               [rows[j]["logprob"] for j in scored], atol=1e-4)


class _Counting:
    """The tiny generator, counting the contexts it is asked to answer."""

    def __init__(self, gen) -> None:
        self._gen, self.answered = gen, 0

    def __getattr__(self, name: str):
        return getattr(self._gen, name)

    def run_orderings(self, questions, passages, orderings, *args, **kw):
        self.answered += sum(len(o) for o in orderings)
        return self._gen.run_orderings(questions, passages, orderings, *args, **kw)

    def answer(self, questions, passages, *args, **kw):
        self.answered += len(questions)
        return self._gen.answer(questions, passages, *args, **kw)


def test_position_sweep_resumes_from_its_partial_file(tmp_path: Path, tiny_gen, shared_data: Path) -> None:
    pool = load_nq_open(shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", limit=40)
    partial = tmp_path / "sweep.json.partial.jsonl"
    kw = dict(k=4, pool=pool, seed=1, max_new_tokens=3, partial=partial, chunk_questions=1)
    full = position_sweep(tiny_gen, pool[:3], **kw)
    lines = partial.read_text().splitlines()
    assert json.loads(lines[0])["_sweep"]["questions"] == [r.id for r in pool[:3]]
    assert len(lines) == 1 + 3 * 6  # fingerprint, then closed-book, oracle and 4 slots per question
    # cut off after the first question, mid-write of the second (a torn line)
    partial.write_text("\n".join(lines[:7]) + "\n" + lines[7][:20])
    gen = _Counting(tiny_gen)
    again = position_sweep(gen, pool[:3], **kw)
    assert gen.answered == 2 * 6  # only the two unfinished questions ran
    assert [r["prediction"] for r in again.per_question] == [r["prediction"] for r in full.per_question]
    assert [r["logprob"] for r in again.per_question] == pytest.approx([r["logprob"] for r in full.per_question],
                                                                       abs=1e-4)
    # each row carries its share of its chunk's ledger; a question's rows sum to the chunk's work
    for res in (full, again):
        assert all(r["cost"]["seconds"] > 0 and r["cost"]["tokens_prefilled"] > 0 and r["cost"]["forwards"] >= 1
                   for r in res.per_question)
        assert res.cost["contexts"] == 18
        shares = [r["cost"]["tokens_prefilled"] for r in res.per_question]
        assert res.cost["tokens_prefilled"] == pytest.approx(sum(shares), abs=0.1)
    # a resumed row keeps the ledger it was written with, and the rows run again are metered anew
    assert [r["cost"] for r in again.per_question[:6]] == [r["cost"] for r in full.per_question[:6]]
    assert all(r["cost"]["tokens_prefilled"] == pytest.approx(f["cost"]["tokens_prefilled"], abs=0.1)
               for r, f in zip(again.per_question[6:], full.per_question[6:]))
    done = _Counting(tiny_gen)
    position_sweep(done, pool[:3], **kw)
    assert done.answered == 0  # everything is in the file now
    # rows written before rows carried a ledger resume with none, and the total counts only the metered ones
    lines = partial.read_text().splitlines()
    old = [json.loads(line) for line in lines[1:7]]
    for row in old:
        del row["cost"]
    partial.write_text("\n".join([lines[0], *map(json.dumps, old), *lines[7:]]) + "\n")
    mixed = position_sweep(_Counting(tiny_gen), pool[:3], **kw)
    assert [r["cost"] for r in mixed.per_question[:6]] == [None] * 6
    assert mixed.cost["contexts"] == 12
    assert mixed.cost["seconds"] == pytest.approx(sum(r["cost"]["seconds"] for r in mixed.per_question[6:]), abs=1e-3)
    with pytest.raises(ValueError, match="other settings"):
        position_sweep(tiny_gen, pool[:3], **{**kw, "seed": 2})
    fresh = _Counting(tiny_gen)
    position_sweep(fresh, pool[:3], **{**kw, "seed": 2, "resume": False})
    assert fresh.answered == 3 * 6


def test_consistency_hand_computed() -> None:
    assert jaccard(["a", "b"], ["b", "c"]) == pytest.approx(1 / 3)
    assert pairwise_mean([1, 2, 3], lambda a, b: float(a + b)) == pytest.approx((3 + 4 + 5) / 3)
    rl = lambda ids: RankedList.from_scores([Passage(id=i, text="t") for i in ids], [3.0, 2.0, 1.0][: len(ids)])  # noqa: E731
    # set 1: {a,b},{a,b},{a,c} -> (1 + 1/3 + 1/3)/3 = 5/9 ; set 2: identical -> 1
    v = retriever_consistency([[rl(["a", "b", "x"]), rl(["b", "a", "y"]), rl(["a", "c", "z"])],
                               [["q", "r"], ["r", "q"]]], k=2)
    assert v == pytest.approx((5 / 9 + 1.0) / 2)
    assert generator_consistency([["Paris", "paris.", "The Paris"]]) == pytest.approx(1.0)
    assert generator_consistency([["Paris", "Rome"]]) == 0.0
    assert generator_consistency([["Paris city", "Paris"]], similarity="f1") == pytest.approx(2 / 3)
    assert output_similarity("a b c", "a b c") == pytest.approx(1.0)


def test_paraphrase_sets_and_evaluate(tiny_gen) -> None:
    recs = sample_records(2)
    sets = paraphrase_sets(recs, n=2, source="rule")
    assert [s[0] for s in sets] == [r.question for r in recs] and all(len(s) == 3 for s in sets)
    data = [QARecord(r.id, r.question, r.answers, r.passages, r.gold_ids, {"paraphrases": ["x?", "y?"]}) for r in recs]
    assert paraphrase_sets(data, n=2)[0] == [recs[0].question, "x?", "y?"]
    from ragkit.datasets import pooled_corpus
    from ragkit.retrievers import BM25Retriever

    retr = BM25Retriever().index(pooled_corpus(recs))
    rep = evaluate_consistency(tiny_gen, recs, sets, retriever=retr, k=3, max_new_tokens=3)
    assert rep.n_sets == 2 and 0.0 <= rep.retriever <= 1.0 and 0.0 <= rep.generator <= 1.0
    assert 0.0 <= rep.end_to_end <= 1.0 and len(rep.per_set[0]["outputs_e2e"]) == 3
    no_retr = evaluate_consistency(tiny_gen, recs, sets, k=3, max_new_tokens=3)
    assert no_retr.retriever is None and no_retr.end_to_end is None


def test_evaluate_consistency_resumes_from_its_partial_file(tmp_path: Path, tiny_gen) -> None:
    from ragkit.datasets import pooled_corpus
    from ragkit.retrievers import BM25Retriever

    recs = sample_records(3)
    sets = paraphrase_sets(recs, n=2, source="rule")
    retr = BM25Retriever().index(pooled_corpus(recs))
    partial = tmp_path / "consistency.partial.jsonl"
    kw = dict(retriever=retr, k=3, max_new_tokens=3, partial=partial, chunk_sets=1, show_progress=False)
    full = evaluate_consistency(tiny_gen, recs, sets, **kw)
    lines = partial.read_text().splitlines()
    assert len(lines) == 1 + 3 and json.loads(lines[0])["_consistency"]["sets"][0] == [recs[0].id, *sets[0]]
    # cut off after the first set, mid-write of the second (a torn line)
    partial.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:25])
    gen = _Counting(tiny_gen)
    again = evaluate_consistency(gen, recs, sets, **kw)
    assert gen.answered == 2 * 2 * 3  # two unfinished sets x (fixed + end to end) x 3 wordings
    assert again.to_dict() == full.to_dict()
    done = _Counting(tiny_gen)
    assert evaluate_consistency(done, recs, sets, **kw).to_dict() == full.to_dict() and done.answered == 0
    with pytest.raises(ValueError, match="other settings"):
        evaluate_consistency(tiny_gen, recs, sets, **{**kw, "k": 2})
    # without a partial file the chunks give what one pass gave
    assert evaluate_consistency(tiny_gen, recs, sets, retriever=retr, k=3, max_new_tokens=3).to_dict() == full.to_dict()


def test_sweep_plot_names_a_local_model_file_by_its_name(tmp_path):
    """A GGUF or folder path in the title would print the user's home directory on the figure."""
    import matplotlib

    from ragkit.eval.sweep import SweepResult

    rows = [{"setting": "closed_book", "k": None, "slot": None, "subspan_em": 0.0, "logprob": -5.0},
            {"setting": "oracle", "k": None, "slot": None, "subspan_em": 0.5, "logprob": -2.0}]
    rows += [{"setting": "slot", "k": 4, "slot": s, "subspan_em": 0.1 * s, "logprob": -3.0 - s} for s in (0, 3)]
    res = SweepResult(model="/home/someone/models/qwen.gguf", n_questions=2, k_values=[4], slots={4: [0, 3]},
                      rows=rows)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text in the SVG
        svg = Path(res.plot(tmp_path / "sweep.svg")).read_text(encoding="utf-8")
    assert "qwen.gguf" in svg and "/home/someone" not in svg
    res.model = "Qwen/Qwen2.5-7B-Instruct"  # a hub id keeps its organisation
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        svg = Path(res.plot(tmp_path / "hub.svg")).read_text(encoding="utf-8")
    assert "Qwen/Qwen2.5-7B-Instruct" in svg


def test_spread_and_permutation_sensitivity_by_hand() -> None:
    from ragkit.eval.sweep import _answer_changed, _question_spreads

    # question 0: slots 1, 3, 2 -> spread 2; question 1: slots 5, 5, 4 -> spread 1; a k=4 row is ignored
    settings = [(0, "slot", 3, s, None, []) for s in range(3)] + [(1, "slot", 3, s, None, []) for s in range(3)]
    settings += [(0, "slot", 4, 0, None, []), (0, "oracle", None, None, None, [])]
    vals = np.array([1.0, 3.0, 2.0, 5.0, 5.0, 4.0, 100.0, -100.0])
    assert _question_spreads(settings, vals, 3) == pytest.approx({0: 2.0, 1: 1.0})
    assert _question_spreads(settings, vals, 4) == {}  # one slot: no spread
    # question 0 answers "Paris" / "paris." (same after normalisation); question 1 changes its answer
    perm = [(0, "permutation", 3, None, 0, []), (0, "permutation", 3, None, 1, []),
            (1, "permutation", 3, None, 0, []), (1, "permutation", 3, None, 1, [])]
    assert _answer_changed(perm, ["Paris", "paris.", "Rome", "Milan"], 3) == {0: 0.0, 1: 1.0}


def test_position_sweep_permutations(tiny_gen, shared_data: Path, tmp_path: Path) -> None:
    pool = load_nq_open(shared_data / "nq_open" / "nq-open-oracle.jsonl.gz", limit=40)
    part = tmp_path / "sweep.partial.jsonl"
    res = position_sweep(tiny_gen, pool[:3], k=4, pool=pool, seed=2, max_new_tokens=3, permutations=3, partial=part)
    perms = [r for r in res.per_question if r["setting"] == "permutation"]
    assert len(perms) == 3 * 3 and sorted({r["order"] for r in perms}) == [0, 1, 2]
    for q in {r["qid"] for r in perms}:
        orders = [r["passage_ids"] for r in perms if r["qid"] == q]
        slot_ids = next(r["passage_ids"] for r in res.per_question if r["qid"] == q and r["setting"] == "slot")
        assert all(sorted(o) == sorted(slot_ids) for o in orders)  # the same passages, reordered
    from ragkit.text import normalize_answer

    changed = [len({normalize_answer(r["prediction"]) for r in perms if r["qid"] == q}) > 1
               for q in sorted({r["qid"] for r in perms})]
    s = res.summary["4"]
    assert s["psr"] == pytest.approx(np.mean(changed))
    by_q: dict[str, list[float]] = {}
    for r in res.per_question:
        if r["setting"] == "slot":
            by_q.setdefault(r["qid"], []).append(r["logprob"])
    assert s["logprob"]["spread"] == pytest.approx(np.mean([max(v) - min(v) for v in by_q.values()]))
    assert s["logprob"]["spread"] >= s["logprob"]["gap"] - 1e-9  # a mean of spreads bounds the spread of means
    # the per-question values the summary averages come back with the result
    pqm = res.per_question_metrics[4]
    assert sorted(pqm) == sorted(by_q)
    for q, v in by_q.items():
        assert pqm[q]["logprob_spread"] == pytest.approx(max(v) - min(v))
        assert pqm[q]["logprob"] == pytest.approx(np.mean(v))
    assert [pqm[q]["psr"] for q in sorted(pqm)] == [float(c) for c in changed]
    assert np.mean([q["subspan_em_spread"] for q in pqm.values()]) == pytest.approx(s["subspan_em"]["spread"])
    assert res.to_dict()["per_question_metrics"]["4"] == pqm
    # resuming reads every row back (permutation rows keyed by their order)
    again = position_sweep(tiny_gen, pool[:3], k=4, pool=pool, seed=2, max_new_tokens=3, permutations=3, partial=part)
    assert [r["prediction"] for r in again.per_question] == [r["prediction"] for r in res.per_question]
    with pytest.raises(ValueError, match="generate"):
        position_sweep(tiny_gen, pool[:3], k=4, pool=pool, permutations=3, generate=False)
