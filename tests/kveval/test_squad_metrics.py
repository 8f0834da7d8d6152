"""The official SQuAD v1.1 normalization, exact match and F1 on known inputs."""
from __future__ import annotations

import pytest

from kvengine.kveval.metrics import exact_match, f1, normalize_answer, squad_scores


def test_it_lowercases_and_strips_punctuation_articles_and_extra_whitespace():
    assert normalize_answer("  The Denver   Broncos!! ") == "denver broncos"
    assert normalize_answer("An apple, a pear & the plum.") == "apple pear plum"


def test_it_keeps_article_letters_inside_words():
    assert normalize_answer("Theater and anthem") == "theater and anthem"


def test_it_removes_articles_after_punctuation_is_gone():
    # the official order: punctuation first, then articles, so "the-end" -> "theend" keeps its letters
    assert normalize_answer("the-end") == "theend"


def test_exact_match_compares_normalized_strings():
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0
    assert exact_match("Denver", "Denver Broncos") == 0.0


def test_f1_is_the_harmonic_mean_of_token_precision_and_recall():
    # prediction has 3 tokens, 2 shared with the 2-token truth: p = 2/3, r = 1, f1 = 0.8
    assert f1("Denver Broncos won", "the Denver Broncos") == pytest.approx(0.8)
    assert f1("Carolina Panthers", "Denver Broncos") == 0.0
    assert f1("", "Denver Broncos") == 0.0


def test_f1_counts_repeated_tokens_once_per_occurrence():
    # common = min(count) per token: "x y y" vs "y y z" shares two "y"s -> p = r = 2/3
    assert f1("x y y", "y y z") == pytest.approx(2 / 3)


def test_scores_take_the_best_ground_truth():
    em, score = squad_scores("in 1066", ["1066", "the year 1066", "October 1066"])
    assert em == 0.0
    assert score == pytest.approx(max(2 * 0.5 * 1 / 1.5, 2 * 0.5 * 0.5 / 1.0, 2 * 0.5 * 0.5 / 1.0))
    assert squad_scores("1066", ["the year 1066", "1066"]) == (1.0, 1.0)


def test_scores_refuse_an_empty_answer_list():
    with pytest.raises(ValueError, match="ground_truths"):
        squad_scores("anything", [])


def test_the_gate_counts_answers_with_the_same_normalization():
    from cartridges.services import gate
    from kvengine.text import answer_correct

    assert gate.answer_correct is answer_correct
    assert answer_correct("It is under the blue flowerpot.", ["Blue flowerpot"])
    assert answer_correct("Dana's code is 4,417.", ["4417"])  # SQuAD drops punctuation inside words and numbers
    assert not answer_correct("The flowerpots are blue", ["blue flowerpot"])  # on word boundaries only
    assert not answer_correct("anything", ["", "the"])  # an expected answer that normalizes to nothing never matches
