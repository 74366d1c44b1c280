"""Residual cross-encoder student and the held-out check against the first stage (tiny random encoder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.training.labels import LabelRecord, write_labels
from ragkit.types import Passage

_WORDS = ("river mountain castle history music science garden winter station harbor library village "
          "bridge market forest island engine theatre painter author season league museum railway").split()
_KEY = "zebra"


def _labels(n: int, k: int, seed: int, *, gold_first: bool = False, noise_u: bool = False) -> list[LabelRecord]:
    """Keyword questions: the keyword passage has the top utility. ``gold_first``: it is always first
    (a perfect first stage) and marked gold; ``noise_u``: the utilities are noise instead."""
    rng = np.random.default_rng(seed)
    out = []
    for qi in range(n):
        texts = [" ".join(rng.choice(_WORDS, size=6)) for _ in range(k)]
        pos = 0 if gold_first else int(rng.integers(k))
        words = texts[pos].split()
        words[int(rng.integers(len(words)))] = _KEY
        texts[pos] = " ".join(words)
        u = rng.normal(size=k) if noise_u else np.eye(k)[pos]
        out.append(LabelRecord(qid=f"q{seed}-{qi}", question="which " + " ".join(rng.choice(_WORDS, size=3)) + "?",
                               passage_ids=[f"p{j}" for j in range(k)], texts=texts, u=u.tolist(), answers=["x"],
                               gold_ids=[f"p{pos}"] if gold_first else [], source="synthetic"))
    return out


def _passages(seed: int, n: int = 6) -> list[list[Passage]]:
    rng = np.random.default_rng(seed)
    return [[Passage(id=f"d{j}", text=" ".join(rng.choice(_WORDS, size=5))) for j in range(n)] for _ in range(3)]


def test_untrained_residual_ranks_exactly_like_its_retriever(tiny_encoder_dir: Path) -> None:
    from ragkit.debias.student import ResidualReranker, normalised_prior

    student = ResidualReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=32, seed=3)
    ps = _passages(0)
    qs = ["which river?", "a castle?", "music of the season?"]
    ranked = student.rank_many(qs, ps)
    for r, p in zip(ranked, ps):
        assert r.ids() == [x.id for x in p]  # the given (retriever) order
        np.testing.assert_allclose(r.scores(), normalised_prior(len(p)), atol=1e-6)  # f == 0 exactly
    # the correction alone is zero for every pair (fails if the head is not zero-initialised)
    for f in student.score_pairs(qs, ps):
        np.testing.assert_allclose(f, 0.0, atol=1e-7)
    # prior="score": the order of the retriever scores, whatever their scale
    by_score = ResidualReranker.from_base(str(tiny_encoder_dir), device="cpu", max_length=32, prior="score")
    scores = [[3.0, 9.5, -1.0, 7.0, 0.5, 2.0]] * 3
    for r, p in zip(by_score.rank_many(qs, ps, scores), ps):
        assert r.ids() == [p[i].id for i in np.argsort(-np.asarray(scores[0]), kind="stable")]


def test_normalised_prior_is_a_z_score() -> None:
    from ragkit.debias.student import normalised_prior

    z = normalised_prior(4)
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12 and list(np.argsort(-z)) == [0, 1, 2, 3]
    assert normalised_prior(3, [2.0, 2.0, 2.0]).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="3 passages but 2"):
        normalised_prior(3, [1.0, 2.0])


@pytest.fixture(scope="module")
def residual(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from ragkit.training.students import distill

    out = tmp_path_factory.mktemp("residual") / "student"
    res = distill(_labels(60, 4, seed=0), out, "residual", holdout=0.2, base_model=str(tiny_encoder_dir),
                  loss="listnet", epochs=6, batch_size=8, lr=5e-3, max_length=32, device="cpu", show_progress=False)
    return res, out


def test_residual_learns_and_passes_the_check(residual) -> None:
    res, _ = residual
    assert res.final_loss < res.initial_loss
    c = res.reranker.metadata["comparison"]
    assert c["passed"] and c["num_queries"] == 12 and c["relevance"] == "labels"
    assert c["student"]["mrr@10"] > c["first_stage"]["mrr@10"] + 0.2
    new = _labels(20, 5, seed=123)
    ranked = res.reranker.rank_many([lab.question for lab in new], [lab.passages() for lab in new])
    assert sum(_KEY in r[0].passage.text for r in ranked) >= 16


def test_residual_saves_and_loads_everywhere(residual) -> None:
    from sentence_transformers import CrossEncoder

    from ragkit.debias import get_reranker
    from ragkit.debias.student import DistilledReranker, ResidualReranker

    res, out = residual
    loaded = DistilledReranker.load(out, device="cpu")
    assert isinstance(loaded, ResidualReranker) and loaded.metadata["prior"] == "rank"
    assert isinstance(get_reranker(f"student:{out}", device="cpu"), ResidualReranker)
    labs = _labels(4, 5, seed=9)
    qs, ps = [lab.question for lab in labs], [lab.passages() for lab in labs]
    for a, b in zip(res.reranker.rank_many(qs, ps), loaded.rank_many(qs, ps)):
        assert a.ids() == b.ids()
        np.testing.assert_allclose(a.scores(), b.scores(), atol=1e-5)
    assert len(CrossEncoder(str(out), device="cpu").predict([("q?", "a zebra")])) == 1  # the correction alone
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "Compared with the first stage" in card and "residual" in card and "verdict: passed" in card


def test_refused_below_first_stage_then_forced(tiny_encoder_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.cli import main
    from ragkit.debias.student import DistilledReranker

    labels = tmp_path / "labels.jsonl"  # a perfect first stage (gold first) and noise utilities to learn
    write_labels(labels, _labels(20, 5, seed=4, gold_first=True, noise_u=True))
    out = tmp_path / "student"
    argv = ["distill", "--labels", str(labels), "--out", str(out), "--student", "cross-encoder", "--base-model",
            str(tiny_encoder_dir), "--epochs", "1", "--lr", "1e-3", "--max-length", "32", "--device", "cpu",
            "--holdout", "0.3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "below its first stage" in err and "mrr@10: student" in err and "vs first stage 1.0000" in err
    assert "--force" in err and not out.exists()
    assert main([*argv, "--force", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    c = report["metadata"]["comparison"]
    assert c["forced"] and not c["passed"] and c["relevance"] == "gold" and c["first_stage"]["mrr@10"] == 1.0
    student = DistilledReranker.load(out, device="cpu")
    assert student.metadata["comparison"]["forced"]
    assert "refused, saved with --force" in (out / "README.md").read_text(encoding="utf-8")


def test_residual_beats_refusal_where_fresh_head_fails(tiny_encoder_dir: Path) -> None:
    """The same perfect first stage: the untrained-then-lightly-trained residual student stays at it."""
    from ragkit.training.students import distill

    res = distill(_labels(20, 5, seed=4, gold_first=True, noise_u=True), None, "residual", holdout=0.3,
                  base_model=str(tiny_encoder_dir), epochs=1, lr=1e-5, max_length=32, device="cpu",
                  show_progress=False)
    c = res.reranker.metadata["comparison"]
    assert c["passed"] and c["student"]["mrr@10"] == c["first_stage"]["mrr@10"] == 1.0


def test_split_and_arguments() -> None:
    from ragkit.training.students import distill, split_labels

    labs = _labels(10, 3, seed=1)
    tr, ho = split_labels(labs, 0.2, seed=0)
    assert len(tr) == 8 and len(ho) == 2 and not {x.qid for x in tr} & {x.qid for x in ho}
    assert split_labels(labs, 0.2, seed=0) == (tr, ho)
    assert split_labels(labs, 0.0) == (labs, [])
    with pytest.raises(ValueError, match="holdout"):
        split_labels(labs, 1.0)
    with pytest.raises(ValueError, match="unknown student"):
        distill(labs, None, "colbert")


def test_explicit_held_out_questions(tiny_encoder_dir: Path) -> None:
    """``held_out=``: the gate judges the questions a study fixed in advance; all the labels train."""
    from ragkit.training.students import distill

    train, held = _labels(16, 4, seed=1), _labels(5, 4, seed=2)
    kw = dict(base_model=str(tiny_encoder_dir), epochs=1, batch_size=8, lr=1e-4, max_length=32, device="cpu",
              show_progress=False)
    res = distill(train, None, "residual", holdout=0.0, held_out=held, **kw)
    c = res.reranker.metadata["comparison"]
    assert c["num_queries"] == 5 and c["held_out_qids"] == [lab.qid for lab in held] and res.num_queries == 16
    with pytest.raises(ValueError, match="not both"):
        distill(train, None, "residual", holdout=0.2, held_out=held, **kw)
    with pytest.raises(ValueError, match="also a training question"):
        distill(train, None, "residual", holdout=0.0, held_out=train[:2], **kw)
