"""The fused kernels (kvengine/fused.py): exact attention over cache views (a step, a question under a causal mask),
one-row linear layers, the build."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from kvengine import fused, precision
from kvengine.attention import packed_gqa_sdpa
from tests.support.cpu import AVX512F

ROOT = Path(__file__).resolve().parents[2]


def _cache_view(n: int, dtype: torch.dtype, *, room: int = 40, seed: int = 0):
    """Packed queries [1, 3, 3, 64] and key/value views [1, 3, n, 64] of buffers with ``room`` spare, as a cache's."""
    g = torch.Generator().manual_seed(seed)
    kb, vb = (torch.randn(1, 3, n + room, 64, generator=g).to(dtype) for _ in range(2))
    query = (3 * torch.randn(1, 3, 3, 64, generator=g)).to(dtype)
    return query, kb, vb, kb[:, :, :n], vb[:, :, :n]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 300, 2053])
def test_the_kernel_is_attention_to_float_rounding_and_never_reads_the_room(kernel, dtype, n):
    query, kb, vb, key, value = _cache_view(n, dtype)
    exact = torch.nn.functional.scaled_dot_product_attention(query.double(), key.double(), value.double(), scale=0.125)
    got = fused.decode_attention(query, key, value, 0.125)
    assert got is not None and got.dtype == dtype and got.shape == (1, 3, 3, 64)
    flash = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=0.125)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert (got.double() - exact).abs().max() <= tol
    assert (got.double() - exact).abs().max() <= (flash.double() - exact).abs().max() + tol / 4  # no worse than flash
    # the room past the view is another question's scratch: NaNs there change nothing
    kb[:, :, n:], vb[:, :, n:] = float("nan"), float("nan")
    assert torch.equal(fused.decode_attention(query, key, value, 0.125), got)
    # and every position counts: the last value moved moves the output
    vb[:, :, n - 1] += 4.0
    assert not torch.equal(fused.decode_attention(query, key, value, 0.125), got)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_split_the_positions_and_merge_to_the_same_attention(kernel, threads):
    query, _, _, key, value = _cache_view(3001, torch.float32, seed=threads)
    exact = torch.nn.functional.scaled_dot_product_attention(query.double(), key.double(), value.double(), scale=0.125)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = fused.decode_attention(query, key, value, 0.125)
    finally:
        torch.set_num_threads(before)
    assert (got.double() - exact).abs().max() <= 1e-5


def test_the_kernel_refuses_what_it_does_not_take(kernel):
    query, _, _, key, value = _cache_view(50, torch.bfloat16)
    assert fused.decode_attention(query, key, value, 0.125) is not None
    refused = {
        "two rows": (query.expand(2, -1, -1, -1), key.expand(2, -1, -1, -1), value.expand(2, -1, -1, -1)),
        "head dim 32": (query[..., :32], key[..., :32], value[..., :32]),
        "129 query rows": (query.repeat(1, 1, 43, 1)[:, :, :129], key, value),
        "f16": (query.half(), key.half(), value.half()),
        "mixed dtypes": (query, key, value.float()),
        "strided positions": (query, key.transpose(2, 3).contiguous().transpose(2, 3), value),
        "other strides": (query, key, value.contiguous()),
    }
    for case, (q, k, v) in refused.items():
        assert fused.decode_attention(q, k, v, 0.125) is None, case
    lib, rows = fused.kernel(), fused.MAX_ROWS + 1  # past takes(): the library refuses the rows itself
    q, part, out = torch.randn(3, rows, 64), torch.empty(3 * rows * 66), torch.full((3, rows, 64), 7.0)
    assert lib.mnesio_decode_attention(q.data_ptr(), key.data_ptr(), value.data_ptr(), key.stride(1), key.shape[2], 3, rows,
                                       None, 64, 16, 1, torch.empty(144 * key.shape[2]).data_ptr(), part.data_ptr(),
                                       out.data_ptr()) == -1
    assert bool((out == 7.0).all()), "nothing written"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("threads", "rows"), [(1, 64), (3, 64), (3, 11), (2, 12), (2, 17), (3, 126), (2, 128)])  # row-major, by lanes
def test_each_row_sees_the_positions_before_its_limit(kernel, dtype, threads, rows):
    g = torch.Generator().manual_seed(threads + rows)
    n = 3001
    kb, vb = (torch.randn(1, 3, n + 40, 64, generator=g).to(dtype) for _ in range(2))
    key, value = kb[:, :, :n], vb[:, :, :n]
    query = (3 * torch.randn(1, 3, rows, 64, generator=g)).to(dtype)
    # one position, a few, one thread's chunk and a bit, all but one, all: chunks a row sees nothing of included
    limits = torch.tensor(([1, 2, 17, 1001, 1002, n - 1, n] * 20)[:rows]).to(torch.int64)
    mask = torch.arange(n)[None, :] < limits[:, None]  # [rows, n]
    exact = torch.nn.functional.scaled_dot_product_attention(query.double(), key.double(), value.double(), attn_mask=mask, scale=0.125)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = fused.decode_attention(query, key, value, 0.125, limits)
    finally:
        torch.set_num_threads(before)
    assert got is not None and got.dtype == dtype
    assert (got.double() - exact).abs().max() <= (1e-5 if dtype == torch.float32 else 1e-2)
    # what a row does not see changes nothing (a later token's key may be anything, its value anything finite)
    key2, value2 = key.clone(), value.clone()
    key2[:, :, 17:], value2[:, :, 17:] = float("nan"), 1e4
    assert torch.equal(fused.decode_attention(query, key2, value2, 0.125, limits)[:, :, :3], got[:, :, :3])
    for bad in ([0] + [n] * (rows - 1), [n + 1] * rows, [n] * (rows - 1)):  # a limit outside [1, n]; too few limits
        assert fused.decode_attention(query, key, value, 0.125, torch.tensor(bad)) is None


def test_prefix_limits_reads_a_causal_mask_and_nothing_else(kernel):
    n = 40
    causal = (torch.arange(n)[None, :] <= torch.arange(n - 5, n)[:, None])[None, None]  # 5 tokens over 35 cached
    assert fused.prefix_limits(causal, n).tolist() == [36, 37, 38, 39, 40]
    assert fused.prefix_limits(torch.ones(1, 1, 1, n, dtype=torch.bool).expand(1, 1, 3, n), n).tolist() == [n, n, n]
    holed, sliding, seen_again = causal.clone(), causal.clone(), causal.clone()
    holed[..., 3] = False
    sliding[..., :2] = False
    seen_again[..., 0, n - 1] = True  # the first token also sees the last position, past the ones it does not
    for mask, size in ((holed, n), (sliding, n), (seen_again, n), (causal, n + 1), (causal.float(), n),
                       (causal.expand(2, 1, 5, n), n), (causal.transpose(2, 3).contiguous().transpose(2, 3), n),
                       (torch.zeros(1, 1, 1, n, dtype=torch.bool), n)):
        assert fused.prefix_limits(mask, size) is None


def test_a_questions_pass_under_a_causal_mask_goes_to_the_kernel(kernel, monkeypatch):
    query, _, _, key, value = _cache_view(300, torch.float32)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    g = torch.Generator().manual_seed(5)
    heads = torch.randn(1, 9, 13, 64, generator=g)  # 13 tokens, the last of the 300 positions
    causal = (torch.arange(300)[None, :] <= torch.arange(287, 300)[:, None])[None, None]
    calls = []
    real = fused.decode_attention
    monkeypatch.setattr(fused, "decode_attention", lambda *a: calls.append(1) or real(*a))
    got, _ = packed_gqa_sdpa(module, heads, key, value, causal, scaling=0.125)
    exact = torch.nn.functional.scaled_dot_product_attention(heads.double(), key.double(), value.double(), attn_mask=causal,
                                                             scale=0.125, enable_gqa=True).transpose(1, 2)
    assert calls == [1] and got.shape == (1, 13, 9, 64)
    assert (got.double() - exact).abs().max() <= 1e-5
    holed = causal.clone()
    holed[..., 10] = False  # not each row's first positions: flash, under that mask
    masked, _ = packed_gqa_sdpa(module, heads, key, value, holed, scaling=0.125)
    assert calls == [1] and (masked.double() - exact).abs().max() > 1e-3
    long = torch.randn(1, 9, 43, 64, generator=g)  # 129 packed rows: more than the kernel takes, flash
    causal43 = (torch.arange(300)[None, :] <= torch.arange(257, 300)[:, None])[None, None]
    packed_gqa_sdpa(module, long, key, value, causal43, scaling=0.125)
    assert calls == [1]
    got16, _ = packed_gqa_sdpa(module, heads.bfloat16(), key.bfloat16(), value.bfloat16(), causal, scaling=0.125)
    assert calls == [1, 1] and got16.dtype == torch.bfloat16 and (got16.double() - exact).abs().max() <= 5e-2  # bf16 inputs


def test_a_single_token_step_goes_to_the_kernel_and_a_masked_one_does_not(kernel, monkeypatch):
    query, _, _, key, value = _cache_view(64, torch.float32)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    heads = query.reshape(1, 9, 1, 64)  # 9 query heads, one token
    calls = []
    real = fused.decode_attention
    monkeypatch.setattr(fused, "decode_attention", lambda *a: calls.append(1) or real(*a))
    got, _ = packed_gqa_sdpa(module, heads, key, value, None, scaling=0.125)
    expected = torch.nn.functional.scaled_dot_product_attention(heads, key, value, scale=0.125, enable_gqa=True).transpose(1, 2)
    assert calls == [1] and got.shape == (1, 1, 9, 64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    everything = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    packed_gqa_sdpa(module, heads, key, value, everything, scaling=0.125)  # a mask that hides nothing: the kernel
    assert calls == [1, 1]
    hides = everything.clone()
    hides[..., 10] = False
    masked, _ = packed_gqa_sdpa(module, heads, key, value, hides, scaling=0.125)  # a mask that hides: flash, masked
    assert calls == [1, 1] and not torch.allclose(masked, got)


def test_unavailable_kernel_leaves_the_flash_kernel(monkeypatch):
    query, _, _, key, value = _cache_view(64, torch.bfloat16)
    monkeypatch.setattr(fused, "kernel", lambda: None)
    assert fused.decode_attention(query, key, value, 0.125) is None
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    got, _ = packed_gqa_sdpa(module, query.reshape(1, 9, 1, 64), key, value, None, scaling=0.125)
    flash = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=0.125)
    assert torch.equal(got, flash.reshape(1, 9, 1, 64).transpose(1, 2))


def _load_in_subprocess(folder: Path, env: dict | None = None) -> subprocess.Popen:
    code = ("import sys; from pathlib import Path; from kvengine import fused; lib = fused.load(Path(sys.argv[1]));"
            "print('loaded' if lib is not None else 'unavailable')")
    return subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not AVX512F, reason="this CPU lacks AVX-512F")
def test_processes_building_at_once_each_load_a_whole_library(tmp_path):
    folder = tmp_path / "kernels"
    runs = [_load_in_subprocess(folder) for _ in range(3)]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [out.strip() for out, _ in outputs] == ["loaded"] * 3, outputs
    assert [p.name for p in folder.iterdir()] == [fused.library_path(folder).name]  # no temporary file left


def test_a_failed_build_leaves_nothing_to_load(tmp_path):
    folder = tmp_path / "kernels"
    liar = tmp_path / "cc"  # writes half a library, then fails, as a killed build would
    liar.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\necho garbage > "$2"\nexit 1\n')
    liar.chmod(0o755)
    out, err = _load_in_subprocess(folder, {"CC": str(liar)}).communicate(timeout=60)
    assert out.strip() == "unavailable" and "unavailable" in err
    assert list(folder.iterdir()) == []


@pytest.mark.skipif(not AVX512F, reason="this CPU lacks AVX-512F")
def test_a_damaged_library_is_built_again(tmp_path):
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    fused.library_path(folder).write_bytes(b"not a library")
    assert fused.load(folder) is not None


def test_a_folder_others_may_write_is_not_loaded_from(tmp_path, caplog):
    folder = tmp_path / "kernels"
    folder.mkdir()
    folder.chmod(0o777)  # anyone could have put a library there
    assert fused.load(folder) is None
    assert "not private" in caplog.text and not list(folder.iterdir())


@pytest.mark.parametrize(("dtype", "out_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                  (torch.bfloat16, torch.float32)])
def test_a_linear_row_is_the_dense_product(kernel, dtype, out_dtype):
    g = torch.Generator().manual_seed(1)
    weight, x = torch.randn(200, 576, generator=g).to(dtype), torch.randn(1, 1, 576, generator=g)  # 115,200 weights
    got = fused.linear_rows(x, weight, None, out_dtype)
    exact = (x.to(dtype).double() @ weight.double().T).reshape(1, 1, 200)  # bf16 inputs, products summed exactly
    assert got.dtype == out_dtype and got.shape == (1, 1, 200)
    if out_dtype == torch.float32:
        assert (got.double() - exact).abs().max() <= 1e-4  # f32 accumulation of 576 products
    else:  # rounded once to bf16, as the dense bf16 product rounds its accumulator
        torch.testing.assert_close(got, torch.nn.functional.linear(x.to(dtype), weight), rtol=2**-8, atol=1e-3)
    bias = torch.randn(200, generator=g)
    torch.testing.assert_close(fused.linear_rows(x, weight, bias, out_dtype).float(), got.float() + bias.to(out_dtype).float(),
                               rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 3, 4, 7, 13, 32, 42, 64])
def test_a_few_rows_are_each_their_own_one_row_product(kernel, dtype, rows, monkeypatch):
    """A question's few rows, or a batch's, through DEFINE_ROWS: each row gets the bits it gets alone (so a batched
    answer's products are the lone answer's), and the dense product's values."""
    monkeypatch.setattr(fused, "MAX_LINEAR_ROWS", fused.KERNEL_LINEAR_ROWS)  # the one-call pass's rows, up to the kernel's
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # two parts: the outputs split between the caller and a worker
    try:
        g = torch.Generator().manual_seed(rows)
        weight, x = torch.randn(1536, 576, generator=g).to(dtype), torch.randn(rows, 576, generator=g)
        got = fused.linear_rows(x, weight, None, torch.float32)
        alone = torch.cat([fused.linear_rows(x[r:r + 1], weight, None, torch.float32) for r in range(rows)])
    finally:
        torch.set_num_threads(before)
    assert got.shape == (rows, 1536) and torch.equal(got, alone)
    exact = x.to(dtype).double() @ weight.double().T
    assert (got.double() - exact).abs().max() <= 1e-4


def test_a_linear_row_refuses_what_it_does_not_take(kernel):
    weight, x = torch.randn(1024, 96), torch.randn(1, 96)
    lib, y = fused.kernel(), torch.empty(fused.KERNEL_LINEAR_ROWS + 1, 1024)
    for rows, rc in ((fused.KERNEL_LINEAR_ROWS, 0), (fused.KERNEL_LINEAR_ROWS + 1, -1)):  # the library's own limit
        many = torch.randn(rows, 96)
        assert lib.mnesio_linear_rows(many.data_ptr(), rows, weight.data_ptr(), 96, 1024, 32, 1, y.data_ptr()) == rc
    assert fused.linear_rows(x, weight, None, torch.float32) is not None
    assert fused.linear_rows(torch.randn(fused.MAX_LINEAR_ROWS + 1, 96), weight, None, torch.float32) is None  # many: torch's
    assert fused.linear_rows(torch.randn(2, 3, 96), weight, None, torch.float32) is not None  # six rows, any leading shape
    assert fused.linear_rows(torch.randn(0, 96), weight, None, torch.float32) is None  # no row
    assert fused.linear_rows(x, weight.T.contiguous().T, None, torch.float32) is None  # strided weights
    assert fused.linear_rows(torch.randn(1, 80), torch.randn(1024, 80), None, torch.float32) is None  # not a multiple of 32
    assert fused.linear_rows(torch.randn(1, 96), torch.randn(64, 96), None, torch.float32) is None  # small: torch's is faster
    assert fused.linear_rows(x, weight.half(), None, torch.float16) is None


@pytest.mark.model
@pytest.mark.parametrize("dtype", ["f32", "bf16r", "f32w8", "bf16w8"])
def test_every_linear_layer_answers_one_row_as_its_dense_forward(real_backend, kernel, dtype):
    model = (real_backend if dtype == "f32" else real_backend.variant(dtype=dtype)).model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.forward.__func__ is fused._row_forward for m in linears)
    assert not dtype.endswith("w8") or len(linears) == 1  # int8 layers keep their kernel: only the LM head (f32, bf16w8: bf16)
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for m in linears:
            x = torch.randn(1, 1, m.in_features, generator=g)
            if m.mnesio_dense_forward.__func__ is not precision.exact_output_forward:
                x = x.to(m.weight.dtype)  # bf16r feeds its plain bf16 layers bf16 (a pre-hook)
            row, dense = m(x), m.mnesio_dense_forward(x)
            assert row.dtype == dense.dtype
            torch.testing.assert_close(row.float(), dense.float(), rtol=0, atol=2e-2 if dense.dtype == torch.bfloat16 else 2e-4)


@pytest.mark.model
def test_the_real_models_answer_is_the_same_through_the_kernels(real_backend, kernel, monkeypatch):
    from kvengine import native_pass

    monkeypatch.setattr(native_pass, "ENABLED", False)  # the model's own forward (the decoder's pass in one call: test_native_pass.py)
    cartridge = real_backend.compile(["Alice lives in Lisbon.", "Bob keeps the key under the pot."])
    calls = {"attention": 0, "rows": 0}
    attention, rows = fused.decode_attention, fused.linear_rows
    monkeypatch.setattr(fused, "decode_attention", lambda *a: calls.__setitem__("attention", calls["attention"] + 1) or attention(*a))
    monkeypatch.setattr(fused, "linear_rows", lambda *a: calls.__setitem__("rows", calls["rows"] + 1) or rows(*a))
    through = real_backend.answer_unbatched(cartridge, "Where does Bob keep the key?", max_new_tokens=6, stop_at_eos=False)
    layers = real_backend.model.config.num_hidden_layers
    assert calls["attention"] == 6 * layers  # every layer of the question's pass and of the 5 steps after it
    assert calls["rows"] >= 5 * (7 * layers + 1)  # q, k, v, o, gate, up, down and the head, in each step
    monkeypatch.setattr(fused, "decode_attention", lambda *a: None)
    monkeypatch.setattr(fused, "linear_rows", lambda *a: None)
    dense = real_backend.answer_unbatched(cartridge, "Where does Bob keep the key?", max_new_tokens=6, stop_at_eos=False)
    assert through.token_ids == dense.token_ids
