"""Cascade (shared-prefix) attention for one batched decoding pass.

A cartridge's KV state is shared by all of its rows and never copied. In every layer, for each cartridge in the
batch, the queries of all its rows (packed onto their key/value heads, GQA) attend over the prefix in one kernel
call that returns the output and its log-sum-exp (LSE); each row's queries attend over its own scratch (masked
by its length and causally); merge_states() combines the two partials exactly, the same softmax over the
concatenated keys. Fused kernels that return the LSE are checked once per (device, dtype) against plain math.
kvengine.batching's Batcher drives one CascadeStep per pass; kvengine.attention hands it each layer's call.

Design: docs/design/batching.md ("Cascade attention").
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import torch

from .kvcache import KvState


class SlotBuffers(Protocol):
    """The per-layer row buffers a pass writes into: ``kbuf[layer]``, ``vbuf[layer]`` ``[max_batch, kv, room, d]``."""

    device: torch.device
    kbuf: list[torch.Tensor]
    vbuf: list[torch.Tensor]


class _Question(Protocol):
    state: KvState


class CascadeRow(Protocol):
    """A row in a slot: its question (whose cartridge is ``request.state``) and the scratch positions written."""

    request: _Question
    length: int


# -- attention pieces --------------------------------------------------------------------------------
def plain_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [b, h, m, d]`` over ``k, v [b, h, n, d]`` (an optional additive float mask): output and LSE (float32)."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [b, h, m, n]
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype), v)
    return out, lse


def _cpu_flash(q, k, v, scale):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=None, scale=scale)
    return out, lse


def _cpu_flash_masked(q, k, v, scale, mask=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
    return out, lse


def _cuda_flash(q, k, v, scale):
    result = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
    return result[0], result[1][..., : q.shape[-2]]


def _cuda_efficient(q, k, v, scale):
    result = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
    return result[0], result[1][..., : q.shape[-2]]  # the LSE may be padded to a multiple of 32 rows


_KERNELS: dict[tuple[str, torch.dtype, bool], object] = {}
_KERNELS_LOCK = threading.Lock()


def _choose_kernel(device: torch.device, dtype: torch.dtype, *, masked: bool = False):
    """The first fused kernel that exists and agrees with plain math here (checked once), else plain math.

    ``masked``: the kernel for the rows' own parts (an additive mask per row); only the CPU flash kernel takes one.
    """
    key = (device.type, dtype, masked)
    with _KERNELS_LOCK:
        if key in _KERNELS:
            return _KERNELS[key]
        if masked:
            candidates = [_cpu_flash_masked] if device.type == "cpu" else []
        else:
            candidates = [_cpu_flash] if device.type == "cpu" else [_cuda_flash, _cuda_efficient] if device.type == "cuda" else []
        gen = torch.Generator(device="cpu").manual_seed(0)
        b = 3 if masked else 1
        q, k, v = (torch.randn(b, 2, m, 64, generator=gen).to(device=device, dtype=dtype) for m in (7, 300, 300))
        k_view = torch.cat([k, k[:, :, :20]], dim=2)[:, :, :300]  # strided, like a KvState prefix view
        mask = torch.zeros(b, 1, 7, 300, dtype=dtype, device=device)
        if masked:
            mask[0, :, :, 100:] = float("-inf")
            mask[2, :, :, 5:] = float("-inf")
        want_out, want_lse = plain_attention_lse(q.float(), k.float(), v.float(), 0.125, mask.float() if masked else None)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        chosen = plain_attention_lse
        for kernel in candidates:
            try:
                out, lse = kernel(q, k_view, v, 0.125, mask) if masked else kernel(q, k_view, v, 0.125)
            except Exception:  # noqa: BLE001 - a kernel this build or device lacks: try the next
                continue
            if out.shape == want_out.shape and torch.allclose(out.float(), want_out, atol=tol) and torch.allclose(lse.float(), want_lse, atol=tol):
                chosen = kernel
                break
        _KERNELS[key] = chosen
        return chosen


def prefix_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-causal attention of ``q [1, h, m, d]`` over a whole prefix ``k, v [1, h, n, d]`` (views, not copied).

    Returns the output ``[1, h, m, d]`` and the natural-log LSE ``[1, h, m]`` in float32.
    """
    kernel = _choose_kernel(q.device, q.dtype)
    out, lse = kernel(q, k, v, scale)
    return out, lse.float()


def suffix_attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q [b, h, m, d]`` over ``k, v [b, h, S, d]`` under the additive ``mask [b, 1, m, S]``.

    Every query row must see at least one key (a token always sees itself). CPU: the fused flash kernel (one call);
    elsewhere plain math. Returns the output and the LSE (float32).
    """
    if _choose_kernel(q.device, q.dtype, masked=True) is _cpu_flash_masked:
        out, lse = _cpu_flash_masked(q, k, v, scale, mask)
        return out, lse.float()
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype), v), lse


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Exact softmax merge of two attention partials over disjoint key sets (lse float32 ``[..., m]``).

    ``out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)`` with ``lse = logaddexp(lse_a, lse_b)``; the weight
    of ``a`` is ``sigmoid(lse_a - lse_b)``, so this is one lerp (three kernel calls instead of eight: per layer
    and step, call overhead is what a CPU decode step of a small model spends beyond the matmuls).
    """
    weight = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    if out_a.dtype != torch.float32:
        out_a, out_b = out_a.float(), out_b.float()
    return torch.lerp(out_b, out_a, weight)


# -- one forward pass ---------------------------------------------------------------------------------
class CascadeStep:
    """What attention needs for one batched pass: the rows (slots ``start:start+b``), their lengths, their cartridges.

    ``attend`` is called by kvengine.attention for every layer of the pass (module docstring). ``batcher`` holds
    the per-layer slot buffers (kvengine.batching.Batcher); ``rows`` are its rows in those slots.
    """

    def __init__(self, batcher: SlotBuffers, start: int, rows: Sequence[CascadeRow], num_new: int):
        device = batcher.device
        self.batcher, self.start, self.stop = batcher, start, start + len(rows)
        self.num_new = num_new
        self.past = torch.tensor([row.length for row in rows], device=device)  # [b]
        self.max_len = max(row.length for row in rows) + num_new
        groups: dict[int, tuple[KvState, list[int]]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(id(row.request.state), (row.request.state, []))[1].append(i)
        self.groups = [
            (state, slice(idx[0], idx[-1] + 1) if idx == list(range(idx[0], idx[-1] + 1)) else torch.tensor(idx, device=device))
            for state, idx in groups.values()
        ]
        self.write_pos = self.past.unsqueeze(1) + torch.arange(num_new, device=device)  # [b, n]
        self._masks: dict[int, torch.Tensor] = {}

    def _suffix_mask(self, groups: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive ``[b, 1, groups * n, S]``: packed query row r (token t = r % n) sees suffix positions <= past + t."""
        if (groups, dtype) not in self._masks:
            device = self.past.device
            t = torch.arange(groups * self.num_new, device=device) % self.num_new
            j = torch.arange(self.max_len, device=device)
            allowed = j.view(1, 1, 1, -1) <= (self.past.view(-1, 1, 1, 1) + t.view(1, 1, -1, 1))
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            self._masks[(groups, dtype)] = mask
        return self._masks[(groups, dtype)]

    def attend(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
        """Write ``key/value [b, kv, n, d]`` into the rows' scratch; return attention ``[b, n, heads, d]``."""
        layer = module.layer_idx
        b, heads, n, dim = query.shape
        kv_heads = key.shape[1]
        groups = heads // kv_heads
        scale = dim**-0.5 if scaling is None else scaling
        kbuf = self.batcher.kbuf[layer][self.start : self.stop]  # [b, kv, room, d] views of the slot buffers
        vbuf = self.batcher.vbuf[layer][self.start : self.stop]
        index = self.write_pos.view(b, 1, n, 1)  # scatter_, not index_put: the latter costs milliseconds here
        kbuf.scatter_(2, index.expand(b, kv_heads, n, key.shape[-1]), key)
        vbuf.scatter_(2, index.expand(b, kv_heads, n, value.shape[-1]), value)
        packed = query.reshape(b, kv_heads, groups * n, dim)  # query head h -> kv head h // groups; row gi * n + t
        # each row's own part: the question's prompt and answer so far, masked by its length and causally
        out_s, lse_s = suffix_attention_lse(packed, kbuf[:, :, : self.max_len], vbuf[:, :, : self.max_len],
                                            self._suffix_mask(groups, query.dtype), scale)
        # the shared part: per cartridge, all its rows' queries against its prefix at once, the prefix read once
        if len(self.groups) == 1:
            state, _ = self.groups[0]
            out_p, lse_p = self._prefix(packed, state, layer, scale)
        else:
            out_p, lse_p = torch.empty_like(out_s), torch.empty_like(lse_s)
            for state, rows in self.groups:
                out_p[rows], lse_p[rows] = self._prefix(packed[rows], state, layer, scale)
        out = merge_states(out_p, lse_p, out_s, lse_s).to(query.dtype)  # [b, kv, g*n, d]
        return out.reshape(b, heads, n, dim).transpose(1, 2)  # [b, n, heads, d]; the caller's reshape copies

    @staticmethod
    def _prefix(packed: torch.Tensor, state: KvState, layer: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of rows' packed queries ``[k, kv, m, d]`` over ``state``'s prefix, in one kernel call."""
        k, kv_heads, m, dim = packed.shape
        q = packed.transpose(0, 1).reshape(1, kv_heads, k * m, dim)  # all rows' queries per kv head
        prefix_k, prefix_v = state.prefix(layer)  # [1, kv, N, d] views of the cartridge: never copied
        out, lse = prefix_attention_lse(q, prefix_k, prefix_v, scale)
        return out.reshape(kv_heads, k, m, dim).transpose(0, 1), lse.reshape(kv_heads, k, m).transpose(0, 1)
