"""experiments/psgrpo/audit.py: the confirmation's answers split by the hand labels of its paraphrases."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def audit(load_bench) -> ModuleType:
    """The script as a module (``psgrpo/...``: the CORD study has a ``confirm.py`` too)."""
    return load_bench("psgrpo/audit")


def test_set_values_split_the_wordings_by_label(audit: ModuleType) -> None:
    # original "paris"; rewrite 1 asks the same (same answer), 2 asks something else, 3 is a template
    v = audit.set_values(["paris", "paris", "lyon", "paris"], ["same", "changed", "template"], ["Paris"])
    assert v["consistency_same"] == pytest.approx(1.0)  # the three same-question answers agree
    assert v["agreement_changed"] == pytest.approx(0.0)  # "lyon" shares nothing with "paris"
    assert v["em_same"] == 1.0 and v["f1_same"] == 1.0  # the changed wording's answer is not scored
    v = audit.set_values(["paris", "lyon"], ["changed"], ["Paris"])
    assert math.isnan(v["consistency_same"])  # one same-question wording: no pair
    with pytest.raises(ValueError, match="different paraphrase sets"):
        audit.set_values(["a", "b"], ["same", "same"], ["a"])


def test_label_counts(audit: ModuleType) -> None:
    c = audit.label_counts({"q1": ["same", "changed", "template"], "q2": ["same", "same", "template"]})
    assert (c["n_same"], c["n_changed"], c["n_template"]) == (3, 1, 2)
    assert c["same_share_of_generated"] == pytest.approx(0.75)
    assert (c["sets_all_same_question"], c["sets_with_changed"]) == (1, 1)


def test_run_on_a_small_confirmation(audit: ModuleType, tmp_path: Path) -> None:
    sets = [{"set_id": f"q{i}", "answers": ["paris"]} for i in range(4)]
    labels = {f"q{i}": ["same", "changed"] for i in range(4)}

    def arm(outs: list[list[str]]) -> dict:
        return {"per_seed": {"0": {"evaluation": {"per_set": {f"q{i}": {"outputs_fixed": o}
                                                             for i, o in enumerate(outs)}}}}}

    result = {"plan": {"path": "plan.json", "commit": "x"}, "paraphrases": {"dev_strong": {"sets": sets}},
              "arms": {"base": arm([["paris", "rome", "lyon"]] * 4),
                       "psgrpo": arm([["paris", "paris", "paris"]] * 4)}}
    res, aud, out = tmp_path / "r.json", tmp_path / "a.json", tmp_path / "o.json"
    res.write_text(json.dumps(result))
    aud.write_text(json.dumps({"status": "exploratory", "labelled_by": "test", "when": "now",
                               "labels": {"dev_strong": labels}}))
    assert audit.run({"results": str(res), "audit": str(aud), "out": str(out), "n_boot": 50}) == 0
    got = json.loads(out.read_text())
    assert got["arms"]["psgrpo"]["metrics"]["agreement_changed"] == pytest.approx(1.0)
    assert got["arms"]["base"]["metrics"]["f1_same"] == pytest.approx(0.5)  # "paris" then "rome"
    c = got["contrasts"]["psgrpo - base (agreement_changed)"]
    assert c["mean"] == pytest.approx(1.0) and c["n_questions"] == 4
    assert "psgrpo - base (consistency_same)" in got["contrasts"]
    # labels of other sets than the results': a clear error, not a silent empty table
    aud.write_text(json.dumps({"status": "x", "labelled_by": "x", "when": "x", "labels": {"dev_strong": {}}}))
    with pytest.raises(SystemExit, match="no labels"):
        audit.run({"results": str(res), "audit": str(aud), "out": str(out), "n_boot": 50})


def test_rewrite_prompt_score_unblinds(load_bench, tmp_path: Path) -> None:
    rp = load_bench("psgrpo/rewrite_prompt")
    pairs = [{"id": "p000", "prompt": "library"}, {"id": "p001", "prompt": "candidate"},
             {"id": "p002", "prompt": "library"}]
    key = {"fallback": {"library": 0, "candidate": 1}, "pairs": pairs}
    out, labels = tmp_path / "k.json", tmp_path / "l.json"
    out.write_text(json.dumps(key))
    labels.write_text(json.dumps({"labels": {"p000": "same", "p001": "changed"}}))
    with pytest.raises(SystemExit, match="unlabelled"):
        rp.run({"out": str(out), "score": str(labels)})
    labels.write_text(json.dumps({"labels": {"p000": "same", "p001": "changed", "p002": "changed"}}))
    assert rp.run({"out": str(out), "score": str(labels)}) == 0
    s = json.loads(out.read_text())["scores"]
    assert s["library"] == {"same": 1, "changed": 1, "same_share": 0.5}
    assert s["candidate"]["same_share"] == 0.0
