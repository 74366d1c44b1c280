"""Answer and IR metrics against hand-computed values (and ir-measures for parity)."""

from __future__ import annotations

import math

import pytest

from ragkit.eval.metrics import (
    best_subspan_em,
    bleu,
    exact_match,
    exact_match_max,
    f1_max,
    f1_precision_recall,
    f1_score,
    ir_metrics,
    ir_metrics_per_query,
    normalize_answer,
    rouge_l,
)
from ragkit.types import Passage, RankedList


def test_normalize_answer_squad_rules() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    # articles only as whole words; "theory" keeps its "the"
    assert normalize_answer("the theory") == "theory"
    assert normalize_answer("  ") == ""


def test_exact_match_and_f1_hand_computed() -> None:
    assert exact_match("The Beatles", "beatles") == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0
    # pred tokens: cat sat (2), gold: cat (1): P = 1/2, R = 1, F1 = 2/3
    f1, p, r = f1_precision_recall("the cat sat", "a cat")
    assert (f1, p, r) == pytest.approx((2 / 3, 0.5, 1.0))
    # repeated tokens count as a multiset: pred "a a b" -> [b]? no: articles removed -> "b"
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)  # common = {x:1, y:1}; P = R = 2/3
    assert f1_score("", "anything") == 0.0


def test_f1_yes_no_special_case() -> None:
    # HotpotQA's script: yes/no/noanswer only match themselves
    assert f1_score("yes", "yes sir") == 0.0
    assert f1_score("no way", "no") == 0.0
    assert f1_score("Yes.", "yes") == 1.0


def test_max_over_references() -> None:
    assert exact_match_max("Paris", ["London", "paris"]) == 1.0
    assert f1_max("new york city", ["york", "new york"]) == pytest.approx(0.8)  # P=2/3, R=1
    assert f1_max("x", []) == 0.0


def test_best_subspan_em() -> None:
    assert best_subspan_em("It was Wilhelm Conrad Röntgen, in 1901.", ["Wilhelm Conrad Röntgen"]) == 1.0
    assert best_subspan_em("Röntgen", ["Wilhelm Conrad Röntgen"]) == 0.0
    assert best_subspan_em("the answer is 42", ["forty-two", "42"]) == 1.0
    assert best_subspan_em("anything", [""]) == 0.0


def test_rouge_l_hand_computed() -> None:
    # LCS("cat on the mat", "the cat sat on the mat") = cat on the mat (4): P=4/4, R=4/6 -> F=0.8
    assert rouge_l("the cat sat on the mat", "cat on the mat") == pytest.approx(0.8)
    assert rouge_l("x", ["y", "x"]) == pytest.approx(1.0)
    assert rouge_l("x", []) == 0.0


def test_bleu_hand_computed() -> None:
    assert bleu("the cat sat", ["the cat sat"], n=2) == pytest.approx(1.0)
    # BLEU-1, hyp 2 tokens all matching, ref 4 tokens: BP = exp(1 - 4/2) = e^-1
    assert bleu("the cat", ["the cat sat on"], n=1) == pytest.approx(math.exp(-1))
    # case-insensitive by our setting
    assert bleu("The Cat", ["the cat"], n=1) == pytest.approx(1.0)
    assert bleu("", ["x"], n=1) == 0.0
    with pytest.raises(ValueError, match="order"):
        bleu("a", ["a"], n=5)


def _ranked(ids: list[str]) -> RankedList:
    ps = [Passage(id=i, text="t") for i in ids]
    return RankedList.from_scores(ps, [float(len(ids) - j) for j in range(len(ids))])


def test_ir_metrics_hand_computed() -> None:
    run = {"q1": _ranked(["a", "b", "c", "d"]), "q2": _ranked(["a", "b", "c", "d"])}
    qrels = {"q1": ["c"], "q2": ["a", "d"], "q3": []}
    m = ir_metrics(qrels, run, ("mrr@10", "recall@2", "recall@10"))
    # q1: RR 1/3, recall@2 0; q2: RR 1, recall@2 1/2; q3 unjudged (dropped)
    assert m["mrr@10"] == pytest.approx((1 / 3 + 1) / 2)
    assert m["recall@2"] == pytest.approx(0.25)
    assert m["recall@10"] == pytest.approx(1.0)
    per = ir_metrics_per_query({"q1": ["c"], "q2": ["z"]}, {"q1": run["q1"]}, ("mrr@10",))
    assert per["mrr@10"] == pytest.approx({"q1": 1 / 3, "q2": 0.0})
    with pytest.raises(ValueError):
        ir_metrics(qrels, run, ())


def test_ir_metrics_parity_with_ir_measures() -> None:
    import ir_measures
    from ir_measures import RR, R, nDCG

    rankings = {
        "q1": ["d3", "d1", "d7", "d2", "d9", "d4"],
        "q2": ["d5", "d6", "d8"],
        "q3": ["d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9", "d10", "d11", "d12"],
    }
    rel = {"q1": ["d1", "d9"], "q2": ["d8"], "q3": ["d12", "d2"]}
    run = {q: _ranked(ids) for q, ids in rankings.items()}
    ours = ir_metrics(rel, run, ("mrr@10", "ndcg@10", "recall@2", "recall@10"))
    qrels_im = [ir_measures.Qrel(q, d, 1) for q, ds in rel.items() for d in ds]
    run_im = [ir_measures.ScoredDoc(q, d, s) for q, rl in run.items() for d, s in rl.to_run_dict().items()]
    theirs = ir_measures.calc_aggregate([RR @ 10, nDCG @ 10, R @ 2, R @ 10], qrels_im, run_im)
    assert ours["mrr@10"] == pytest.approx(theirs[RR @ 10])
    assert ours["ndcg@10"] == pytest.approx(theirs[nDCG @ 10])
    assert ours["recall@2"] == pytest.approx(theirs[R @ 2])
    assert ours["recall@10"] == pytest.approx(theirs[R @ 10])


def test_builtin_ir_metrics_equal_ranx() -> None:
    """The built-in metrics (no ranx needed) give ranx's numbers, graded relevance and cut-offs included."""
    import random

    ranx = pytest.importorskip("ranx")
    from ragkit.eval.metrics import BUILTIN_IR_METRICS, _builtin_value, _ranx_inputs

    rng = random.Random(0)
    qrels, run = {}, {}
    for qi in range(40):
        docs = [f"d{j}" for j in range(rng.randint(1, 25))]
        qrels[f"q{qi}"] = {d: rng.choice([1, 2, 3]) for d in rng.sample(docs, rng.randint(1, min(4, len(docs))))}
        ranked = rng.sample(docs, rng.randint(0, len(docs)))
        run[f"q{qi}"] = {d: float(len(ranked) - i) + rng.random() * 0.1 for i, d in enumerate(ranked)}
    names = [f"{m}@{k}" for m in BUILTIN_IR_METRICS for k in (1, 3, 10)] + list(BUILTIN_IR_METRICS)
    q, r = _ranx_inputs(qrels, run)
    ranx_run = ranx.Run(r)
    ranx.evaluate(ranx.Qrels(q), ranx_run, names, make_comparable=True, save_results_in_run=True)
    for name in names:
        for qid in q:
            assert _builtin_value(name, q[qid], r[qid]) == pytest.approx(ranx_run.scores[name][qid]), (name, qid)


def test_ir_metrics_need_no_ranx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ranx the built-in metrics work and any other metric names the [eval] extra."""
    import sys

    from ragkit.types import MissingExtraError

    monkeypatch.setitem(sys.modules, "ranx", None)
    run = {"q1": _ranked(["a", "b", "c"])}
    assert ir_metrics({"q1": ["b"]}, run, ("mrr@10", "ndcg@3"))["mrr@10"] == pytest.approx(0.5)
    with pytest.raises(MissingExtraError, match=r'ragkit\[eval\]'):
        ir_metrics({"q1": ["b"]}, run, ("bpref",))
