"""The label-free ``question`` outcome (query likelihood) and its prompt layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragkit.debias import MoI
from ragkit.debias.designs import loo
from ragkit.debias.outcomes import compute_outcomes
from ragkit.generation import Generator, question_template
from ragkit.generation.prompts import get_template
from ragkit.types import Passage

QUESTION = "Which magazine was started first, Arthur's Magazine or First for Women?"


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return [Passage(str(i), f"passage {i} about the fox and the magazine " * (i % 3 + 1), title=f"T{i}")
            for i in range(4)]


def test_question_template_layout(tiny_lm_dir: Path, passages: list[Passage]) -> None:
    for name in ("short", "chat"):
        g = Generator(str(tiny_lm_dir), device="cpu", template=name, show_progress=False)
        qt = question_template(g.template)
        p1, s1 = qt.split(QUESTION, passages, g.tokenizer)
        p2, s2 = qt.split("another question", passages[::-1], g.tokenizer)
        assert p1 == p2 and s1 != s2          # the prefix is the same for every intervention
        assert "magazine was started" not in p1 + s1  # the question is what is scored, never shown
        assert "[1] T0:" in s1
        # leaving out the last passage keeps everything before it
        assert (p1 + qt.split(QUESTION, passages[:3], g.tokenizer)[1]).startswith(
            p1 + s1[: s1.index("[4]")].rstrip("\n"))
    assert question_template(get_template("chat")).use_chat_template


def test_question_outcome_equals_direct_scores(gen: Generator, passages: list[Passage]) -> None:
    ods = loo(4)
    res = compute_outcomes("question", gen, [QUESTION, "Who founded it?"], [passages, passages[:3]],
                           [ods, loo(3)])
    assert [r.generator_calls for r in res] == [5, 4]
    qt = question_template(gen.template)
    for r, q, ps, o_s in [(res[0], QUESTION, passages, ods), (res[1], "Who founded it?", passages[:3], loo(3))]:
        prompts = [qt.build(q, [ps[i] for i in o], gen.tokenizer) for o in o_s]
        ref = gen.score(prompts, [q] * len(prompts))
        np.testing.assert_allclose(r.values, ref.mean, atol=1e-4)
    assert gen.template.name != qt.name  # the generator itself is left with its answer template


@pytest.mark.slow
def test_question_outcome_finds_the_passage_the_question_is_about() -> None:
    """SmolLM2: leave-one-out with the question outcome puts the on-topic paragraph first."""
    gen = Generator(device="cpu", show_progress=False)
    topic = Passage("gold", "Arthur's Magazine (1844-1846) was an American literary periodical published in "
                            "Philadelphia in the 19th century.", title="Arthur's Magazine")
    other = Passage("gold2", "First for Women is a woman's magazine published by Bauer Media Group in the USA. "
                             "The magazine was started in 1989.", title="First for Women")
    noise = [Passage(f"d{i}", t, title=ti) for i, (ti, t) in enumerate([
        ("Volcano", "A volcano is a rupture in the crust of a planet that allows hot lava to escape."),
        ("Tennis", "Tennis is a racket sport played individually or between two teams of two players."),
        ("Bread", "Bread is a staple food prepared from a dough of flour and water, usually by baking."),
    ])]
    ps = [noise[0], topic, noise[1], other, noise[2]]
    res = MoI.from_settings(gen, design="loo", outcome="question", fallback=False).run_batch([QUESTION], [ps],
                                                                                generate_answer=False)[0]
    top2 = set(res.ranking.ids()[:2])
    assert top2 == {"gold", "gold2"}, res.ranking.ids()


class _Delegating:
    """A generator wrapper that forwards every attribute (as benchmarks and apps write them)."""

    def __init__(self, gen: Generator) -> None:
        self._gen = gen

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._gen, name)


def test_question_outcome_through_a_wrapper(gen: Generator, passages: list[Passage]) -> None:
    """The outcome passes the question template as an argument: it never copies or mutates the generator."""
    direct = compute_outcomes("question", gen, [QUESTION], [passages], [loo(4)])[0]
    wrapped = compute_outcomes("question", _Delegating(gen), [QUESTION], [passages], [loo(4)])[0]
    np.testing.assert_allclose(wrapped.values, direct.values, atol=1e-6)
