"""Reciprocal rank fusion and the hybrid (BM25 + dense) retriever."""
from __future__ import annotations

import pytest

from kvengine.kveval.retrieval import RRF_K, DenseEncoder, DenseIndex, HybridIndex, Retrievers, ranking, rrf_fuse
from kvengine.retrieval import Bm25


def test_ranking_puts_the_best_score_first_and_ties_in_log_order():
    assert ranking([0.1, 0.9, 0.1, 0.5]) == [1, 3, 0, 2]


def test_rrf_sums_reciprocal_ranks_with_k_60():
    assert RRF_K == 60
    # 3: 1/61; 1: 1/62 + 1/61; 0: 1/62
    assert rrf_fuse([[3, 1], [1, 0]]) == [1, 3, 0]
    # 1 has 2/62 = 0.032258; 0 and 2 have 1/61 + 1/63 = 0.032266 each (tied: log order)
    assert rrf_fuse([[0, 1, 2], [2, 1, 0]]) == [0, 2, 1]
    # with k = 0 one list's first place outweighs the other's second and third places
    assert rrf_fuse([[0, 1, 2], [2, 1, 0]], k=0) == [0, 2, 1]
    assert rrf_fuse([[5, 1, 2], [1, 2, 5]], k=0) == [1, 5, 2]  # 1: 1/2 + 1; 5: 1 + 1/3; 2: 1/3 + 1/2


def test_rrf_refuses_a_negative_k():
    with pytest.raises(ValueError, match="`k`"):
        rrf_fuse([[0]], k=-1)


DOCS = ["[1 May] Ann: I adopted a puppy named Rex.", "[2 May] Bo: I went hiking in the Alps.",
        "[3 May] Bo: I started painting sunsets.", "[4 May] Ann: My sister visits in July.",
        "[5 May] Ann: The dog learned to sit."]


@pytest.fixture(scope="module")
def encoder():
    return DenseEncoder()


def test_hybrid_fuses_the_bm25_and_dense_rankings(encoder):
    bm25, dense = Bm25(DOCS), DenseIndex(encoder, DOCS)
    hybrid = HybridIndex(bm25, dense)
    query = "What is the name of Ann's dog?"
    expected = rrf_fuse([ranking(bm25.scores(query)), ranking(dense.scores(query))])
    assert hybrid.ranking(query) == expected
    assert hybrid.top_k(query, 2) == sorted(expected[:2])  # the top k, re-read in log order
    assert Retrievers(DOCS, encoder).ranking("hybrid", query) == expected
    assert Retrievers(DOCS, encoder).ranking("dense", query)[0] in (0, 4)  # the dog turns, not hiking or painting


def test_retrievers_refuse_an_unknown_name_and_dense_without_an_encoder():
    with pytest.raises(ValueError, match="`retriever`.*'tfidf'"):
        Retrievers(DOCS, None).ranking("tfidf", "dog")
    with pytest.raises(ValueError, match="DenseEncoder"):
        Retrievers(DOCS, None).ranking("hybrid", "dog")
    assert Retrievers(DOCS, None).ranking("bm25", "painting")[0] == 2
