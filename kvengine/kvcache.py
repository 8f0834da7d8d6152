"""A cartridge's KV state in memory, and the per-call cache view the model writes the question into.

Layout: per layer, key and value buffers ``[1, num_kv_heads, capacity, head_dim]``. Positions
``[0, num_tokens)`` hold the cartridge and are never written after compile/load; positions from
``num_tokens`` on are scratch for one question and its answer at a time.

Why not transformers' DynamicCache: its update() concatenates, copying the whole cache at every decoded
token, and the documented reuse pattern deep-copies the prefilled cache per question. Here a question costs
only writing its own tokens into the scratch tail and reading views; "cropping back" is resetting the
length to ``num_tokens`` (the next call starts from the cartridge's own length; answer() relies on it).

Thread safety: the buffers' cartridge region is read-only and the model is read-only under
torch.inference_mode(), so both may be shared between threads. The scratch tail is not: KvState.lock
serializes its users (different cartridges answer in parallel). One-at-a-time calls take it through
KvState.scratch(), which tells the batcher's lone row that holds it (kvengine.batching) to give it back.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

# Scratch positions allocated past the cartridge: a question plus its answer rarely exceeds this; longer
# ones grow the buffers once (one copy) under the lock.
DEFAULT_ROOM = 512


def _buffers(
    parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], capacity: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, key and value buffers ``[1, num_kv_heads, capacity, head_dim]`` holding the parts one after the other
    from position 0 (each part copied once, into its place)."""
    keys, values = [], []
    for layer in range(len(parts[0][0])):
        k0, v0 = parts[0][0][layer], parts[0][1][layer]
        b, h, _, d = k0.shape
        kb = torch.empty((b, h, capacity, d), dtype=k0.dtype, device=k0.device)  # (1, H, capacity, D)
        vb = torch.empty((b, h, capacity, v0.shape[-1]), dtype=v0.dtype, device=v0.device)
        begin = 0
        for part_keys, part_values in parts:
            end = begin + int(part_keys[layer].shape[-2])
            kb[:, :, begin:end].copy_(part_keys[layer])
            vb[:, :, begin:end].copy_(part_values[layer])
            begin = end
        keys.append(kb)
        values.append(vb)
    return keys, values


class KvState:
    """The loaded KV state of one cartridge (see the module docstring for layout and thread safety)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], *, room: int = DEFAULT_ROOM):
        """Copy per-layer ``[1, num_kv_heads, num_tokens, head_dim]`` tensors into buffers with ``room`` spare."""
        self._fill([(keys, values)], room=room)

    @classmethod
    def of_parts(cls, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], *, room: int = DEFAULT_ROOM) -> KvState:
        """One state from consecutive parts, each a per-layer list of keys and one of values: each part is copied once,
        into its place in the buffers (concatenating them first would allocate and copy the whole cache again)."""
        state = cls.__new__(cls)
        state._fill(parts, room=room)
        return state

    @classmethod
    def of_buffers(cls, keys: list[torch.Tensor], values: list[torch.Tensor], *, num_tokens: int) -> KvState:
        """A state over existing per-layer buffers ``[1, num_kv_heads, capacity, head_dim]`` whose first ``num_tokens``
        positions hold the cartridge (no copy: the caller hands them over)."""
        capacity = int(keys[0].shape[-2])
        if num_tokens > capacity or any(int(t.shape[-2]) != capacity for t in keys + values):
            raise ValueError(f"buffers of {capacity} positions cannot hold a state of {num_tokens}")
        state = cls.__new__(cls)
        state.num_tokens, state.lock, state.capacity = num_tokens, threading.Lock(), capacity
        state._waiters, state._waiters_lock = 0, threading.Lock()
        state.keys, state.values = list(keys), list(values)
        return state

    @classmethod
    def blank(cls, num_layers: int, kv_shape: tuple[int, int], *, capacity: int, num_tokens: int = 0,
              dtype: torch.dtype, device: str | torch.device) -> KvState:
        """A state over zeroed per-layer buffers ``[1, num_kv_heads, capacity, head_dim]`` whose first ``num_tokens``
        positions count as the cartridge (0: an empty cache to prefill into)."""
        heads, dim = kv_shape
        keys, values = ([torch.zeros((1, heads, capacity, dim), dtype=dtype, device=device) for _ in range(num_layers)]
                        for _ in range(2))
        return cls.of_buffers(keys, values, num_tokens=num_tokens)

    def _fill(self, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], *, room: int) -> None:
        self.num_tokens = sum(int(keys[0].shape[-2]) for keys, _ in parts)
        self.lock = threading.Lock()
        self._waiters, self._waiters_lock = 0, threading.Lock()
        self.keys, self.values, self.capacity = *_buffers(parts, self.num_tokens + room), self.num_tokens + room

    @contextmanager
    def scratch(self) -> Iterator[None]:
        """Hold ``lock`` (the scratch tail) for a one-at-a-time call. While the call waits for it, ``wanted()`` is true:
        a batcher's lone row holding the tail gives it back at its next step (kvengine.batching)."""
        with self._waiters_lock:
            self._waiters += 1
        try:
            self.lock.acquire()
        finally:
            with self._waiters_lock:
                self._waiters -= 1
        try:
            yield
        finally:
            self.lock.release()

    def wanted(self) -> bool:
        """Whether a one-at-a-time call waits for the scratch tail (scratch())."""
        return self._waiters > 0

    def ensure_capacity(self, num_positions: int) -> None:
        """Grow the buffers (one copy) if a call needs more than ``capacity`` positions; hold ``lock``."""
        if num_positions > self.capacity:
            n, capacity = self.num_tokens, num_positions + DEFAULT_ROOM
            self.keys, self.values = _buffers([([k[:, :, :n] for k in self.keys], [v[:, :, :n] for v in self.values])], capacity)
            self.capacity = capacity

    def prefix(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of layer ``layer``'s cartridge keys and values ``[1, num_kv_heads, num_tokens, head_dim]``."""
        n = self.num_tokens
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def nbytes(self) -> int:
        """Bytes held by the cartridge region (not the scratch room)."""
        return sum(2 * k[:, :, : self.num_tokens].numel() * k.element_size() for k in self.keys)


class BufferLayer(DynamicLayer):
    """A cache layer over preallocated buffers: update() writes the new positions and returns views."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.kbuf, self.vbuf = keys, values  # [1, num_kv_heads, capacity, head_dim]
        self.length = length
        self.device = keys.device
        self.is_initialized = True
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist already."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states``/``value_states`` [1, H, n, D] at the end and return views of all positions."""
        end = self.length + key_states.shape[-2]
        assert end <= self.kbuf.shape[-2], "KvState.ensure_capacity() must run before the forward pass"
        self.kbuf[:, :, self.length : end].copy_(key_states)
        self.vbuf[:, :, self.length : end].copy_(value_states)
        self.length = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("`tokens_to_remove` has to be <= 0 (the number of tokens to drop, negated)")
        self.length = max(0, self.length + tokens_to_remove)
        self.keys, self.values = self.kbuf[:, :, : self.length], self.vbuf[:, :, : self.length]


class CartridgeCache(DynamicCache):
    """A per-call cache starting at the cartridge's length, writing only into the scratch tail."""

    def __init__(self, state: KvState):
        Cache.__init__(self, layers=[BufferLayer(k, v, state.num_tokens) for k, v in zip(state.keys, state.values, strict=True)])
        self.base_length = state.num_tokens

    def crop_back(self) -> None:
        """Reset to the cartridge's own length (what DynamicCache.crop(num_tokens) does, without copying)."""
        for layer in self.layers:
            layer.crop(self.base_length - layer.length)
