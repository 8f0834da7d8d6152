"""The cache TransformersKvBackend.compile() prefills a cartridge's parts on top of: the served KV of the parts
computed or reused so far, in one buffer per layer and kind that becomes the cartridge's KvState (no copy)."""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from .kvcache import KvState


class PrefillLayer(DynamicLayer):
    """A cache layer holding the served KV of the parts computed or reused so far, in one buffer per kind.

    The buffers ``[1, num_kv_heads, capacity, head_dim]`` are the cartridge's KvState buffers (capacity: its tokens
    and the answer room), so the compiled state is the cache itself, not a copy of it (PrefillCache.state()). Each
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


class PrefillCache(DynamicCache):
    """The cache compile() prefills each part on top of (see PrefillLayer); ``capacity``: positions per buffer."""

    def __init__(self, config, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], *, capacity: int):
        num_layers = config.get_text_config().num_hidden_layers
        layers = [PrefillLayer([p[0][layer] for p in parts], [p[1][layer] for p in parts], capacity) for layer in range(num_layers)]
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
