"""kveval: the accuracy-parity and speed suite (engine only; never imports Django).

On SQuAD v1.1 dev: same questions, same model, greedy decoding, answered four ways per memory budget: from the
scope's cartridge, by re-reading the scope's text, and by re-reading the top-k paragraphs that BM25 or a dense
embedding model retrieves. On LoCoMo (``--dataset locomo``, locomo.py): whole conversations as scopes, evidence
recall@k of BM25, dense and hybrid retrieval, and answers scored per category as the paper's evaluation does.
"""
from __future__ import annotations
