"""A fast subset of the robustness cases (``tests/robustness/cases.py``): no traceback, the user's files kept."""

from __future__ import annotations

import math
import re

import cases  # tests/robustness/cases.py (this folder is on sys.path under pytest's rootdir-less import mode)
import pytest

from ragkit.debias import get_reranker
from ragkit.types import Passage

QUICK = [
    "cli: `train` alone", "search: manifest without its file list", "search: a passage file byte flipped",
    "search: --out is a folder", "index: --out the project folder$", "index: --corpus not JSON",
    "rerank: NaN retriever score", "rerank: duplicate passage ids", "eval: --limit -1",
    "eval: --methods typo", "ask: RAGKIT_CACHE is a file", "serve: --port 99999",
    "locks: `ragkit index` while",
]


def test_quick_cases_pass() -> None:
    sel = [c for c in cases.cases() if any(re.search(q, f"{c.group}: {c.what}") for q in QUICK)]
    assert len(sel) == len(QUICK)
    results = cases.run(sel, mounts=False)
    bad = [f"{r.case.group}: {r.case.what}: {r.problems} ({r.outcome()})" for r in results if r.problems]
    assert not bad, "\n".join(bad)
    assert not any("Traceback" in r.err for r in results)


def test_case_table_has_enough_cases() -> None:
    all_cases = cases.cases()
    assert len(all_cases) >= 150
    assert len({(c.group, c.what) for c in all_cases}) == len(all_cases)  # every row names a distinct input


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_reranker_refuses_non_finite_scores(bad: float) -> None:
    ps = [Passage("a", "alpha"), Passage("b", "beta")]
    with pytest.raises(ValueError, match="not a finite number"):
        get_reranker("none").rank("q", ps, [bad, 1.0])


@pytest.mark.parametrize("kw", [{"max_new_tokens": 0}, {"limit": -1}, {"limit": 0}, {"n_bootstrap": 0},
                                {"batch_size": 0}])
def test_eval_config_refuses_nonsense_counts(kw: dict) -> None:
    """``max_new_tokens=0`` is not 16 and ``limit=-1`` is not "all": refused before any work."""
    from ragkit.eval.runner import EvalConfig

    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} must be >= 1"):
        EvalConfig(**kw)


def test_sample_limit_minus_one_is_not_all_but_the_last() -> None:
    from ragkit.datasets import sample_records

    with pytest.raises(ValueError, match="limit must be >= 1"):
        sample_records(-1)
