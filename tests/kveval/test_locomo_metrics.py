"""LoCoMo's scores as the paper's evaluation computes them (values worked out by hand), and evidence recall."""
from __future__ import annotations

import pytest

from kvengine.kveval.locomo import NOT_MENTIONED
from kvengine.kveval.locomo_runner import recall_at_k, summarize_recall
from kvengine.kveval.metrics import (
    evidence_recall,
    locomo_f1,
    locomo_normalize,
    locomo_resolve_choice,
    locomo_score,
    normalize_answer,
)


def test_it_normalizes_as_squad_and_also_drops_the_word_and():
    assert locomo_normalize("The Cat, and the Hat!") == "cat hat"
    assert normalize_answer("The Cat, and the Hat!") == "cat and hat"  # SQuAD's keeps it
    assert locomo_normalize("Sandy Anderson and Andy") == "sandy anderson andy"  # only the whole word


def test_it_compares_porter_stemmed_tokens():
    assert locomo_f1("running dogs", "the dog runs") == 1.0  # run, dog on both sides
    assert locomo_f1("red car", "a red bicycle") == pytest.approx(0.5)  # 1 common of 2 and 2
    assert locomo_f1("", "Rex") == 0.0
    assert locomo_f1("Paris", "") == 0.0


def test_multi_hop_is_the_mean_of_the_best_partial_f1_over_comma_separated_answers():
    assert locomo_score("hiking", "hiking, painting", 1) == pytest.approx(0.5)  # 1 for hiking, 0 for painting
    # one prediction part "paint hike" against each answer part: P 1/2, R 1 -> 2/3, twice
    assert locomo_score("painting and hiking", "hiking, painting", 1) == pytest.approx(2 / 3)
    assert locomo_score("painting, hiking", "hiking, painting", 1) == 1.0


def test_temporal_and_single_hop_score_the_whole_answer_and_open_domain_its_part_before_the_semicolon():
    assert locomo_score("June 9, 2023", "9 June 2023", 2) == 1.0  # tokens, not order
    assert locomo_score("yes", "Yes; she adopted a puppy", 3) == 1.0
    # the same pair as single-hop: "yes" against "yes she adopt puppi": P 1, R 1/4 -> 0.4
    assert locomo_score("yes", "Yes; she adopted a puppy", 4) == pytest.approx(0.4)
    assert locomo_score("2023", "2023", 4) == 1.0


def test_adversarial_counts_an_answer_that_says_it_is_not_mentioned():
    assert locomo_score("(a) Not mentioned in the conversation", "Rex", 5) == 1.0
    assert locomo_score("No information available.", "Rex", 5) == 1.0
    assert locomo_score("Rex", "Rex", 5) == 0.0
    assert locomo_score("I don't know", "Rex", 5) == 0.0  # only the paper's two phrases count


def test_a_bare_option_letter_resolves_to_its_option():
    options = {"a": NOT_MENTIONED, "b": "Rex"}
    assert locomo_resolve_choice("a", options) == NOT_MENTIONED
    assert locomo_resolve_choice(" (B) ", options) == "Rex"
    assert locomo_resolve_choice("b", options) == "Rex"
    assert locomo_resolve_choice("It is Rex", options) == "It is Rex"
    assert locomo_score(locomo_resolve_choice("(a)", options), "Rex", 5) == 1.0


def test_it_refuses_an_unknown_category():
    with pytest.raises(ValueError, match="`category`.*6"):
        locomo_score("x", "x", 6)


def test_evidence_recall_is_the_fraction_of_evidence_retrieved():
    assert evidence_recall([0, 2, 5], [0, 1]) == 0.5
    assert evidence_recall([3], [3]) == 1.0
    assert evidence_recall([3], []) is None


def test_recall_at_k_counts_evidence_ranked_within_k():
    assert recall_at_k([1, 4, 11], 3) == pytest.approx(1 / 3)
    assert recall_at_k([1, 4, 11], 5) == pytest.approx(2 / 3)
    assert recall_at_k([1, 4, 11], 11) == 1.0


def test_recall_is_summarized_per_retriever_k_and_category():
    rows = [{"qid": "a", "category": 1, "ranks": {"bm25": [1, 4]}},
            {"qid": "b", "category": 4, "ranks": {"bm25": [2]}},
            {"qid": "c", "category": 4, "ranks": {"bm25": [7]}}]
    summary = summarize_recall(rows, ["bm25"], [3, 10])
    assert summary["bm25"]["3"] == {"all": pytest.approx(100 * 1.5 / 3), "1": 50.0, "4": 50.0}
    assert summary["bm25"]["10"] == {"all": 100.0, "1": 100.0, "4": 100.0}
    assert summary["num_questions"] == {"all": 3, "1": 1, "4": 2}
