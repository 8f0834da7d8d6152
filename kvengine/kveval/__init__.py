"""kveval: the accuracy-parity and speed suite on SQuAD v1.1 dev (engine only; never imports Django).

Same questions, same model, greedy decoding, answered four ways: from the scope's cartridge, by re-reading
the scope's text, and by re-reading the top-k paragraphs that BM25 or a dense embedding model retrieves.
"""
from __future__ import annotations
