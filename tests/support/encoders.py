"""A stand-in for the dense search encoder (no model): one dimension per concept."""
from __future__ import annotations

import numpy as np

CONCEPTS = [{"cat", "feline", "kitten", "luna"}, {"dog", "canine", "puppy"}, {"car", "vehicle", "garage"}]


class ConceptEncoder:
    """A stand-in for the dense encoder: one dimension per concept, so "feline" is near "cat" with no shared word."""

    def __init__(self):
        self.texts: list[str] = []

    def encode(self, texts):
        self.texts += list(texts)
        rows = []
        for text in texts:
            words = set(text.lower().replace(".", " ").replace(",", " ").split())
            row = np.array([len(words & c) for c in CONCEPTS] + [0.1], dtype=np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.stack(rows)
