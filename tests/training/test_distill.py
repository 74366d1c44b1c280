"""Distillation of MoI into a cross-encoder: label files, training, save/load (tiny random encoder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.training.labels import LabelRecord, read_labels, write_labels
from ragkit.types import Passage

_WORDS = (
    "river mountain castle history music science garden winter station harbor library village "
    "bridge market forest island engine theatre painter author season league museum railway"
).split()
_KEY = "zebra"


def _keyword_labels(n: int, k: int, seed: int) -> list[LabelRecord]:
    """Questions whose highest-utility passage is always the one that contains the keyword."""
    rng = np.random.default_rng(seed)
    out = []
    for qi in range(n):
        texts = [" ".join(rng.choice(_WORDS, size=6)) for _ in range(k)]
        pos = int(rng.integers(k))
        words = texts[pos].split()
        words[int(rng.integers(len(words)))] = _KEY
        texts[pos] = " ".join(words)
        u = np.zeros(k)
        u[pos] = 1.0
        out.append(
            LabelRecord(
                qid=f"q{seed}-{qi}",
                question="which " + " ".join(rng.choice(_WORDS, size=3)) + "?",
                passage_ids=[f"p{j}" for j in range(k)],
                texts=texts,
                u=u.tolist(),
                answers=["x"],
                source="synthetic",
            )
        )
    return out


# ----------------------------------------------------------------------------- label files
def test_label_file_round_trip(tmp_path: Path) -> None:
    labels = _keyword_labels(5, 4, seed=1)
    path = tmp_path / "labels.jsonl"
    write_labels(path, labels)
    back = read_labels(path)
    assert back == labels
    assert [b.to_dict() for b in back] == [lab.to_dict() for lab in labels]
    # ranking is derived from u (ties by given order) and the best passage has the keyword
    for lab in back:
        best = lab.ranking[0]
        assert _KEY in lab.texts[lab.passage_ids.index(best)]
        assert [p.id for p in lab.passages()] == list(lab.passage_ids)


def test_ranking_ties_keep_given_order() -> None:
    lab = LabelRecord(qid="a", question="q?", passage_ids=["x", "y", "z"], texts=["1", "2", "3"], u=[0.0, 1.0, 0.0])
    assert lab.ranking == ("y", "x", "z")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"qid": "a", "question": "q?", "texts": ["t", "u"], "u": [1, 2]}), "missing key"),
        (json.dumps({"qid": "a", "question": "q?", "passage_ids": ["1", "2"], "texts": ["t"], "u": [1, 2]}),
         "1 texts but 2 passage_ids"),
        (json.dumps({"qid": "a", "question": "q?", "passage_ids": ["1", "2"], "texts": ["t", "v"], "u": [1, "x"]}),
         "'u' must be a list of numbers"),
        (json.dumps({"qid": "a", "question": "q?", "passage_ids": ["1", "2"], "texts": ["t", "v"],
                     "u": [1, float("nan")]}), "non-finite"),
        (json.dumps({"qid": "a", "question": "q?", "passage_ids": ["1"], "texts": ["t"], "u": [1]}),
         "at least 2"),
        (json.dumps({"qid": "a", "question": "q?", "passage_ids": ["1", "1"], "texts": ["t", "v"], "u": [1, 2]}),
         "duplicate passage ids"),
        (json.dumps({"format": "other/9", "qid": "a"}), "unknown label format"),
        (json.dumps([1, 2]), "expected a JSON object"),
    ],
)
def test_bad_label_lines_raise_clear_errors(tmp_path: Path, line: str, needle: str) -> None:
    good = json.dumps(_keyword_labels(1, 3, seed=2)[0].to_dict())
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=needle) as err:
        read_labels(path)
    assert f"{path}:2" in str(err.value)


def test_duplicate_qids_and_empty_and_missing_files(tmp_path: Path) -> None:
    lab = _keyword_labels(1, 3, seed=3)[0]
    dup = tmp_path / "dup.jsonl"
    dup.write_text((json.dumps(lab.to_dict()) + "\n") * 2, encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate qid"):
        read_labels(dup)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no labels"):
        read_labels(empty)
    with pytest.raises(FileNotFoundError, match="ragkit distill labels"):
        read_labels(tmp_path / "nope.jsonl")


def test_resume_repairs_partial_last_line(tmp_path: Path) -> None:
    from ragkit.training.labels import _existing_qids

    labels = _keyword_labels(3, 3, seed=4)
    path = tmp_path / "labels.jsonl"
    write_labels(path, labels)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"qid": "half')  # a run killed mid-append
    assert _existing_qids(path) == {lab.qid for lab in labels}
    assert read_labels(path) == labels  # the partial line is gone


def test_label_targets() -> None:
    from ragkit.training.distill import label_targets

    t = np.asarray(label_targets([1.0, 2.0, 3.0]))
    assert abs(t.mean()) < 1e-9 and abs(t.std() - 1.0) < 1e-9 and t[2] > t[1] > t[0]
    assert label_targets([0.5, 0.5]) == [0.0, 0.0]
    assert np.allclose(label_targets([1.0, 2.0, 3.0], temperature=0.5), 2 * t)
    with pytest.raises(ValueError, match="temperature"):
        label_targets([1.0, 2.0], temperature=0.0)


# ----------------------------------------------------------------------------- student
@pytest.fixture(scope="module")
def trained(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from ragkit.training.distill import train_student

    labels = _keyword_labels(48, 4, seed=0)
    out = tmp_path_factory.mktemp("student") / "student"
    res = train_student(labels, out, base_model=str(tiny_encoder_dir), loss="ranknet", epochs=6,
                        batch_size=8, lr=5e-3, seed=0, max_length=32, device="cpu", show_progress=False)
    return res, labels, out


def test_pairwise_loss_falls(trained) -> None:
    res, _, _ = trained
    assert res.initial_loss is not None and res.final_loss is not None
    assert res.final_loss < 0.5 * res.initial_loss
    assert len(res.loss_history) >= 10
    assert np.mean(res.loss_history[-5:]) < np.mean(res.loss_history[:5])


def test_student_ranks_keyword_passage_first_on_new_text(trained) -> None:
    res, _, _ = trained
    new = _keyword_labels(20, 5, seed=123)  # unseen questions and passages
    ranked = res.reranker.rank_many([lab.question for lab in new], [lab.passages() for lab in new])
    hits = sum(_KEY in r[0].passage.text for r in ranked)
    assert hits >= 18, f"keyword passage first in only {hits}/20 new queries"


def test_rank_many_is_one_pass_per_passage(trained) -> None:
    res, _, _ = trained
    student = res.reranker
    before = student.forward_passes
    ps = [[Passage(id=str(i), text=t) for i, t in enumerate(["a b", "c zebra", "d"])],
          [Passage(id="x", text="zebra river"), Passage(id="y", text="castle")]]
    ranked = student.rank_many(["q one?", "q two?"], ps)
    assert student.forward_passes - before == 5
    assert [len(r) for r in ranked] == [3, 2]
    single = student.rank("q two?", ps[1])
    assert single.ids() == ranked[1].ids()
    assert np.allclose(single.scores(), ranked[1].scores(), atol=1e-5)


def test_save_load_round_trip_identical_scores(trained, tmp_path: Path) -> None:
    from ragkit.debias.student import META_FILE, DistilledReranker

    res, labels, out = trained
    loaded = DistilledReranker.load(out, device="cpu")
    assert (out / META_FILE).exists() and any(out.glob("*.safetensors"))
    assert loaded.metadata["loss"] == "ranknet" and loaded.metadata["num_queries"] == 48
    qs = [lab.question for lab in labels[:6]]
    ps = [lab.passages() for lab in labels[:6]]
    a = res.reranker.score_pairs(qs, ps)
    b = loaded.score_pairs(qs, ps)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    # save again (overwrite) and load: still identical
    again = tmp_path / "again"
    loaded.save(again)
    c = DistilledReranker.load(again, device="cpu").score_pairs(qs, ps)
    for x, y in zip(a, c):
        np.testing.assert_array_equal(x, y)


def test_load_errors(tmp_path: Path) -> None:
    from ragkit.debias.student import DistilledReranker

    with pytest.raises(FileNotFoundError, match="ragkit distill"):
        DistilledReranker.load(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a ragkit distilled reranker"):
        DistilledReranker.load(tmp_path / "plain")


def test_train_student_validates_arguments(tmp_path: Path) -> None:
    from ragkit.training.distill import train_student

    labels = _keyword_labels(2, 3, seed=5)
    with pytest.raises(ValueError, match="unknown loss"):
        train_student(labels, None, loss="hinge")
    with pytest.raises(ValueError, match="no labels"):
        train_student([], None)
    with pytest.raises(ValueError, match="epochs"):
        train_student(labels, None, epochs=0)


def test_listnet_training_runs(tiny_encoder_dir: Path) -> None:
    from ragkit.training.distill import train_student

    labels = _keyword_labels(8, 3, seed=6)
    res = train_student(labels, None, base_model=str(tiny_encoder_dir), loss="listnet", epochs=1,
                        batch_size=4, lr=1e-3, seed=0, max_length=32, device="cpu", show_progress=False)
    assert res.out_dir is None and len(res.loss_history) == 2
    assert res.reranker.metadata["loss"] == "listnet"
    assert np.isfinite(res.final_loss)


# ----------------------------------------------------------------------------- CLI
def test_cli_train_writes_a_loadable_student(tiny_encoder_dir: Path, tmp_path: Path, capsys) -> None:
    from ragkit.cli import main
    from ragkit.debias.student import DistilledReranker

    labels = tmp_path / "labels.jsonl"
    write_labels(labels, _keyword_labels(6, 3, seed=7))
    out = tmp_path / "student"
    rc = main(["distill", "--labels", str(labels), "--out", str(out), "--base-model",
               str(tiny_encoder_dir), "--loss", "ranknet", "--epochs", "1", "--lr", "1e-3", "--max-length", "32",
               "--device", "cpu", "--json", "--student", "cross-encoder", "--holdout", "0"])
    assert rc == 0
    captured = capsys.readouterr()
    assert "trained cross-encoder student (ranknet) on 6 questions" in captured.err  # --json: summary on stderr
    assert json.loads(captured.out)["num_queries"] == 6  # stdout holds only the JSON report
    student = DistilledReranker.load(out, device="cpu")
    assert len(student.rank("a question?", ["one", "two zebra"])) == 2


def test_cli_errors(tmp_path: Path, capsys) -> None:
    from ragkit.cli import main

    assert main(["distill"]) == 1
    assert "needs --labels" in capsys.readouterr().err
    assert main(["distill", "--labels", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")]) == 1
    assert "no such label file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- label generation
def _tiny_records() -> list:
    from ragkit.types import QARecord

    ps = [Passage(id=f"p{i}", title=f"T{i}", text=t) for i, t in
          enumerate(["Paris is the capital of France.", "The dog barks.", "Rome is in Italy."])]
    return [
        QARecord(id="a", question="What is the capital of France?", answers=("Paris",), passages=tuple(ps)),
        QARecord(id="b", question="Where is Rome?", answers=("Italy",), passages=tuple(ps[::-1]),
                 gold_ids=("p2",)),
        QARecord(id="c", question="No answer here?", answers=(), passages=tuple(ps)),  # unusable
    ]


def test_generate_labels_is_resumable(tiny_lm_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("ragkit.debias.moi")
    from ragkit.generation import Generator
    from ragkit.training.labels import generate_labels

    gen = Generator(model=str(tiny_lm_dir), device="cpu", show_progress=False)
    out = tmp_path / "labels.jsonl"
    recs = _tiny_records()
    s1 = generate_labels(gen, recs[:1], out, batch_queries=2, show_progress=False)
    assert (s1.written, s1.skipped_existing) == (1, 0)
    s2 = generate_labels(gen, recs, out, batch_queries=2, show_progress=False)
    assert (s2.written, s2.skipped_existing, s2.skipped_unusable) == (1, 1, 1)
    labs = read_labels(out)
    assert [lab.qid for lab in labs] == ["a", "b"]
    for lab, rec in zip(labs, recs):
        assert list(lab.passage_ids) == [p.id for p in rec.passages]
        assert len(lab.u) == 3 and all(np.isfinite(lab.u))
        assert lab.outcome == "gold" and lab.design == "loo" and lab.generator_calls == 3 + 1  # k + 1
        assert lab.ranking[0] == lab.passage_ids[int(np.argmax(lab.u))]
    assert labs[1].gold_ids == ("p2",)
    s3 = generate_labels(gen, recs, out, show_progress=False)
    assert s3.written == 0 and len(read_labels(out)) == 2
    s4 = generate_labels(gen, recs[1:2], out, resume=False, show_progress=False)
    assert s4.written == 1 and [lab.qid for lab in read_labels(out)] == ["b"]


def test_defaults_are_the_held_out_winner() -> None:
    """Library and CLI train the recipe chosen on held-out labels (ListNet, lr 1e-4, 3 epochs)."""
    import inspect

    from ragkit.cli import build_parser
    from ragkit.training.distill import train_student

    params = inspect.signature(train_student).parameters
    assert (params["loss"].default, params["lr"].default, params["epochs"].default) == ("listnet", 1e-4, 3.0)
    from ragkit.cli.distill import recipe_kwargs

    args = build_parser().parse_args(["distill", "--labels", "l.jsonl", "--out", "s", "--student", "cross-encoder"])
    kw = recipe_kwargs(args)
    assert (kw["loss"], kw["lr"], kw["epochs"]) == ("listnet", 1e-4, 3.0)
