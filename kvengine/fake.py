"""FakeKvBackend: a deterministic, torch-free stand-in for Django tests that need no model.

It is honest: a cartridge holds only what it was compiled from (the memories' word tokens, stored as
uint8 UTF-8 arrays in the same safetensors cartridge format), and an answer is the compiled memory that
shares the most content words with the question, or "I don't know" when none does. So a cartridge
compiled without a memory cannot answer about it. The word-overlap "model" itself is kvengine.fake_model.

Thread safety: the backend holds no mutable state; cartridges are read-only after compile/loads. Safe to
share both between threads.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import time
from collections.abc import Container, Iterator, Sequence

from . import fake_model as words
from .base import (
    Answer,
    BackendDescription,
    Cartridge,
    CartridgeHeader,
    ExtensionCheck,
    FidelityReport,
    KvBackend,
    canonical_json,
)
from .blocks import BlockLookup, CartridgeParts, TrustedPart, block_id, key_digest, parts_write
from .config import DTYPES, QUANTS, check_choice
from .conversation import Prompt
from .decoding import GREEDY, Decoding, StopWatcher
from .divergence import AnswerDivergence
from .errors import ConfigError, ContextTooLongError, CorruptCartridgeError, EmptyInputError
from .fake_model import UNKNOWN  # noqa: F401 - the fake's "no answer", which tests compare with
from .format import (
    FORMAT_VERSION,
    BlockRef,
    RawTensor,
    blocks_to_json,
    check_compatible,
    header_blocks,
    join_tensors,
    merkle_sha256,
    read_block_part,
    read_cartridge,
    read_tail_part,
    split_tensors,
    tensor_digest,
    write_cartridge,
)

TEMPLATE = "fake-template-v1: system=<memories, one per line> user=<question>"
# Prompt scaffolding tokens a real chat template adds around the memories (keeps token counts realistic).
SCAFFOLD_TOKENS = 4
FAKE_BLOCK_MEMORIES = 4  # memories per block (the fake's positions count memories)


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
            tokenizer_fingerprint=_sha("fake-tokenizer:" + words.TOKEN_RE.pattern),
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
        return SCAFFOLD_TOKENS + sum(len(words.tokens(t)) + 1 for t in texts)

    def compile(
        self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None, blocks: BlockLookup | None = None,
        block_secret: bytes = b"",
    ) -> Cartridge:
        """Compile memories into a cartridge holding their UTF-8 bytes, in blocks of FAKE_BLOCK_MEMORIES memories.

        The fake's positions count memories, not tokens: block i holds memories [4i, 4i + 4), chained by their
        UTF-8 bytes; the tail holds the rest (at least one memory). ``blocks`` is used like the real backend
        uses it: the longest run of stored blocks from block 0 is reused (verified), the rest rebuilt.
        """
        started = time.perf_counter()
        texts = self._check_texts(texts)
        labels = _check_labels(labels)
        compat = self._description.compat_key()
        size = FAKE_BLOCK_MEMORIES
        num_blocks = (len(texts) - 1) // size
        key = key_digest(compat)
        refs, parent, reused = [], "", 0
        for index in range(num_blocks):
            chunk = texts[index * size : (index + 1) * size]
            parent = block_id(
                parent=parent, key=key, block_size=size, first_position=index * size, token_ids=list("\n".join(chunk).encode()),
                secret=block_secret,
            )
            tensors = words.encode(chunk)
            data = blocks(parent) if blocks is not None and reused == index else None
            if data is not None:
                trusted = isinstance(data, TrustedPart)
                ref, stored = read_block_part(
                    data.data if trusted else data, block_id=parent, first_position=index * size, num_tokens=size, compat_key=compat,
                    digest_checked=trusted,
                )
                if words.decode(stored) != chunk:
                    raise CorruptCartridgeError(f"block {parent[:12]} does not hold the memories its id names")
                reused += 1
            else:
                ref = BlockRef(parent, index * size, size, tensor_digest(tensors))
            refs.append(ref)
        tail = words.encode(texts[num_blocks * size :])
        header = CartridgeHeader(
            format_version=FORMAT_VERSION,
            **compat,
            num_tokens=self.count_tokens(texts),
            log_head=int(log_head),
            payload_sha256=merkle_sha256([ref.sha256 for ref in refs], tail),
            labels=labels,
            block_size=size,
            blocks=blocks_to_json(refs),
        )
        elapsed = round(time.perf_counter() - started, 4)
        stats = {"blocks_reused": reused, "blocks_computed": num_blocks - reused, "tail_tokens": len(texts) - num_blocks * size,
                 "computed_tokens": len(texts) - reused * size, "compute_s": elapsed, "total_s": elapsed,
                 "memory_positions": list(range(len(texts)))}
        return Cartridge(header=header, payload=tuple(texts), stats=stats)

    def answer(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32, decoding: Decoding | None = None) -> Answer:
        """Answer from the cartridge's compiled memories only (a conversation: its last question; ``decoding``: only
        its stop strings apply, the fake does not sample)."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        question = words.check_question(question)
        text = words.best_memory(cartridge.payload, question)
        return self._answer(text, "cartridge", cartridge.header.num_tokens, len(words.tokens(question)), start, max_new_tokens, decoding)

    def answer_stream(self, cartridge: Cartridge, question: Prompt, *, max_new_tokens: int = 32,
                      decoding: Decoding | None = None) -> Iterator[str | Answer]:
        """answer(), its text yielded a word at a time (each word with the space before it), then the Answer."""
        answer = self.answer(cartridge, question, max_new_tokens=max_new_tokens, decoding=decoding)
        for match in re.finditer(r"\s*\S+", answer.text):
            yield match.group(0)
        yield answer

    def answer_choices(self, cartridge: Cartridge, question: Prompt, *, num_choices: int, max_new_tokens: int = 32,
                       decoding: Decoding | None = None) -> list[Answer]:
        """answer() per choice, under each choice's decoding (the fake does not sample: the choices are alike)."""
        decoding = decoding or GREEDY
        return [self.answer(cartridge, question, max_new_tokens=max_new_tokens, decoding=decoding.for_choice(i))
                for i in range(num_choices)]

    def answer_from_text(self, texts: Sequence[str], question: Prompt, *, max_new_tokens: int = 32,
                         decoding: Decoding | None = None) -> Answer:
        """Answer by re-reading the memories (same logic, no cartridge)."""
        start = time.perf_counter()
        texts = self._check_texts(texts)
        question = words.check_question(question)
        text = words.best_memory(texts, question)
        num_context = self.count_tokens(texts)
        return self._answer(text, "text", num_context, num_context + len(words.tokens(question)), start, max_new_tokens, decoding)

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
        return words.compare(cartridge.payload, texts, probes, max_new_tokens)

    def verify_extension(
        self,
        cartridge: Cartridge,
        texts: Sequence[str],
        probes: Sequence[str],
        *,
        num_verified_blocks: int,
        max_new_tokens: int | None = None,
        questions: Sequence[str] = (),
        answer_max_new_tokens: int = 32,
        block_secret: bytes = b"",
    ) -> ExtensionCheck:
        """The fake's re-reading of the new part: the verified blocks' memories from the cartridge, then the new
        memories from ``texts``; the "KV difference" is 0.0 when the cartridge's new memories are the texts', else 1.0."""
        started = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        texts = self._check_texts(texts)
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        header = cartridge.header
        refs = header_blocks(header)
        if isinstance(num_verified_blocks, bool) or not isinstance(num_verified_blocks, int) or not 0 <= num_verified_blocks <= len(refs):
            raise ConfigError(f"`num_verified_blocks` has to be an integer from 0 to {len(refs)} but got {num_verified_blocks!r}")
        size = header.block_size
        expected = self._chain(texts, block_secret)
        chain_matches = [ref.block_id for ref in refs] == expected and header.num_tokens == self.count_tokens(texts)
        begin = num_verified_blocks * size
        held = list(cartridge.payload)
        reread = held[:begin] + texts[begin:]  # the verified memories as the cartridge holds them, the new ones re-read
        max_abs_diff = 0.0 if held[begin:] == texts[begin:] else 1.0
        reread_s = time.perf_counter() - started
        fidelity = words.compare(held, reread, probes, max_new_tokens)
        answers = tuple(
            (self.answer(cartridge, q, max_new_tokens=answer_max_new_tokens), self.answer_from_text(reread, q, max_new_tokens=answer_max_new_tokens))
            for q in questions
        )
        return ExtensionCheck(
            num_verified_blocks=num_verified_blocks, num_verified_tokens=begin, num_new_tokens=len(texts) - begin,
            chain_matches=chain_matches, max_abs_diff=max_abs_diff, fidelity=fidelity, answers=answers,
            reread_s=reread_s, probe_s=time.perf_counter() - started - reread_s,
        )

    def _chain(self, texts: list[str], secret: bytes) -> list[str]:
        """The block ids compile() gives ``texts`` (the fake's blocks are FAKE_BLOCK_MEMORIES memories)."""
        size, key, parent, ids = FAKE_BLOCK_MEMORIES, key_digest(self._description.compat_key()), "", []
        for index in range((len(texts) - 1) // size):
            chunk = texts[index * size : (index + 1) * size]
            parent = block_id(
                parent=parent, key=key, block_size=size, first_position=index * size, token_ids=list("\n".join(chunk).encode()), secret=secret
            )
            ids.append(parent)
        return ids


    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format."""
        check_compatible(cartridge.header, self._description)
        blocks, tail = self._parts(cartridge)
        return write_cartridge(cartridge.header, join_tensors(blocks, tail))

    def dump_parts(self, cartridge: Cartridge, *, stored: Container[BlockRef] = ()) -> CartridgeParts:
        """Serialize by parts: one part per block of memories and the tail part (``stored``: base.py)."""
        check_compatible(cartridge.header, self._description)
        blocks, tail = self._parts(cartridge)
        return parts_write(cartridge.header, header_blocks(cartridge.header), [*blocks, tail].__getitem__, stored=stored)

    def loads(self, data: bytes) -> Cartridge:
        """Deserialize, verify sha256 and the compatibility key."""
        header, tensors = read_cartridge(data)
        check_compatible(header, self._description)
        blocks, tail = split_tensors(tensors, len(header_blocks(header)))
        return Cartridge(header=header, payload=tuple(text for part in [*blocks, tail] for text in words.decode(part)))

    def load_parts(self, tail: bytes | memoryview, blocks: BlockLookup) -> Cartridge:
        """Load a cartridge stored by parts (every part verified)."""
        header, refs, tail_tensors = read_tail_part(tail)
        check_compatible(header, self._description)
        compat = self._description.compat_key()
        texts: list[str] = []
        for ref in refs:
            data = blocks(ref.block_id)
            if data is None:
                raise CorruptCartridgeError(f"block {ref.block_id[:12]} of the cartridge is not stored; it cannot be loaded")
            _, tensors = read_block_part(
                data, block_id=ref.block_id, first_position=ref.first_position, num_tokens=ref.num_tokens, compat_key=compat, sha256=ref.sha256
            )
            texts.extend(words.decode(tensors))
        return Cartridge(header=header, payload=tuple([*texts, *words.decode(tail_tensors)]))

    def _parts(self, cartridge: Cartridge) -> tuple[list[dict[str, RawTensor]], dict[str, RawTensor]]:
        texts, size = list(cartridge.payload), cartridge.header.block_size
        num_blocks = len(header_blocks(cartridge.header))
        return [words.encode(texts[i * size : (i + 1) * size]) for i in range(num_blocks)], words.encode(texts[num_blocks * size :])

    # -- helpers ----------------------------------------------------------------------------------
    # -- routed: one "chunk" per memory (its text), answered from the chunks given ----------------------
    def compile_chunk(self, text: str) -> FakeChunk:
        """A memory's chunk: its text and token ids (the fake has no KV)."""
        if not isinstance(text, str) or not text.strip():
            raise EmptyInputError("`text` has to be a non-empty memory string")
        tokens = words.tokens(text) + ["\n"]
        return FakeChunk(text=text, token_ids=tuple(int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in tokens))

    def chunk_dumps(self, chunk: FakeChunk, *, quant: str = "q8") -> bytes:
        """The chunk's bytes: a magic, then its text (``quant`` is accepted and recorded as the real format does)."""
        check_choice("quant", quant, ("none", "q8"))
        return b"fake-chunk-v1|" + quant.encode() + b"|" + chunk.text.encode()

    def chunk_loads(self, data: bytes) -> FakeChunk:
        """A chunk back from chunk_dumps' bytes; CorruptCartridgeError when they are not one."""
        magic, _, rest = bytes(data).partition(b"|")
        quant, _, text = rest.partition(b"|")
        if magic != b"fake-chunk-v1" or quant not in (b"none", b"q8"):
            raise CorruptCartridgeError("not a fake memory chunk")
        return self.compile_chunk(text.decode())

    def answer_routed(
        self, chunks: Sequence[FakeChunk], question: str, *, repair: object = None, max_new_tokens: int = 32, stop_at_eos: bool = True,
    ) -> Answer:
        """Answer from the chunks' memories only (as answer_from_text would from their texts, with no window check)."""
        start = time.perf_counter()
        texts = [chunk.text for chunk in chunks]
        if not texts:
            raise EmptyInputError("`chunks` has to hold at least one chunk but got none")
        question = words.check_question(question)
        num_context = sum(chunk.num_tokens for chunk in chunks)
        return self._answer(words.best_memory(texts, question), "routed", num_context, num_context + len(words.tokens(question)), start, max_new_tokens)

    def answer_reread(self, chunks: Sequence[FakeChunk], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """The routed answer's reference: the same, re-read (the fake's routed answer is exact)."""
        return dataclasses.replace(self.answer_routed(chunks, question, max_new_tokens=max_new_tokens), mode="text")

    def routed_divergence(
        self, chunks: Sequence[FakeChunk], question: str, *, repair: object = None, max_new_tokens: int = 32, reference: Answer | None = None,
    ) -> AnswerDivergence:
        """The fake's routed answer is its re-reading: no divergence at any position of the reference's answer."""
        reference = reference or self.answer_reread(chunks, question, max_new_tokens=max_new_tokens)
        n = len(reference.token_ids)
        return AnswerDivergence(kls=[0.0] * n, top1=[True] * n, identical=True)

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

    def _answer(self, text: str, mode: str, num_context: int, num_prompt: int, start: float, max_new_tokens: int,
                decoding: Decoding | None = None) -> Answer:
        toks = words.tokens(text)[: max(1, int(max_new_tokens))]
        cut = len(toks) < len(words.tokens(text))
        text = " ".join(toks) if cut else text
        watcher = StopWatcher(decoding.stop if decoding else ())
        watcher.feed(text)
        if watcher.hit:
            text, cut = watcher.text.strip(), False
        ids = tuple(int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in toks)
        elapsed = time.perf_counter() - start
        return Answer(text=text, token_ids=ids, mode=mode, num_context_tokens=num_context, num_prompt_tokens=num_prompt, ttft_s=elapsed,
                      total_s=elapsed, finish_reason="length" if cut else "stop")


@dataclasses.dataclass(frozen=True)
class FakeChunk:
    """The fake's memory chunk: the memory's text and its token ids (the separator's last)."""

    text: str
    token_ids: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def _check_labels(labels: dict[str, str] | None) -> dict[str, str]:
    labels = dict(labels or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ConfigError("`labels` has to map strings to strings")
    return labels
