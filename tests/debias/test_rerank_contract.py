"""One reranking contract: rerankers (sync + async), placements, answerers, the preset registry,
and every preset through the evaluation runner on bundled questions (tiny real models)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.datasets import sample_records
from ragkit.debias import MoI, MoIReranker, PositionProfile
from ragkit.debias.baselines import IdentityReranker, RandomReranker
from ragkit.debias.cross_encoder import pair_text
from ragkit.debias.placement import place
from ragkit.debias.presets import METHOD_NAMES, available_methods, get_method, get_reranker, resolve_method
from ragkit.eval.runner import EvalConfig, run_eval
from ragkit.types import Passage, Query


def _ps(k: int) -> list[Passage]:
    return [Passage(id=f"d{i}", text=f"word number {i}", title=f"T{i}") for i in range(k)]


@pytest.fixture(scope="module")
def gen(tiny_lm_dir: Path):
    from ragkit.generation import Generator

    return Generator(model=str(tiny_lm_dir), device="cpu", passage_max_tokens=16, show_progress=False)


@pytest.fixture(scope="module")
def student_dir(tiny_encoder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny student trained in the test (keyword labels, one epoch) and saved like `ragkit distill`."""
    from ragkit.training.distill import train_student
    from ragkit.training.labels import LabelRecord

    rng = np.random.default_rng(0)
    words = "river mountain castle history music science garden winter".split()
    labels = []
    for qi in range(8):
        texts = [" ".join(rng.choice(words, size=5)) for _ in range(3)]
        pos = qi % 3
        texts[pos] += " zebra"
        labels.append(LabelRecord(qid=f"q{qi}", question="which zebra?", passage_ids=["a", "b", "c"],
                                  texts=texts, u=[float(j == pos) for j in range(3)], answers=["x"]))
    out = tmp_path_factory.mktemp("contract") / "student"
    train_student(labels, out, base_model=str(tiny_encoder_dir), epochs=1, batch_size=4, lr=1e-3,
                  max_length=32, device="cpu", report_loss=False, show_progress=False)
    return out


# ------------------------------------------------------------------ placement (hand-computed)
def test_placements_hand_computed() -> None:
    ranking = [3, 1, 0, 2, 4]  # passage indices, best first
    assert place(ranking, "none") == [3, 1, 0, 2, 4]
    assert place(ranking, "ranked") == [3, 1, 0, 2, 4]
    assert place(ranking, "reverse") == [4, 2, 0, 1, 3]
    assert place(ranking, "both_ends") == [3, 0, 4, 2, 1]
    w = [0.1, 0.3, 0.05, 0.15, 0.4]  # slots by weight: 4, 1, 3, 0, 2
    assert place(ranking, "bias_aware", w) == [2, 1, 4, 0, 3]
    prof = PositionProfile(np.array([0.2, 0.2, 0.6]), k=3)  # resized to k = 5 keeps the last slot heaviest
    assert place(ranking, "bias_aware", prof)[-1] == 3
    with pytest.raises(ValueError, match="unknown placement 'middle'.*both_ends"):
        place(ranking, "middle")
    with pytest.raises(ValueError, match="needs a position profile"):
        place(ranking, "bias_aware")
    with pytest.raises(ValueError, match="4 slots but there are 5"):
        place(ranking, "bias_aware", [0.25] * 4)


# ------------------------------------------------------------------ rerankers
def test_identity_and_random_rerankers() -> None:
    ps = _ps(6)
    ident = IdentityReranker().rank("q?", ps, scores=[6, 5, 4, 3, 2, 1])
    assert ident.ids() == [p.id for p in ps] and ident.scores() == [6, 5, 4, 3, 2, 1]
    rr = RandomReranker(seed=3)
    one = rr.rank("second?", ps)
    batch = rr.rank_many(["first?", "second?"], [ps[:4], ps])
    assert batch[1].ids() == one.ids()  # independent of batching
    assert sorted(one.ids()) == sorted(p.id for p in ps)
    orders = {tuple(RandomReranker(seed=s).rank("second?", ps).ids()) for s in range(8)}
    assert len(orders) > 4  # the seed matters
    assert [r.info.generator_calls for r in batch] == [0, 0] and [r.info.batch_queries for r in batch] == [2, 2]
    assert not any(r.info.fallback for r in batch) and all(r.info.seconds >= 0 for r in batch)


def test_async_rank_equals_sync(student_dir: Path) -> None:
    student = get_reranker(f"student:{student_dir}", device="cpu")
    ps = _ps(4)
    sync = student.rank("which zebra?", ps)
    many = student.rank_many(["which zebra?", "q two?"], [ps, ps[:2]])

    async def both():
        return await asyncio.gather(student.arank("which zebra?", ps),
                                    student.arank_many(["which zebra?", "q two?"], [ps, ps[:2]]))

    a, b = asyncio.run(both())
    assert a.ids() == sync.ids() and np.allclose(a.scores(), sync.scores(), atol=1e-6)
    assert [r.ids() for r in b] == [r.ids() for r in many]


def test_cross_encoder_spec_loads_any_cross_encoder_folder(student_dir: Path) -> None:
    from ragkit.debias import CrossEncoderReranker, DistilledReranker

    ce = get_reranker(f"cross-encoder:{student_dir}", device="cpu")
    st = get_reranker(f"student:{student_dir}", device="cpu")
    assert type(ce) is CrossEncoderReranker and isinstance(st, DistilledReranker)
    ps = _ps(5)
    a, b = ce.rank("which zebra?", ps), st.rank("which zebra?", ps)
    assert a.ids() == b.ids() and np.allclose(a.scores(), b.scores(), atol=1e-5)


def test_bi_encoder_spec_ranks_by_the_embedders_cosine(tiny_encoder_dir: Path) -> None:
    """``bi-encoder:NAME``: a stock embedder's cosine of question and passage, computed here by hand."""
    from sentence_transformers import SentenceTransformer

    from ragkit.debias.bi_encoder import BiEncoderReranker

    rr = get_reranker(f"bi-encoder:{tiny_encoder_dir}", device="cpu", batch_size=2)
    assert type(rr) is BiEncoderReranker and rr.metadata["trained"] is False
    ps = [Passage(id=f"p{i}", text=t) for i, t in enumerate(
        ["zebras live in africa", "the moon is made of rock", "which zebra is striped", "tea and cake"])]
    got = rr.rank("which zebra?", ps)
    st = SentenceTransformer(str(tiny_encoder_dir), device="cpu")
    q = st.encode(["which zebra?"], normalize_embeddings=True)[0]
    d = st.encode([pair_text(p) for p in ps], normalize_embeddings=True)
    want = np.argsort(-(d @ q), kind="stable")
    assert got.ids() == [ps[i].id for i in want]
    assert np.allclose(sorted(got.scores(), reverse=True), np.sort(d @ q)[::-1], atol=1e-5)
    assert got.info.forward_passes == 1 + len(ps)
    with pytest.raises(TypeError, match="takes no max_length"):
        get_reranker(f"bi-encoder:{tiny_encoder_dir}", max_length=8)
    assert resolve_method(f"bi-encoder:{tiny_encoder_dir}").loads_encoder


def test_factory_errors_name_the_fix(gen, student_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown reranker 'mio'.*moi_prior.*cross-encoder:NAME"):
        get_reranker("mio")
    with pytest.raises(ValueError, match="names no model"):
        get_reranker("student:")
    with pytest.raises(ValueError, match="no such student folder"):
        get_reranker(f"student:{tmp_path / 'nope'}")
    with pytest.raises(TypeError, match="takes no seed"):
        get_reranker("none", seed=1)
    with pytest.raises(TypeError, match="takes no max_length"):  # never silently dropped
        get_reranker(f"student:{student_dir}", max_length=8)
    with pytest.raises(ValueError, match="needs a generator"):
        get_reranker("moi")
    rr = IdentityReranker()
    assert get_reranker(rr) is rr
    assert get_reranker("moi_gold", gen).needs_answers and not get_reranker("moi", gen).needs_answers


def test_default_moi_is_loo_question_and_cyclic_stays_by_name(gen) -> None:
    """Issue 20: the label-free default chosen on train is leave-one-out + question likelihood."""
    for moi in (MoI(gen), MoI.from_settings(gen), MoIReranker(gen).moi, get_reranker("moi", gen).moi):
        assert (moi.design.name, moi.outcome.name) == ("loo", "question")  # type: ignore[union-attr]
    old = get_reranker("moi_cyclic", gen).moi
    assert (old.design.name, old.outcome.name) == ("cyclic", "consensus")  # type: ignore[union-attr]
    assert get_reranker("moi_cyclic", gen, budget=2).moi.design.budget == 2  # settings still override the preset
    # the default runs k + 1 interventions (full prompt + each passage left out), no generation before
    # the final answer
    rr = get_reranker("moi", gen, max_new_tokens=2)
    info = rr.rank("Which word is number 1?", _ps(3)).info
    assert sorted(map(sorted, info.details["orderings"])) == sorted([[0, 1, 2], [0, 1], [0, 2], [1, 2]])
    assert info.details["ordering_answers"] == [] and info.generator_calls == 4
    # 4 scored sequences: a shared-prefix prefill and the 4 suffixes, no decoding
    assert info.forward_passes >= 1 and info.tokens_prefilled > 0 and info.tokens_generated == 0
    rr = get_reranker("moi_cyclic", gen, max_new_tokens=2)
    info = rr.rank("Which word is number 1?", _ps(3)).info
    assert sorted(map(tuple, info.details["orderings"])) == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert info.tokens_generated > 0  # the consensus outcome decodes each ordering's answer


def test_registry_names_and_validation() -> None:
    assert set(METHOD_NAMES) == {"none", "reverse", "both_ends", "random", "voting", "psc_borda", "psc_rrf",
                                 "moi", "moi_cyclic", "moi_prior", "moi_confidence", "moi_gold", "moi_loo",
                                 "moi_loo_gold", "moi_loo_q", "moi_masked", "upr", "icr", "moi_attn"}
    assert available_methods()[-4:] == ["student:PATH", "cross-encoder:NAME", "bi-encoder:NAME", "llm:MODEL"]
    p = resolve_method("moi_prior")
    assert (p.reranker, p.placement, p.answerer) == ("moi_prior", "bias_aware", "single")
    assert resolve_method("cross-encoder:some/model").loads_encoder
    with pytest.raises(ValueError, match="unknown method 'nonee'.*none.*student:PATH"):
        resolve_method("nonee")


def test_gold_answers_reach_only_oracles(gen) -> None:
    ps = _ps(3)
    oracle = get_method("moi_gold", gen, max_new_tokens=2)
    with pytest.raises(ValueError, match="gold answers"):
        oracle.run_many(["Which word is number 1?"], [ps])
    (out,) = oracle.run_many([Query("Which word is number 1?", answers=("word number 1",))], [ps])
    assert out.extra["target"] == "word number 1"  # the gold answer was the MoI outcome
    label_free = get_method("moi_prior", gen, max_new_tokens=2)
    (lf,) = label_free.run_many(["Which word is number 1?"], [ps], answers=[["word number 1"]])
    assert lf.ranking.query is not None and lf.ranking.query.answers == ()  # not handed to MoI


# ------------------------------------------------------------------ every preset through the runner
REGISTRY = [*METHOD_NAMES, "student:", "cross-encoder:"]


@pytest.mark.parametrize("name", REGISTRY)
def test_every_registered_method_runs_in_eval(name: str, gen, student_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14 item 6: each method (``moi_gold`` included) runs on 2 bundled questions."""
    method = f"{name}{student_dir}" if name.endswith(":") else name
    recs = sample_records(2)
    if name == "moi_attn":  # reads the probe of this generator: fit one on the two questions, found by its fingerprint
        from ragkit.debias.attention_probe import fit_attention_probe, model_fingerprint

        monkeypatch.setenv("RAGKIT_PROBE_DIR", str(tmp_path))
        fit_attention_probe(gen, [r.question for r in recs], [list(r.passages[:3]) for r in recs],
                            [[1.0, 0.0, -1.0]] * 2, out=tmp_path / f"{model_fingerprint(gen)}.json",
                            show_progress=False)
    cfg = EvalConfig(sample=True, limit=2, k=3, methods=(method,), max_new_tokens=2, n_bootstrap=10,
                     device="cpu")
    rep = run_eval(cfg, out=tmp_path / "r.json", records=recs, generator=gen, show_progress=False)
    assert rep["aggregate"][method]["questions"] == 2
    for row, rec in zip(rep["outputs"], recs):
        assert sorted(row["ranking"]) == sorted(p.id for p in rec.passages[:3])
        assert sorted(row["order"]) == [0, 1, 2]
        assert isinstance(row["prediction"], str) and row["generator_calls"] >= 1
    if name.startswith("moi"):
        assert all(r["generator_calls"] > 1 for r in rep["outputs"])


def test_eval_none_moi_student_on_the_bundled_sample(gen, student_dir: Path, tmp_path: Path) -> None:
    """`ragkit eval --methods none,moi,student:DIR` in the library: the student ranks as it does alone."""
    from ragkit.debias import DistilledReranker

    spec = f"student:{student_dir}"
    cfg = EvalConfig(sample=True, limit=2, k=4, methods=("none", "moi", spec), max_new_tokens=2,
                     n_bootstrap=10, device="cpu")
    recs = sample_records(2)
    rep = run_eval(cfg, out=tmp_path / "r.json", records=recs, generator=gen, show_progress=False)
    assert set(rep["aggregate"]) == {"none", "moi", spec}
    student = DistilledReranker.load(student_dir, device="cpu")
    rows = [r for r in rep["outputs"] if r["method"] == spec]
    for row, rec in zip(rows, recs):
        assert row["ranking"] == student.rank(rec.question, list(rec.passages[:4])).ids()
        assert row["order"] == [row["candidates"].index(i) for i in row["ranking"]]  # ranking order
        assert row["generator_calls"] == 1  # the student costs no generator pass
    md = (tmp_path / "r.md").read_text()
    assert "| moi |" in md and json.loads((tmp_path / "r.json").read_text())["n_questions"] == 2


def test_cli_eval_with_a_student_method(tiny_lm_dir: Path, student_dir: Path, tmp_path: Path) -> None:
    """`ragkit eval --methods none,moi,student:DIR` on the bundled sample (issue 13)."""
    from ragkit.cli import main

    out = tmp_path / "cli.json"
    spec = f"student:{student_dir}"
    rc = main(["--quiet", "eval", "--model", str(tiny_lm_dir), "--methods", f"none,moi,{spec}", "--limit", "2",
               "--k", "3", "--passage-max-tokens", "16", "--max-new-tokens", "2", "--bootstrap", "10",
               "--device", "cpu", "--out", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert list(rep["aggregate"]) == ["none", "moi", spec] and rep["n_questions"] == 2
