"""Memory chunks: one memory's KV computed once, on its own, after the shared prefix P.

P is the token ids of the chat template's system-turn opener followed by SYSTEM_PREAMBLE (layout.py): what
every prefix cartridge and every re-reading starts with, so a chunk sees exactly the context the first
memory of a prompt sees. A chunk's tokens are the memory's text (cleaned as the layout cleans it) followed
by the separator the layout joins memories with ("\\n"); concatenating chunks therefore gives the ids of the
memories joined as the prompt joins them, except that the last memory of a prompt has no separator after it
(the assembly drops the last chunk's separator, assembly.py). That only holds where the tokenizer never
merges across the separator; ``check_chunk_ids`` verifies it for given memories (byte-level BPE keeps "\\n"
a token of its own between non-space characters). The re-reading reference (answering.py) feeds exactly the
assembled ids, so the comparison is of two computations over the same tokens either way.

A chunk keeps only its own K/V: keys after RoPE at positions |P| .. |P| + n - 1 (assembly.py moves them).
"""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..errors import EmptyInputError, KvError
from ..layout import SYSTEM_PREAMBLE, PromptLayout
from .host import RoutedHost

SEPARATOR = "\n"  # the layout's join between memories (PromptLayout.prefix_text)
_SENTINEL = "\x00mnesio-memories\x00"  # marks where the memories go in the rendered system turn; never tokenized
_PREFIXES_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class SharedPrefix:
    """P's token ids and KV. ``keys``/``values``: ``[num_layers][num_kv_heads, num_tokens, head_dim]``."""

    token_ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def sha256(self) -> str:
        """Digest of P's token ids: a chunk compiled after another P must not be assembled after this one."""
        return prefix_digest(self.token_ids)


@dataclass(frozen=True, eq=False)
class MemoryChunk:
    """One memory's KV, compiled after P.

    ``keys``/``values``: ``[num_layers][num_kv_heads, num_tokens, head_dim]``; keys after RoPE at positions
    ``first_position .. first_position + num_tokens - 1``. ``token_ids`` ends with the separator's
    ``num_separator_tokens`` ids. Never written after compile: an assembly copies it (assembly.py).
    """

    token_ids: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    first_position: int
    prefix_sha256: str
    num_separator_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def nbytes(self) -> int:
        """Bytes of the K/V tensors as held in memory."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def prefix_digest(token_ids: tuple[int, ...] | list[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in token_ids).encode()).hexdigest()


# -- token ids ---------------------------------------------------------------------------------------
def shared_prefix_text(layout: PromptLayout) -> str:
    """P's text: the system-turn opener and SYSTEM_PREAMBLE (just the preamble for a model without a template)."""
    if not layout.template:
        return SYSTEM_PREAMBLE
    rendered = layout.tokenizer.apply_chat_template([{"role": "system", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False)
    opener, found, _ = rendered.partition(_SENTINEL)
    if not found:
        raise KvError("this model's chat template transforms the system turn: it has no shared prefix for memory chunks")
    return opener + SYSTEM_PREAMBLE


def chunk_token_ids(layout: PromptLayout, text: str) -> tuple[list[int], int]:
    """A memory's chunk ids (its cleaned text, then the separator) and the separator's token count."""
    cleaned = layout.clean(text) if isinstance(text, str) else ""
    if not cleaned:
        raise EmptyInputError("`text` has to be a non-empty memory string")
    separator = layout.encode(SEPARATOR)
    return layout.encode(cleaned) + separator, len(separator)


def tail_token_ids(layout: PromptLayout, question: str) -> list[int]:
    """The ids after the last memory: the end of the system turn, the user turn with ``question``, the generation prompt."""
    return layout.encode(layout.closing_text()) + layout.encode(layout.suffix_text(layout.clean_question(question)))


def check_chunk_ids(layout: PromptLayout, texts: list[str], question: str) -> bool:
    """Whether P + the chunks' ids (the last without its separator) + the tail is exactly the layout's whole prompt."""
    ids = layout.encode(shared_prefix_text(layout))
    pieces = [chunk_token_ids(layout, text) for text in texts]
    for index, (chunk, num_sep) in enumerate(pieces):
        ids += chunk[:-num_sep] if index == len(pieces) - 1 else chunk
    ids += tail_token_ids(layout, question)
    return ids == layout.encode(layout.full_text(layout.clean_memories(texts), layout.clean_question(question)))


# -- KV ----------------------------------------------------------------------------------------------
def _prefill(backend: RoutedHost, ids: list[int], on_top: SharedPrefix | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Prefill ``ids`` (after ``on_top``'s KV if given); the new positions' keys and values per layer [H, n, D]."""
    cache = DynamicCache(config=backend.model.config)
    begin = 0
    if on_top is not None:
        begin = on_top.num_tokens
        for layer, held in enumerate(cache.layers):
            # (1, H, |P|, D) views: DynamicLayer.update concatenates them with the chunk into new tensors, P is never written
            held.keys, held.values = on_top.keys[layer][None], on_top.values[layer][None]
            held.device, held.is_initialized = held.keys.device, True
    positions = torch.arange(begin, begin + len(ids), device=backend.device)[None]  # (1, n)
    backend.model.base_model(input_ids=torch.tensor([ids], device=backend.device), position_ids=positions, cache=cache, use_cache=True)
    dtype = backend.torch_dtype
    keys = [layer.keys[0, :, begin:].to(dtype).contiguous() for layer in cache.layers]  # (H, n, D)
    values = [layer.values[0, :, begin:].to(dtype).contiguous() for layer in cache.layers]
    return keys, values


def shared_prefix(backend: RoutedHost) -> SharedPrefix:
    """P of ``backend`` (computed once per model and dtype, then reused)."""
    key = (id(backend.model), backend.dtype)
    with _PREFIXES_LOCK:
        cached = backend.__dict__.setdefault("_routed_prefixes", {}).get(key)
    if cached is not None:
        return cached
    ids = backend.layout.encode(shared_prefix_text(backend.layout))
    with torch.inference_mode():
        keys, values = _prefill(backend, ids, None)
    prefix = SharedPrefix(token_ids=tuple(ids), keys=tuple(keys), values=tuple(values))
    with _PREFIXES_LOCK:
        return backend.__dict__["_routed_prefixes"].setdefault(key, prefix)


def compile_chunk(backend: RoutedHost, text: str) -> MemoryChunk:
    """Compile one memory into its chunk: prefill its ids on top of P's KV, keep the chunk's own K/V."""
    prefix = shared_prefix(backend)
    ids, num_sep = chunk_token_ids(backend.layout, text)
    backend._check_room(prefix.num_tokens + len(ids), 1, "the shared prefix plus the memory")
    with torch.inference_mode():
        keys, values = _prefill(backend, ids, prefix)
    return MemoryChunk(
        token_ids=tuple(ids), keys=tuple(keys), values=tuple(values), first_position=prefix.num_tokens,
        prefix_sha256=prefix.sha256, num_separator_tokens=num_sep,
    )
