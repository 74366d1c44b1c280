"""MS MARCO leaderboard metrics against values worked out by hand (see the comments)."""

from __future__ import annotations

import math

import pytest

from ragkit.eval.msmarco_official import answer_metrics, bleu_scores, corpus_scores, normalize, rouge_l


def test_normalisation_is_spacy_english_lowercased():
    # spaCy splits the trailing period and the contraction, keeps "u.s." whole; lower-cased
    assert normalize("The U.S. capital isn't Paris.") == "the u.s. capital is n't paris ."
    # a run of spaces becomes an empty token (the script keeps it: double space)
    assert normalize("a  b") == "a  b"


def test_one_reference_by_hand():
    # cand: the cat sat on the mat (6)   ref: the cat is on the mat (6)
    # clipped matches / guesses: 1-grams 5/6, 2-grams 3/5, 3-grams 1/4, 4-grams 0/3; no brevity
    # penalty (equal lengths, up to the 1e-15 / 1e-9 guards)
    b = bleu_scores("The cat sat on the mat", "the cat is on the mat")
    assert b[0] == pytest.approx(5 / 6, abs=1e-8)
    assert b[1] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=1e-8)
    assert b[2] == pytest.approx(0.5, abs=1e-8)  # (5/6 * 3/5 * 1/4) ** (1/3) = 0.125 ** (1/3)
    assert b[3] == pytest.approx((0.125 * 1e-15 / 3) ** 0.25, rel=1e-6)  # no 4-gram matches
    # LCS = "the cat on the mat" = 5: P = R = 5/6 -> F = 5/6 whatever beta
    assert rouge_l("The cat sat on the mat", ["the cat is on the mat"]) == pytest.approx(5 / 6)


def test_brevity_penalty_and_beta_by_hand():
    # cand "blue" (1 token), ref "the sky is blue" (4): 1-gram precision 1, BP = exp(1 - 4/1)
    assert bleu_scores("Blue", ["The sky is blue"])[0] == pytest.approx(math.exp(-3), rel=1e-6)
    # LCS 1: P = 1, R = 1/4 -> (1 + 1.2^2) * 1 * 0.25 / (0.25 + 1.2^2 * 1) = 0.61 / 1.69
    assert rouge_l("Blue", ["The sky is blue"]) == pytest.approx(0.61 / 1.69)


def test_several_references_by_hand():
    # cand "paris ." (2); refs "the capital is paris ." (5) and "paris" (1)
    # BLEU: clipped 1-grams 2/2, 2-grams 1/1 ("paris ." in ref 1), 3-grams (0 + 1e-15)/(0 + 1e-9);
    # closest reference length to 2 is 1 (|1-2| < |5-2|) so no brevity penalty
    b = bleu_scores("Paris.", ["The capital is Paris.", "paris"])
    assert b[0] == pytest.approx(1.0, abs=1e-8)
    assert b[1] == pytest.approx(1.0, abs=1e-8)
    assert b[2] == pytest.approx(1e-6 ** (1 / 3), rel=1e-6)
    assert b[3] == pytest.approx(1e-12 ** 0.25, rel=1e-6)
    # ROUGE-L maximises P and R separately over the references: P = 2/2 (ref 1), R = 1/1 (ref 2)
    # -> 1.0, where the best single reference (rouge-score's way) would give 2*0.5*1/1.5 = 0.667
    assert rouge_l("Paris.", ["The capital is Paris.", "paris"]) == pytest.approx(1.0)


def test_corpus_level_and_no_answer_exclusion_by_hand():
    preds = ["The cat sat on the mat", "Blue", "anything"]
    refs = [["the cat is on the mat"], ["The sky is blue"], ["No Answer Present."]]
    s = corpus_scores(preds, refs)
    assert s["n"] == 2  # the no-answer question is left out
    # BLEU-1 over the corpus: matches 5 + 1 of 6 + 1 guesses, lengths 7 vs 6 + 4 -> BP exp(1 - 10/7)
    assert s["bleu_1"] == pytest.approx(6 / 7 * math.exp(1 - 10 / 7), rel=1e-6)
    # 2-grams: 3 + 0 of 5 + 0
    assert s["bleu_2"] == pytest.approx(math.sqrt(6 / 7 * 3 / 5) * math.exp(1 - 10 / 7), rel=1e-6)
    assert s["rouge_l"] == pytest.approx((5 / 6 + 0.61 / 1.69) / 2)
    # corpus BLEU is not the mean of per-question BLEU
    per_q = [answer_metrics(p, r) for p, r in zip(preds, refs)]
    assert per_q[2] == {}
    assert (per_q[0]["bleu1_official"] + per_q[1]["bleu1_official"]) / 2 != pytest.approx(s["bleu_1"])
    assert per_q[1]["rougeL_official"] == pytest.approx(0.61 / 1.69)
    assert set(per_q[0]) == {"rougeL_official", "bleu1_official", "bleu2_official",
                             "bleu3_official", "bleu4_official"}


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no reference"):
        rouge_l("x", [])
    with pytest.raises(ValueError, match="one prediction per question"):
        corpus_scores(["a"], [])
