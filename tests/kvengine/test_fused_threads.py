"""The fused kernels' own threads (kvengine/native/pool.h) and the int8 row product: callers on many threads at once,
a forked child, and every int8 layer's one row bit for bit as its dense forward."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading

import pytest
import torch

from kvengine import fused
from kvengine.precision import Int8WeightLinear


def _work(seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(1, 3, 3, 64, generator=g), torch.randn(1, 3, 4096, 64, generator=g), torch.randn(1, 3, 4096, 64, generator=g)
    x, w = torch.randn(1, 576, generator=g), torch.randn(1536, 576, generator=g)
    layer = Int8WeightLinear(torch.nn.Linear(576, 1536, bias=False))
    return (lambda: fused.decode_attention(q, k, v, 0.125, None), lambda: fused.linear_rows(x, w, None, torch.float32),
            lambda: fused.linear_rows_int8(x, layer))


@pytest.fixture
def two_threads():
    """Two parts per call (the suite runs with OMP_NUM_THREADS=1, which would leave the pool unused)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_callers_on_many_threads_at_once_get_the_bits_of_one_caller(kernel, two_threads):
    """A caller that finds the pool busy runs its parts itself: same parts, same bits, no lost or crossed job."""
    calls = _work(1)
    expected = [call() for call in calls]
    assert all(e is not None for e in expected)
    failures, barrier = [], threading.Barrier(6)

    def hammer():
        torch.set_num_threads(2)  # a new thread starts at OMP_NUM_THREADS
        barrier.wait()
        for _ in range(40):
            for call, want in zip(calls, expected, strict=True):
                if not torch.equal(call(), want):
                    failures.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not failures


def _rows_with_two_parts(seed: int) -> torch.Tensor:
    """mnesio_linear_rows with two parts, called directly (torch's own threads stay at one: libgomp itself is not
    fork-safe, a child's parallel region after the parent's hangs in its barrier)."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(576, generator=g), torch.randn(1536, 576, generator=g)
    y = torch.empty(1536)
    assert fused.kernel().mnesio_linear_rows(x.data_ptr(), 1, w.data_ptr(), 576, 1536, 32, 2, y.data_ptr()) == 0
    return y


def _in_child(queue) -> None:
    torch.set_num_threads(1)
    queue.put(_rows_with_two_parts(2).tolist())


def test_a_forked_child_runs_the_kernels_without_the_parents_workers(kernel):
    """Celery's prefork children: the parent's pool threads do not exist after fork, and the child must not wait on them."""
    expected = _rows_with_two_parts(2).tolist()  # the parent's worker is started and running
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_in_child, args=(queue,))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, "the forked child hung or failed in the kernels"
    assert queue.get(timeout=10) == expected


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (576, 190), (96, 1000)])
def test_an_int8_row_is_its_dense_forward_bit_for_bit(kernel, shape, out_dtype):
    """torch's kernel's arithmetic (kernels.c's rows_i8): a row decoded alone and among others keeps its bits."""
    torch.manual_seed(shape[1])
    for bias in (False, True):
        layer = Int8WeightLinear(torch.nn.Linear(*shape, bias=bias), out_dtype=out_dtype)
        for seed in range(5):
            x = torch.randn(1, 1, shape[0], generator=torch.Generator().manual_seed(seed))
            row = fused.linear_rows_int8(x, layer)
            assert row is not None and row.dtype == out_dtype and row.shape == (1, 1, shape[1])
            assert torch.equal(row, layer(x)), (shape, bias, seed)


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 13, 32, 42, 64])
def test_a_few_int8_rows_are_their_dense_forward_bit_for_bit(kernel, two_threads, rows, monkeypatch):
    """A question's pass (its few rows) through rows_i8 gets torch's kernel's bits, so a cartridge's question and
    re-reading's stay alike; each row also keeps the bits it gets alone. Up to the kernel's 64 rows: the one-call pass
    sends a question's 33-42 rows there, where the model's forward sends them to torch's kernel."""
    monkeypatch.setattr(fused, "MAX_LINEAR_ROWS", fused.KERNEL_LINEAR_ROWS)  # what linear_rows_int8 passes on
    layer = Int8WeightLinear(torch.nn.Linear(576, 1536, bias=False), out_dtype=torch.bfloat16)
    x = torch.randn(1, rows, 576, generator=torch.Generator().manual_seed(rows))
    got = fused.linear_rows_int8(x, layer)
    assert got is not None and got.shape == (1, rows, 1536)
    assert torch.equal(got, layer(x))  # the layer as made: its dense forward
    assert torch.equal(got[0], torch.cat([fused.linear_rows_int8(x[:, r], layer) for r in range(rows)]))


def test_the_int8_row_kernel_refuses_what_it_does_not_take(kernel):
    layer = Int8WeightLinear(torch.nn.Linear(576, 1536, bias=False))
    assert fused.linear_rows_int8(torch.randn(fused.MAX_LINEAR_ROWS + 1, 576), layer) is None  # many rows: the dense kernel
    assert fused.linear_rows_int8(torch.randn(1, 64), Int8WeightLinear(torch.nn.Linear(64, 64))) is None  # small
    f32_act = Int8WeightLinear(torch.nn.Linear(576, 1536, bias=False), act_dtype=torch.float32)
    assert fused.linear_rows_int8(torch.randn(1, 576), f32_act) is None  # torch's f32 kernel sums in another order


@pytest.mark.model
@pytest.mark.parametrize("dtype", ["f32w8", "bf16w8"])
def test_every_int8_layer_sends_one_row_to_the_kernel(real_backend, kernel, dtype):
    model = real_backend.variant(dtype=dtype).model
    layers = [m for m in model.modules() if isinstance(m, Int8WeightLinear)]
    assert len(layers) == 7 * model.config.num_hidden_layers
    assert all(m.forward.__func__ is fused._int8_row_forward for m in layers)
    with torch.inference_mode():
        for m in layers[:7]:
            x = torch.randn(1, 1, m.in_features, generator=torch.Generator().manual_seed(4))
            assert torch.equal(m(x), m.mnesio_dense_forward(x))


def test_the_int8_row_kernel_stays_out_where_torch_runs_its_avx2_kernels(kernel):
    """rows_i8 reproduces torch's AVX-512 int8 kernel; under its AVX2 one (other sums) the dense forward serves."""
    code = ("import torch; from kvengine import fused; from kvengine.precision import Int8WeightLinear; "
            "layer = Int8WeightLinear(torch.nn.Linear(576, 1536, bias=False)); x = torch.randn(1, 576); "
            "print(torch.backends.cpu.get_cpu_capability(), fused.linear_rows_int8(x, layer) is None, "
            "fused.linear_rows(x, torch.randn(1536, 576), None, torch.float32) is None)")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["AVX2", "True", "False"]  # the int8 rows go to torch; the f32 rows keep the kernel
