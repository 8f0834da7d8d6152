"""The fake backend's "model": word tokens, the word-overlap answer, and memories stored as tensors.

An answer is the memory that shares the most content words with the question (the later one on ties), or
UNKNOWN when none does; fidelity compares those answers and their softmax over candidates. A cartridge's
tensors are the memories' UTF-8 bytes and their end offsets, so it holds only what it was compiled from.
kvengine.fake's FakeKvBackend wraps these in the KvBackend interface.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence

from .base import FidelityReport
from .conversation import Prompt, question_text
from .errors import CorruptCartridgeError, EmptyInputError
from .format import RawTensor

UNKNOWN = "I don't know"
TOKEN_RE = re.compile(r"\w+|[^\w\s]")
STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how i in is it its of on or the to was were what "
    "when where which who whom whose why with you your my me".split()
)


def tokens(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def content_words(text: str) -> set[str]:
    return {t.lower() for t in tokens(text) if t[0].isalnum() and t.lower() not in STOPWORDS}


def check_question(question: Prompt) -> str:
    question = question_text(question)
    if not isinstance(question, str) or not question.strip():
        raise EmptyInputError("`question` has to be a non-empty string")
    return question.strip()


def encode(texts: Sequence[str]) -> dict[str, RawTensor]:
    """Memories as one UTF-8 byte array plus little-endian i64 end offsets."""
    parts = [t.encode() for t in texts]
    ends, total = [], 0
    for p in parts:
        total += len(p)
        ends.append(total)
    return {
        "memories_utf8": RawTensor("U8", (total,), b"".join(parts)),
        "memory_ends": RawTensor("I64", (len(ends),), b"".join(e.to_bytes(8, "little") for e in ends)),
    }


def decode(tensors: dict[str, RawTensor]) -> list[str]:
    """Invert encode(); CorruptCartridgeError when the tensors are missing or not UTF-8."""
    try:
        raw = bytes(tensors["memories_utf8"].data)
        ends = tensors["memory_ends"]
        bounds = struct.unpack(f"<{ends.shape[0]}q", bytes(ends.data))
        texts, begin = [], 0
        for end in bounds:
            texts.append(raw[begin:end].decode("utf-8"))
            begin = end
    except (KeyError, UnicodeDecodeError, struct.error):
        raise CorruptCartridgeError("fake cartridge payload lacks its memory tensors or is not UTF-8") from None
    return texts


def overlaps(texts: Sequence[str], question: str) -> list[int]:
    words = content_words(question)
    return [len(words & content_words(t)) for t in texts]


def best_memory(texts: Sequence[str], question: str) -> str:
    """The memory with the most shared content words (the later one on ties: newer facts win)."""
    scores = overlaps(texts, question)
    best = max(range(len(texts)), key=lambda i: (scores[i], i))
    return texts[best] if scores[best] > 0 else UNKNOWN


def distribution(texts: Sequence[str], question: str) -> dict[str, float]:
    """Softmax over candidate answers (each memory by content, plus UNKNOWN at score 0.5)."""
    cands: dict[str, float] = {UNKNOWN: 0.5}
    for t, s in zip(texts, overlaps(texts, question), strict=True):
        cands[t] = max(cands.get(t, float("-inf")), float(s))
    m = max(cands.values())
    exp = {k: math.exp(v - m) for k, v in cands.items()}
    z = sum(exp.values())
    return {k: v / z for k, v in exp.items()}


def first_token(text: str) -> str:
    toks = tokens(text)
    return toks[0] if toks else ""


def compare(cartridge_texts: Sequence[str], texts: Sequence[str], probes: Sequence[str], max_new_tokens: int | None) -> FidelityReport:
    """fidelity()'s comparison of answering from ``cartridge_texts`` with re-reading ``texts``."""
    kls, top1, same = [], 0, 0
    for probe in probes:
        question = check_question(probe)
        p_text, p_cart = distribution(texts, question), distribution(cartridge_texts, question)
        keys = set(p_text) | set(p_cart)
        eps = 1e-12  # a memory missing from one side gets ~0 probability, giving a large but finite KL
        kls.append(sum(pt * math.log(pt / max(p_cart.get(k, 0.0), eps)) for k in keys if (pt := p_text.get(k, 0.0)) > 0))
        a_text, a_cart = best_memory(texts, question), best_memory(cartridge_texts, question)
        top1 += first_token(a_text) == first_token(a_cart)
        if max_new_tokens is not None:
            a_text, a_cart = tokens(a_text)[:max_new_tokens], tokens(a_cart)[:max_new_tokens]
        same += a_text == a_cart
    return FidelityReport.of_probes(kls, num_top1=top1, num_identical=same)
