"""Assembling chunks into one request's KV state, and the cache that recomputes a token subset in place.

An assembly is P's KV at positions ``[0, |P|)`` followed by each chosen chunk's KV at contiguous positions,
its keys moved from where the chunk was compiled to where it now sits (rotation.py); the last chunk drops its
trailing separator, so the ids are those of the memories joined as the prompt layout joins them (chunks.py).
It is a fresh kvcache.KvState: repairing it and answering on top of it never write a stored chunk.

``ScatterCache`` is the cache for "recompute token subset S": the model runs on S's tokens at their assembly
positions; at every layer update() writes S's fresh keys/values at S's indices and returns the whole
assembly's keys/values, and a 4D mask by position (key position <= query position) keeps it causal. A token of
S thus attends to fresh K/V of the S tokens before it and to the assembly's K/V elsewhere, layer by layer.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ..errors import ConfigError, EmptyInputError
from ..kvcache import KvState
from .chunks import MemoryChunk, SharedPrefix
from .rotation import rerotate

# (layer index, cached keys of S, fresh keys of S), both [1, num_kv_heads, |S|, head_dim]; called before the scatter
Observer = Callable[[int, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True, eq=False)
class Assembly:
    """One request's assembled state: ``state`` holds ``token_ids`` at positions ``[0, len(token_ids))``.

    ``spans[i]``: the ``(begin, end)`` positions of chunk i; ``num_prefix_tokens``: |P|.
    """

    state: KvState
    token_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    num_prefix_tokens: int


def assemble(prefix: SharedPrefix, chunks: Sequence[MemoryChunk], rotary: Any, *, room: int) -> Assembly:
    """P then ``chunks`` in the given order, each chunk's keys moved to its place; ``room`` spare positions for the tail."""
    if not chunks:
        raise EmptyInputError("`chunks` has to hold at least one memory chunk but got none")
    for chunk in chunks:
        if chunk.prefix_sha256 != prefix.sha256 or chunk.num_layers != len(prefix.keys):
            raise ConfigError("a chunk was compiled after another shared prefix or model; compile it again with this backend")
    parts = [([k[None] for k in prefix.keys], [v[None] for v in prefix.values])]  # (1, H, |P|, D) per layer
    ids, spans, begin = list(prefix.token_ids), [], prefix.num_tokens
    for index, chunk in enumerate(chunks):
        n = chunk.num_tokens - (chunk.num_separator_tokens if index == len(chunks) - 1 else 0)
        delta = begin - chunk.first_position
        parts.append(([rerotate(k[:, :n], delta, rotary)[None] for k in chunk.keys], [v[:, :n][None] for v in chunk.values]))
        ids += chunk.token_ids[:n]
        spans.append((begin, begin + n))
        begin += n
    return Assembly(state=KvState.of_parts(parts, room=room), token_ids=tuple(ids), spans=tuple(spans), num_prefix_tokens=prefix.num_tokens)


class _ScatterLayer(DynamicLayer):
    """One layer's view of an assembly's buffers: update() writes at fixed indices and returns every position."""

    def __init__(self, layer_idx: int, keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor, length: int, observer: Observer | None):
        super().__init__()
        self.layer_idx, self.index, self.observer = layer_idx, index, observer
        self.kbuf, self.vbuf = keys, values  # [1, num_kv_heads, capacity, head_dim]
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        self.device, self.is_initialized, self.length = keys.device, True, length

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist already."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter ``key_states``/``value_states`` [1, H, |S|, D] to S's indices; return all positions [1, H, length, D]."""
        if self.observer is not None:
            self.observer(self.layer_idx, self.kbuf[:, :, self.index], key_states)
        self.kbuf[:, :, self.index] = key_states.to(self.kbuf.dtype)
        self.vbuf[:, :, self.index] = value_states.to(self.vbuf.dtype)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


class ScatterCache(DynamicCache):
    """The cache of a recompute pass over token subset S of ``state`` (see the module docstring)."""

    def __init__(self, state: KvState, index: torch.Tensor, observer: Observer | None = None):
        layers = [
            _ScatterLayer(i, k, v, index, state.num_tokens, observer) for i, (k, v) in enumerate(zip(state.keys, state.values, strict=True))
        ]
        Cache.__init__(self, layers=layers)


class StopPass(Exception):
    """Raised by an observer to end a recompute pass after the layers it needed (deviation probing, repair.py)."""


def recompute(model: Any, assembly: Assembly, positions: Sequence[int], observer: Observer | None = None) -> None:
    """Run the model on the assembly's tokens at ``positions`` (ascending) and write their fresh K/V in place."""
    if not positions:
        return
    device = assembly.state.keys[0].device
    index = torch.tensor(list(positions), dtype=torch.long, device=device)  # (|S|,)
    length = assembly.state.num_tokens
    assert int(index[-1]) < length and bool((index[1:] > index[:-1]).all()), "positions must be ascending assembly positions"
    input_ids = torch.tensor([[assembly.token_ids[p] for p in positions]], device=device)  # (1, |S|)
    mask = torch.arange(length, device=device)[None, :] <= index[:, None]  # (|S|, length): causal by position
    cache = ScatterCache(assembly.state, index, observer)
    try:
        model.base_model(input_ids=input_ids, position_ids=index[None], attention_mask=mask[None, None], cache=cache, use_cache=True)
    except StopPass:
        pass
