"""FakeKvBackend: a deterministic, torch-free stand-in for Django tests that need no model.

It is honest: a cartridge holds only what it was compiled from (the memories' word tokens, stored as
uint8 UTF-8 arrays in the same safetensors cartridge format), and an answer is the compiled memory that
shares the most content words with the question, or "I don't know" when none does. So a cartridge
compiled without a memory cannot answer about it.

Thread safety: the backend holds no mutable state; cartridges are read-only after compile/loads. Safe to
share both between threads.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import re
import struct
import time
from collections.abc import Iterator, Sequence

from .base import Answer, BackendDescription, Cartridge, CartridgeHeader, FidelityReport, KvBackend, canonical_json
from .config import DTYPES, QUANTS, check_choice
from .errors import ConfigError, ContextTooLongError, CorruptCartridgeError, EmptyInputError
from .format import FORMAT_VERSION, RawTensor, check_compatible, read_cartridge, tensors_sha256, write_cartridge

UNKNOWN = "I don't know"
TEMPLATE = "fake-template-v1: system=<memories, one per line> user=<question>"
# Prompt scaffolding tokens a real chat template adds around the memories (keeps token counts realistic).
SCAFFOLD_TOKENS = 4
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how i in is it its of on or the to was were what "
    "when where which who whom whose why with you your my me".split()
)


def _tokens(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def _content_words(text: str) -> set[str]:
    return {t.lower() for t in _tokens(text) if t[0].isalnum() and t.lower() not in _STOPWORDS}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class FakeKvBackend(KvBackend):
    """A word-overlap "model": deterministic, fast, torch-free; same header and file format as the real one."""

    def __init__(
        self,
        model: str = "fake-model",
        dtype: str = "f32",
        quant: str = "none",
        device: str = "cpu",  # accepted for make_backend symmetry; the fake always runs in-process
        cache_dir: str | None = None,  # accepted and ignored: the fake has no weights
        max_context_tokens: int = 8192,  # same window as the default real model so over-context tests mean the same
    ):
        check_choice("dtype", dtype, DTYPES)
        check_choice("quant", quant, QUANTS)
        if not model:
            raise ConfigError("`model` has to be a non-empty string")
        self.model = model
        self.dtype = dtype
        self.quant = quant
        self.max_context_tokens = int(max_context_tokens)
        self._description = BackendDescription(
            backend="fake",
            model_id=model,
            weights_fingerprint=_sha(f"fake-weights:{model}"),
            tokenizer_fingerprint=_sha("fake-tokenizer:" + _TOKEN_RE.pattern),
            template_fingerprint=_sha(TEMPLATE),
            rope_config=canonical_json({"type": "none", "theta": None, "scaling": None}),
            dtype=dtype,
            quant=quant,
            device="cpu",
            max_context_tokens=self.max_context_tokens,
        )

    def variant(self, *, dtype: str | None = None, quant: str | None = None) -> FakeKvBackend:
        """The same fake in another dtype and/or quant (there are no weights to share; it is as cheap as a new one)."""
        other = copy.copy(self)
        other.dtype = check_choice("dtype", dtype or self.dtype, DTYPES)
        other.quant = check_choice("quant", quant or self.quant, QUANTS)
        other._description = dataclasses.replace(self._description, dtype=other.dtype, quant=other.quant)
        return other

    # -- contract ---------------------------------------------------------------------------------
    def describe(self) -> BackendDescription:
        """Say what this fake is."""
        return self._description

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Count word/punctuation tokens of the memories plus fixed scaffolding."""
        return SCAFFOLD_TOKENS + sum(len(_tokens(t)) + 1 for t in texts)

    def compile(self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None) -> Cartridge:
        """Compile memories into a cartridge holding their UTF-8 bytes and boundaries."""
        texts = self._check_texts(texts)
        labels = _check_labels(labels)
        tensors = _encode(texts)
        header = CartridgeHeader(
            format_version=FORMAT_VERSION,
            **self._description.compat_key(),
            num_tokens=self.count_tokens(texts),
            log_head=int(log_head),
            payload_sha256=tensors_sha256(tensors),
            labels=labels,
        )
        return Cartridge(header=header, payload=tuple(texts))

    def answer(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32) -> Answer:
        """Answer from the cartridge's compiled memories only."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        question = _check_question(question)
        text = _best(cartridge.payload, question)
        return self._answer(text, "cartridge", cartridge.header.num_tokens, len(_tokens(question)), start, max_new_tokens)

    def answer_stream(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32) -> Iterator[str | Answer]:
        """answer(), its text yielded a word at a time (each word with the space before it), then the Answer."""
        answer = self.answer(cartridge, question, max_new_tokens=max_new_tokens)
        for match in re.finditer(r"\s*\S+", answer.text):
            yield match.group(0)
        yield answer

    def answer_from_text(self, texts: Sequence[str], question: str, *, max_new_tokens: int = 32) -> Answer:
        """Answer by re-reading the memories (same logic, no cartridge)."""
        start = time.perf_counter()
        texts = self._check_texts(texts)
        question = _check_question(question)
        text = _best(texts, question)
        num_context = self.count_tokens(texts)
        return self._answer(text, "text", num_context, num_context + len(_tokens(question)), start, max_new_tokens)

    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], probes: Sequence[str], *, max_new_tokens: int | None = None
    ) -> FidelityReport:
        """Compare the candidate distributions (softmax over overlap scores) of both ways of asking.

        Answers are compared whole, or on their first ``max_new_tokens`` tokens when given (as answer() cuts them).
        """
        check_compatible(cartridge.header, self._description)
        texts = self._check_texts(texts)
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        kls, top1, same = [], 0, 0
        for probe in probes:
            question = _check_question(probe)
            p_text, p_cart = _distribution(texts, question), _distribution(cartridge.payload, question)
            keys = set(p_text) | set(p_cart)
            eps = 1e-12  # a memory missing from one side gets ~0 probability, giving a large but finite KL
            kls.append(sum(pt * math.log(pt / max(p_cart.get(k, 0.0), eps)) for k in keys if (pt := p_text.get(k, 0.0)) > 0))
            a_text, a_cart = _best(texts, question), _best(cartridge.payload, question)
            top1 += _first_token(a_text) == _first_token(a_cart)
            if max_new_tokens is not None:
                a_text, a_cart = _tokens(a_text)[:max_new_tokens], _tokens(a_cart)[:max_new_tokens]
            same += a_text == a_cart
        return FidelityReport.of_probes(kls, num_top1=top1, num_identical=same)

    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format."""
        check_compatible(cartridge.header, self._description)
        return write_cartridge(cartridge.header, _encode(cartridge.payload))

    def loads(self, data: bytes) -> Cartridge:
        """Deserialize, verify sha256 and the compatibility key."""
        header, tensors = read_cartridge(data)
        check_compatible(header, self._description)
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
        return Cartridge(header=header, payload=tuple(texts))

    # -- helpers ----------------------------------------------------------------------------------
    def _check_texts(self, texts: Sequence[str]) -> list[str]:
        if isinstance(texts, str):
            raise EmptyInputError("`texts` has to be a list of memory strings, not one string")
        texts = [t for t in texts if isinstance(t, str) and t.strip()]
        if not texts:
            raise EmptyInputError("`texts` has to hold at least one non-empty memory but got none")
        num = self.count_tokens(texts)
        if num > self.max_context_tokens:
            raise ContextTooLongError(num_tokens=num, limit=self.max_context_tokens)
        return texts

    def _answer(self, text: str, mode: str, num_context: int, num_prompt: int, start: float, max_new_tokens: int) -> Answer:
        toks = _tokens(text)[: max(1, int(max_new_tokens))]
        text = " ".join(toks) if len(toks) < len(_tokens(text)) else text
        ids = tuple(int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in toks)
        elapsed = time.perf_counter() - start
        return Answer(text=text, token_ids=ids, mode=mode, num_context_tokens=num_context, num_prompt_tokens=num_prompt, ttft_s=elapsed, total_s=elapsed)


def _check_question(question: str) -> str:
    if not isinstance(question, str) or not question.strip():
        raise EmptyInputError("`question` has to be a non-empty string")
    return question.strip()


def _check_labels(labels: dict[str, str] | None) -> dict[str, str]:
    labels = dict(labels or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError("`labels` has to map strings to strings")
    return labels


def _encode(texts: Sequence[str]) -> dict[str, RawTensor]:
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


def _scores(texts: Sequence[str], question: str) -> list[int]:
    words = _content_words(question)
    return [len(words & _content_words(t)) for t in texts]


def _best(texts: Sequence[str], question: str) -> str:
    """The memory with the most shared content words (the later one on ties: newer facts win)."""
    scores = _scores(texts, question)
    best = max(range(len(texts)), key=lambda i: (scores[i], i))
    return texts[best] if scores[best] > 0 else UNKNOWN


def _distribution(texts: Sequence[str], question: str) -> dict[str, float]:
    """Softmax over candidate answers (each memory by content, plus UNKNOWN at score 0.5)."""
    cands: dict[str, float] = {UNKNOWN: 0.5}
    for t, s in zip(texts, _scores(texts, question), strict=True):
        cands[t] = max(cands.get(t, float("-inf")), float(s))
    m = max(cands.values())
    exp = {k: math.exp(v - m) for k, v in cands.items()}
    z = sum(exp.values())
    return {k: v / z for k, v in exp.items()}


def _first_token(text: str) -> str:
    toks = _tokens(text)
    return toks[0] if toks else ""
