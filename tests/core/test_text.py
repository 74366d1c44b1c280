"""One answer extractor: the PS-GRPO reward and the evaluation metric read the same answer."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.eval.metrics import f1_max
from ragkit.generation import Generator
from ragkit.text import cut_at_stop, extract_answer, normalize_answer
from ragkit.training.psgrpo import ParaphraseSetReward

STOPS = ("\n", "Question:", "Passages:")
GOLD = ["Paris"]

# Raw completions as a sampler returns them (no stop applied yet), in the shapes small models write.
COMPLETIONS = [
    " Paris\nQuestion: what else?",
    "The answer is: Paris",
    "The answer is Paris",
    "[2] Paris",
    "A: Paris",
    'Answer: "Paris"',
    "answer: [1] Paris France",
    "\n\nParis Question: next",
    "Question: Where is it?",
    "Rome\nParis",
    "   ",
]


def _eval_path(raw: str) -> str:
    """What ``Generator.answer`` scores: decoding stops at the template's stop strings, then ``clean_answer``."""
    cut = cut_at_stop(raw, STOPS)
    generated = raw if cut is None else raw[:cut]
    return Generator.clean_answer(generated)


def test_reward_and_eval_read_the_same_answer() -> None:
    """The similarity inside the PS-GRPO reward receives exactly the answers evaluation scores."""
    seen: list[str] = []

    def recording_sim(hyps, refs):
        seen.extend(hyps)
        return np.ones(len(hyps))

    reward = ParaphraseSetReward(sim=recording_sim, kappa=None, gold_weight=0.0, stops=STOPS)
    n = len(COMPLETIONS)
    reward(prompts=[""] * 2 * n, completions=[c for c in COMPLETIONS for _ in range(2)],
           set_id=[f"s{i}" for i in range(n) for _ in range(2)], member=[0, 1] * n, answers=[GOLD] * 2 * n)
    assert seen == [_eval_path(raw) for raw in COMPLETIONS for _ in range(2)]
    for raw in COMPLETIONS:
        assert _eval_path(raw) == extract_answer(raw, STOPS), raw


def test_reward_gold_term_equals_the_eval_metric() -> None:
    """Each completion alone in its set gets only ``w * F1(answer, gold)``: the metric evaluation computes."""
    reward = ParaphraseSetReward(sim="bleu2", kappa=None, gold_weight=1.0)
    n = len(COMPLETIONS)
    got = reward(prompts=[""] * n, completions=COMPLETIONS, set_id=[f"s{i}" for i in range(n)],
                 member=[0] * n, answers=[GOLD] * n)
    want = [f1_max(_eval_path(raw), GOLD) for raw in COMPLETIONS]
    assert got == pytest.approx(want)
    # the lead-in forms all score a full match in both paths
    assert got[:6] == pytest.approx([1.0] * 6)


def test_lead_in_variants_agree_in_the_group_reward() -> None:
    """Two members answering "Paris" in different wrappings are in full agreement."""
    reward = ParaphraseSetReward(sim="bleu2", kappa=None, gold_weight=0.0)
    got = reward(prompts=["", ""], completions=["The answer is Paris", "[3] Paris\nQuestion: x"],
                 set_id=["a", "a"], member=[0, 1], answers=[GOLD, GOLD])
    assert got == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize(
    ("raw", "stops", "want"),
    [
        ('The answer is: [2] "Arthur\'s Magazine"\nmore', (), "Arthur's Magazine"),
        ("Paris Question: next", STOPS, "Paris"),
        ("Paris Question: next", (), "Paris Question: next"),
        ("\nParis\nLondon", ("\n",), "Paris"),  # a leading newline does not end the answer
        ("Question: x", STOPS, ""),  # a stop right at the start: no answer
        ("", STOPS, ""),
        ("ANSWER : the answer is 42", (), "42"),
    ],
)
def test_extract_answer_rules(raw: str, stops: tuple[str, ...], want: str) -> None:
    assert extract_answer(raw, stops) == want


def test_cut_at_stop_and_bad_stops() -> None:
    assert cut_at_stop("  Paris\nx", ["\n"]) == 7
    assert cut_at_stop("Paris", ["\n", ""]) is None
    with pytest.raises(ValueError, match="sequence of strings"):
        cut_at_stop("Paris", "\n")  # type: ignore[arg-type]


def test_normalize_answer_squad_rules() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
