"""Cascade attention for batched decoding (kvengine.cascade): the prefix kernel, merging partial states, and the
cascade over rows on different cartridges, exact without copying the prefix (no model)."""
from __future__ import annotations

import pytest
import torch

from kvengine.attention import packed_gqa_sdpa
from kvengine.batching import Batcher, _Row
from kvengine.cascade import CascadeStep, merge_states, plain_attention_lse, prefix_attention_lse
from kvengine.kvcache import KvState


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefix_kernel_returns_the_attention_and_its_log_sum_exp(dtype):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 12, 64, generator=gen).to(dtype)
    buf = torch.randn(1, 3, 700, 64, generator=gen).to(dtype)  # a strided view, as a KvState prefix is
    k, v = buf[:, :, :500], buf[:, :, 200:]
    out, lse = prefix_attention_lse(q, k, v[:, :, :500], 0.125)
    want_out, want_lse = plain_attention_lse(q.float(), k.float(), v[:, :, :500].float(), 0.125)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert lse.dtype == torch.float32 and lse.shape == (1, 3, 12)
    torch.testing.assert_close(out.float(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=tol)


def test_merging_prefix_and_suffix_partials_is_attention_over_both():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 5, 64, generator=gen)
    k, v = torch.randn(2, 3, 400, 64, generator=gen), torch.randn(2, 3, 400, 64, generator=gen)
    out_a, lse_a = plain_attention_lse(q, k[:, :, :371], v[:, :, :371], 0.125)
    out_b, lse_b = plain_attention_lse(q, k[:, :, 371:], v[:, :, 371:], 0.125)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    torch.testing.assert_close(merge_states(out_a, lse_a, out_b, lse_b), whole, atol=1e-6, rtol=1e-5)


class _Layer(torch.nn.Module):
    def __init__(self, layer_idx: int, groups: int):
        super().__init__()
        self.layer_idx, self.num_key_value_groups = layer_idx, groups


def test_cascade_attention_equals_attention_over_each_rows_whole_sequence_without_copying_the_prefix():
    """Three rows (two on cartridge A, one on B), mid-answer, GQA 9 query heads on 3 kv heads."""
    gen = torch.Generator().manual_seed(3)
    kv, groups, dim = 3, 3, 64
    states = [KvState([torch.randn(1, kv, n, dim, generator=gen)], [torch.randn(1, kv, n, dim, generator=gen)], room=8) for n in (300, 170)]
    batcher = Batcher(torch.nn.Linear(1, 1), eos_ids=set(), device="cpu", max_batch=4)  # attention only: no model pass
    batcher._ensure_buffers(states[0], 40)
    rows = []
    for state, length in ((states[0], 9), (states[1], 4), (states[0], 17)):
        row = _Row(request=type("R", (), {"state": state})())
        row.length = length
        rows.append(row)
        batcher.kbuf[0][len(rows) - 1].normal_(generator=gen)
        batcher.vbuf[0][len(rows) - 1].normal_(generator=gen)
    for n in (1, 3):  # a decoding step and a multi-token (prefill-like) pass
        step = CascadeStep(batcher, 0, rows, n)
        query = torch.randn(3, kv * groups, n, dim, generator=gen)
        key, value = torch.randn(3, kv, n, dim, generator=gen), torch.randn(3, kv, n, dim, generator=gen)
        prefix_ptr = states[0].keys[0].data_ptr()
        out = step.attend(_Layer(0, groups), query, key, value, 0.125)  # [b, n, heads, d]
        assert states[0].keys[0].data_ptr() == prefix_ptr
        for i, row in enumerate(rows):
            pk, pv = row.request.state.prefix(0)
            end = row.length + n
            whole_k = torch.cat([pk, batcher.kbuf[0][i : i + 1, :, :end]], dim=2)
            whole_v = torch.cat([pv, batcher.vbuf[0][i : i + 1, :, :end]], dim=2)
            assert torch.equal(batcher.kbuf[0][i, :, row.length : end], key[i])  # the new keys were written
            mask = torch.ones(1, 1, n, whole_k.shape[2], dtype=torch.bool).tril(whole_k.shape[2] - n)
            want, _ = packed_gqa_sdpa(_Layer(0, groups), query[i : i + 1], whole_k, whole_v, mask, scaling=0.125)
            torch.testing.assert_close(out[i : i + 1], want, atol=2e-6, rtol=1e-5)  # both [1, n, heads, d]
