"""How reports name each answering mode (report.py and locomo_report.py)."""
from __future__ import annotations

MODE_LABELS = {
    "cartridge": "cartridge",
    "text": "text re-reading",
    "bm25": "BM25 top-k text",
    "dense": "dense top-k text",
    "closed_book": "no memory (floor)",
    "hybrid": "hybrid top-k text",
}
