"""Answer normalization: the official SQuAD v1.1 one, shared by kveval's EM/F1 and the gate's answer check.

One normalization, so kveval's figures and the gate's accuracy count the same answers as right.
"""
from __future__ import annotations

import re
import string
from collections.abc import Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, and collapse whitespace (as the official script)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_correct(answer: str, expected: Sequence[str]) -> bool:
    """Whether any expected answer appears, normalized, on word boundaries in the normalized ``answer``."""
    got = f" {normalize_answer(answer)} "
    return any((want := normalize_answer(item)) and f" {want} " in got for item in expected)
