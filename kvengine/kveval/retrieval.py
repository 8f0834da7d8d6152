"""Top-k retrieval baselines: BM25 (kvengine.retrieval, shared with the gate), dense all-MiniLM-L6-v2, and both
fused by reciprocal rank (hybrid).

Each returns the top k in memory order (kvengine.retrieval.top_k_indices), so the retrieved memories are
re-read in the order the scope holds them; ``ranking`` gives the full order, best first, for recall@k.
"""
from __future__ import annotations

from collections.abc import Sequence

# the fusion and the encoder are the product's hybrid search's too (memories.selectors): one of each
from kvengine.retrieval import RRF_K, Bm25, DenseEncoder, dense_model_path, rrf_fuse, top_k_indices

__all__ = ["RETRIEVERS", "RRF_K", "DenseEncoder", "DenseIndex", "HybridIndex", "Retrievers", "dense_model_path",
           "ranking", "rrf_fuse"]

RETRIEVERS = ("bm25", "dense", "hybrid")


def ranking(scores: Sequence[float]) -> list[int]:
    """Every index, best score first; equal scores keep index (log) order."""
    return sorted(range(len(scores)), key=lambda index: (-scores[index], index))


class DenseIndex:
    """Cosine-similarity top-k over a fixed list of documents, embedded once."""

    def __init__(self, encoder: DenseEncoder, documents: Sequence[str]):
        if not documents:
            raise ValueError("`documents` has to hold at least one document but got none")
        self.encoder = encoder
        self.doc_embeddings = encoder.encode(documents)  # [num_docs, dim], unit rows

    def scores(self, query: str) -> list[float]:
        """Cosine similarity of ``query`` to every document, in document order."""
        query_embedding = self.encoder.encode([query])[0]  # [dim]
        return [float(x) for x in self.doc_embeddings @ query_embedding]

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` most similar documents, in document order."""
        return top_k_indices(self.scores(query), k)


class HybridIndex:
    """BM25 and dense rankings of the same documents fused by reciprocal rank (``rrf_fuse``)."""

    def __init__(self, bm25: Bm25, dense: DenseIndex, *, k: int = RRF_K):
        if bm25.num_documents != len(dense.doc_embeddings):
            raise ValueError(f"`bm25` and `dense` have to index the same documents but hold "
                             f"{bm25.num_documents} and {len(dense.doc_embeddings)}")
        self.bm25 = bm25
        self.dense = dense
        self.k = k

    def ranking(self, query: str) -> list[int]:
        """Every document, best fused rank first."""
        return rrf_fuse([ranking(self.bm25.scores(query)), ranking(self.dense.scores(query))], k=self.k)

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best fused documents, in document order."""
        if k < 1:
            raise ValueError(f"`k` has to be at least 1 but got {k}")
        return sorted(self.ranking(query)[:k])


class Retrievers:
    """The BM25, dense and hybrid indexes of one list of documents, built on first use."""

    def __init__(self, documents: Sequence[str], encoder: DenseEncoder | None):
        self.documents = list(documents)
        self.encoder = encoder
        self._bm25: Bm25 | None = None
        self._dense: DenseIndex | None = None

    def bm25(self) -> Bm25:
        if self._bm25 is None:
            self._bm25 = Bm25(self.documents)
        return self._bm25

    def dense(self) -> DenseIndex:
        if self._dense is None:
            if self.encoder is None:
                raise ValueError("dense and hybrid retrieval need a DenseEncoder but got none")
            self._dense = DenseIndex(self.encoder, self.documents)
        return self._dense

    def ranking(self, name: str, query: str) -> list[int]:
        """Every document, best first, by the retriever ``name`` (one of RETRIEVERS)."""
        if name == "bm25":
            return ranking(self.bm25().scores(query))
        if name == "dense":
            return ranking(self.dense().scores(query))
        if name == "hybrid":
            return HybridIndex(self.bm25(), self.dense()).ranking(query)
        raise ValueError(f"`retriever` has to be one of {list(RETRIEVERS)} but got {name!r}")
