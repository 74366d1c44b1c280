"""Answer similarities of the shared core (BLEU-2, token ROUGE-L, token F1; cosine in test_rewards)."""

from __future__ import annotations

import numpy as np
import pytest

from ragkit.similarity import (
    get_similarity,
    is_empty_answer,
    pairwise_similarity,
    sim_bleu2,
    sim_rouge_l,
    sim_token_f1,
)


def test_similarities_basic_values() -> None:
    assert sim_bleu2(["The Eiffel Tower"], ["eiffel tower"])[0] == pytest.approx(1.0)
    assert sim_bleu2(["Paris"], ["London"])[0] == 0.0
    assert sim_bleu2([""], [""])[0] == 0.0
    b = sim_bleu2(["black cat sat on mat"], ["black cat sat on rug"])[0]
    assert 0.5 < b < 1.0
    assert sim_rouge_l(["w x y z"], ["w y z"])[0] == pytest.approx(2 * 0.75 * 1.0 / 1.75)
    assert sim_token_f1(["Paris France"], ["Paris"])[0] == pytest.approx(2 / 3)
    m = pairwise_similarity(["Paris", "London"], ["Paris", "Rome", "London"])
    assert m.shape == (2, 3) and m[0, 0] == 1.0 and m[1, 2] == 1.0 and m[0, 1] == 0.0
    with pytest.raises(ValueError, match="aligned"):
        sim_bleu2(["a"], ["a", "b"])


def test_named_similarities_and_errors() -> None:
    assert get_similarity("bleu2") is sim_bleu2 and get_similarity("rougel") is sim_rouge_l
    assert get_similarity("rouge_l") is sim_rouge_l and get_similarity("f1") is sim_token_f1

    def mine(h, r):
        return np.zeros(len(h))

    assert get_similarity(mine) is mine
    with pytest.raises(ValueError, match="unknown similarity 'meteor'"):
        get_similarity("meteor")
    with pytest.raises(ValueError, match="lists of strings"):
        sim_rouge_l("a", "a")  # type: ignore[arg-type]


def test_token_f1_is_the_squad_f1_and_empty_answers() -> None:
    from ragkit.text import f1_score

    pairs = [("The Eiffel Tower", "Eiffel tower in Paris"), ("yes", "no"), ("", "x"), ("a b c", "c b a")]
    got = sim_token_f1([h for h, _ in pairs], [r for _, r in pairs])
    assert got.tolist() == pytest.approx([f1_score(h, r) for h, r in pairs])
    assert is_empty_answer(["", "the", " a! ", "Paris"]).tolist() == [True, True, True, False]
