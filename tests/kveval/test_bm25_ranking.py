"""BM25 (bm25s, Lucene's formula) ranks known documents as the formula says, the same way for kveval and the gate."""
from __future__ import annotations

import math

import pytest

from kvengine.retrieval import Bm25, bm25_tokenize, bm25_top_k

DOCS = ["apple banana", "Apple apple cherry", "banana cherry durian"]


def _lucene(tf: int, df: int, num_docs: int, length: int, avg_length: float, k1: float = 1.5, b: float = 0.75) -> float:
    idf = math.log(1.0 + (num_docs - df + 0.5) / (df + 0.5))
    return idf * tf / (tf + k1 * (1 - b + b * length / avg_length))


def test_it_tokenizes_lowercase_words():
    assert bm25_tokenize("Apple, apple-PIE 42!") == ["apple", "apple", "pie", "42"]


def test_it_scores_each_document_by_lucenes_bm25():
    scores = Bm25(DOCS).scores("apple")
    avg = 8 / 3
    assert scores[0] == pytest.approx(_lucene(tf=1, df=2, num_docs=3, length=2, avg_length=avg), rel=1e-6)
    assert scores[1] == pytest.approx(_lucene(tf=2, df=2, num_docs=3, length=3, avg_length=avg), rel=1e-6)
    assert scores[2] == 0.0


def test_a_repeated_query_word_counts_once_per_occurrence():
    bm25 = Bm25(DOCS)
    assert bm25.scores("durian durian")[2] == pytest.approx(2 * bm25.scores("durian")[2], rel=1e-6)


def test_it_returns_the_best_documents_in_log_order():
    bm25 = Bm25(DOCS)
    assert bm25.scores("apple")[1] > bm25.scores("apple")[0] > 0
    assert bm25.top_k("apple", 1) == [1]
    assert bm25.top_k("apple", 3) == [0, 1, 2]
    # "durian" is in one document only: it outweighs the common "banana" ...
    assert bm25.top_k("banana durian", 1) == [2]
    # ... and the two best come back in log order, not best first
    assert bm25.top_k("banana durian", 2) == [0, 2]


def test_ties_go_to_the_earlier_document_and_k_is_capped():
    bm25 = Bm25(DOCS)
    assert bm25.top_k("zebra", 2) == [0, 1]  # nothing matches: all tie at 0
    assert bm25.top_k("", 1) == [0]  # no words at all
    assert bm25.top_k("cherry", 10) == [0, 1, 2]
    same = ["the cat sat", "a dog ran", "the cat sat"]
    assert Bm25(same).top_k("cat", 1) == [0]


def test_it_refuses_no_documents_and_a_k_below_one():
    with pytest.raises(ValueError, match="documents"):
        Bm25([])
    with pytest.raises(ValueError, match="`k` has to be at least 1 but got 0"):
        Bm25(DOCS).top_k("apple", 0)


def test_bm25_top_k_returns_texts_in_log_order():
    texts = ["The car is parked on level 3.", "Dana's locker code is 4417.", "The cat is called Miso."]
    assert bm25_top_k(texts, "What is Dana's locker code?", 1) == [texts[1]]
    assert bm25_top_k(texts, "Is the cat on level 3?", 2) == [texts[0], texts[2]]
    assert bm25_top_k([], "anything", 3) == []


def test_the_gate_and_kveval_rank_identically():
    from cartridges.services import gate
    from kvengine.kveval import runner

    assert gate.bm25_top_k is bm25_top_k and runner.Bm25 is Bm25  # one implementation, imported by both
    texts = [f"Person {i} lives in city {i % 7} and works as a {['baker', 'pilot', 'nurse'][i % 3]}." for i in range(40)]
    for question in ("Who works as a pilot in city 3?", "Where does person 12 live?", "nurse", "unknown words"):
        retrieved = runner.Bm25(texts).top_k(question, 5)
        assert gate.bm25_top_k(texts, question, 5) == [texts[i] for i in retrieved]


def test_documents_without_a_single_word_match_nothing():
    # bm25s cannot index an empty vocabulary (a 500 the schemathesis run found: a scope whose memories are
    # punctuation only, searched); such documents score 0 and nothing matches
    index = Bm25(["...", "!?", "  "])
    assert index.scores("6") == [0.0, 0.0, 0.0]
    assert index.ranked("6", 5) == [] and index.top_k("6", 2) == [0, 1]
    assert Bm25(["...", "the key is under the pot"]).ranked("key", 5)[0][0] == 1


def test_the_stemmed_tokens_merge_inflections_and_the_default_stays_unstemmed():
    assert bm25_tokenize("Cats were running; the cat runs") == ["cats", "were", "running", "the", "cat", "runs"]
    assert bm25_tokenize("Cats were running; the cat runs", stem=True) == ["cat", "were", "run", "the", "cat", "run"]
    assert Bm25(["my cat", "a dog"]).ranked("cats", 5) == []
    assert [index for index, _ in Bm25(["my cat", "a dog"], stem=True).ranked("cats", 5)] == [0]
