"""BM25 ranks known documents as the Okapi formula says."""
from __future__ import annotations

import math

import pytest

from kvengine.kveval.retrieval import Bm25, bm25_tokenize

DOCS = ["apple banana", "Apple apple cherry", "banana cherry durian"]


def _okapi(tf: int, df: int, num_docs: int, length: int, avg_length: float, k1: float = 1.5, b: float = 0.75) -> float:
    idf = math.log((num_docs - df + 0.5) / (df + 0.5) + 1.0)
    return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / avg_length))


def test_it_tokenizes_lowercase_words():
    assert bm25_tokenize("Apple, apple-PIE 42!") == ["apple", "apple", "pie", "42"]


def test_it_scores_each_document_by_the_okapi_formula():
    scores = Bm25(DOCS).scores("apple")
    avg = 8 / 3
    assert scores[0] == pytest.approx(_okapi(tf=1, df=2, num_docs=3, length=2, avg_length=avg))
    assert scores[1] == pytest.approx(_okapi(tf=2, df=2, num_docs=3, length=3, avg_length=avg))
    assert scores[2] == 0.0


def test_it_ranks_more_occurrences_and_rarer_terms_first():
    bm25 = Bm25(DOCS)
    assert bm25.top_k("apple", 3) == [1, 0, 2]
    # "durian" is in one document only: it outweighs the common "banana"
    assert bm25.top_k("banana durian", 2) == [2, 0]


def test_it_keeps_document_order_on_ties_and_caps_k():
    bm25 = Bm25(DOCS)
    assert bm25.top_k("zebra", 2) == [0, 1]
    assert bm25.top_k("cherry", 10) == [1, 2, 0]


def test_it_refuses_no_documents_and_a_k_below_one():
    with pytest.raises(ValueError, match="documents"):
        Bm25([])
    with pytest.raises(ValueError, match="top_k"):
        Bm25(DOCS).top_k("apple", 0)
