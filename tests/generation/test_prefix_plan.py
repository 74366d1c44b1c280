"""Presence interventions share their prompt prefix with the full prompt (AttriBoT-style reuse)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragkit.debias.designs import ablate, loo
from ragkit.generation import Generator
from ragkit.generation.scoring import common_prefix_len, prefix_plan
from ragkit.types import Passage

QUESTION = "Which magazine was started first?"


def test_prefix_plan_hand_values() -> None:
    full = [1, 2, 3, 4, 5, 6, 7]
    drop_last = [1, 2, 3, 4, 5, 7]      # shares 5 tokens with the full prompt
    drop_mid = [1, 2, 3, 5, 6, 7]       # shares 3
    # reference = the full prompt: P = 5; rows reuse 5 (ref), 5, 3
    assert prefix_plan([full, drop_last, drop_mid]) == (0, [5, 5, 3])
    # a single row reuses all but its last token
    assert prefix_plan([[9, 8, 7]]) == (0, [2])
    # permutations share only their common prefix: the plan is that prefix for every row
    perms = [[1, 2, 3, 4, 5], [1, 2, 4, 5, 3], [1, 2, 5, 3, 4]]
    assert prefix_plan(perms) == (0, [common_prefix_len(perms)] * 3)
    # a row identical to the reference still keeps one token to feed; one-token rows reuse nothing
    assert prefix_plan([[1, 2, 3], [1, 2, 3], [1]]) == (0, [2, 2, 0])
    # the reference is the row that saves most, not the first
    rows = [[1, 9, 9, 9], [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7]]
    ref, reuse = prefix_plan(rows)
    assert ref == 1 and reuse == [1, 4, 4, 3]


@pytest.fixture(scope="module")
def gen(tiny_lm_dir: Path) -> Generator:
    return Generator(str(tiny_lm_dir), device="cpu", template="short", batch_size=4, show_progress=False)


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [Passage(str(i), f"passage {i} about the fox and the magazine " * (i % 3 + 1), title=f"T{i}")
            for i in range(6)]


@pytest.mark.parametrize("design", ["loo", "ablate"])
def test_presence_rows_equal_uncached_score(gen: Generator, passages: list[Passage], design: str) -> None:
    k = len(passages)
    ods = loo(k) if design == "loo" else ablate(k, n=8, rng=3)
    ods2 = loo(3)
    q2 = "Who founded it, and when?"
    res = gen.score_orderings([QUESTION, q2], [passages, passages[:3]], [ods, ods2], ["the fox", "1844"])
    for r, q, ps, o_s, a in [(res[0], QUESTION, passages, ods, "the fox"), (res[1], q2, passages[:3], ods2, "1844")]:
        ref = gen.score([gen.build_prompt(q, [ps[i] for i in o]) for o in o_s], [a] * len(o_s))
        np.testing.assert_allclose(r.sum, ref.sum, atol=1e-4)


def test_loo_reuses_the_full_prompt(gen: Generator, passages: list[Passage]) -> None:
    """Leave-one-out costs about half the prompt tokens of scoring its rows one by one."""
    ods = loo(len(passages))
    prompts = [gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in ods]
    gen.reset_counters()
    gen.score(prompts, ["the fox"] * len(prompts))
    plain = gen.reset_counters()["prefill_tokens"]
    gen.score_orderings([QUESTION], [passages], [ods], ["the fox"])
    cached = gen.reset_counters()["prefill_tokens"]
    assert cached < 0.65 * plain, (cached, plain)


def test_run_orderings_with_presence_rows(gen: Generator, passages: list[Passage]) -> None:
    ods = loo(4)
    runs = gen.run_orderings([QUESTION], [passages[:4]], [ods], lambda q, a: ["the fox"], max_new_tokens=4)
    prompts = [gen.build_prompt(QUESTION, [passages[i] for i in o]) for o in ods]
    assert runs[0].answers == [gen.clean_answer(o) for o in gen.generate(prompts, max_new_tokens=4,
                                                                          stop=list(gen.template.stop))]
    ref = gen.score(prompts, ["the fox"] * len(prompts))
    np.testing.assert_allclose(runs[0].scores[0].sum, ref.sum, atol=1e-4)
