"""The engine's fused few-row kernels (kvengine/native/kernels.c): built on first use, called through ctypes.

kvengine.attention sends the attention of a single-token step, and of a question's few tokens under a causal mask,
to ``decode_attention``; ``row_linears`` makes a model's linear layers send a few rows to ``linear_rows``. Each
returns None for what its kernel does not take (then torch's kernel serves: the flash attention, the dense
matmul). The library is built with the system C compiler (``$CC``, else cc)
into ``<MNESIO_MODEL_CACHE_DIR>/kernels/``, named by a hash of the source and the flags: into a temporary file,
then renamed, so processes building at once each load a whole library. The folder must be the process owner's and
writable by no one else, or nothing there is loaded. No compiler, a failed build or a CPU without AVX-512F: the
kernels are unavailable (logged once) and answers are torch's kernels'.

Design and measurements: docs/design/attention.md, "Fused few-row kernels".
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import types
from pathlib import Path

import torch

from .config import default_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "native" / "kernels.c"
SOURCES = (SOURCE, SOURCE.parent / "layers.c")  # layers.c: the decoder's pass in one call (kvengine.native_pass)
HEADERS = (SOURCE.parent / "pool.h", SOURCE.parent / "kernels.h")  # included by SOURCES: part of the library's digest
# ISO C (-std=c11) contracts no a * b + c into an FMA: layers.c's elementwise ops round as torch's do
FLAGS = ("-O3", "-mavx512f", "-mfma", "-ffp-contract=off", "-pthread", "-shared", "-fPIC", "-std=c11")
HEAD_DIM, MAX_ROWS = 64, 128  # the shapes the attention kernel takes (kernels.c): packed query rows at most
KV_BITS = {torch.bfloat16: 16, torch.float32: 32}  # the KV and weight dtypes the kernels read
# the fewest weights a linear layer sends a row to the kernel with: a call's fixed cost (~8 us) is more than a small
# product costs torch (a 256 x 256 one: ~5 us), while SmolLM2's smallest layer (192 x 576) gains in the model's step
MIN_ROW_WEIGHTS = 1 << 16
# the most rows a linear layer sends to its kernel (kernels.c takes 64): a question's pass, a batch's step, a short
# tail; fewer than a compile's block (blocks.BLOCK_SIZE, 64 tokens), where MKL is as fast on the main thread
MAX_LINEAR_ROWS = 32
KERNEL_LINEAR_ROWS = 64  # kernels.h's LINEAR_MAX_ROWS: the most rows kvengine.native_pass sends a product


def library_path(folder: Path | None = None) -> Path:
    """Where the library of this source and these flags is (or would be) built."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS)) + " ".join(FLAGS).encode()).hexdigest()[:16]
    return (folder or default_cache_dir() / "kernels") / f"kernels-{digest}.so"


def _private_folder(folder: Path) -> bool:
    """Whether ``folder`` (made if missing) is this process owner's and not writable by its group or others."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.stat()
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def build(path: Path) -> Path:
    """Compile the source into ``path`` (atomically: a temporary file in its folder, then renamed); return ``path``."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (set CC, or install cc)")
    fd, temporary = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        subprocess.run([compiler, *FLAGS, "-o", temporary, *map(str, SOURCES), "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def load(folder: Path | None = None) -> ctypes.CDLL | None:
    """The kernel's library, built first if missing; None where it cannot be built, loaded or run here."""
    path = library_path(folder)
    try:
        if not _private_folder(path.parent):
            raise RuntimeError(f"{path.parent} is not private to this user")
        if not path.exists():
            build(path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:  # not a library of this machine's (a copied cache folder, a damaged file): build it anew
            lib = ctypes.CDLL(str(build(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        log.warning("kvengine: the fused few-row kernels are unavailable (%s); torch's kernels serve", exc)
        return None
    if not lib.mnesio_decode_attention_supported():
        log.warning("kvengine: this CPU lacks AVX-512F; torch's kernels serve single-token steps")
        return None
    lib.mnesio_decode_attention.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 2 + [ctypes.c_void_p]
                                          + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3)
    lib.mnesio_decode_attention.restype = ctypes.c_int
    lib.mnesio_linear_rows.argtypes = ([ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p] + [ctypes.c_int64] * 2
                                       + [ctypes.c_int] * 2 + [ctypes.c_void_p])
    lib.mnesio_linear_rows.restype = ctypes.c_int
    lib.mnesio_linear_rows_int8.argtypes = ([ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
                                            + [ctypes.c_int] * 2 + [ctypes.c_void_p])
    lib.mnesio_linear_rows_int8.restype = ctypes.c_int
    lib.mnesio_prefix_limits.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p]
    lib.mnesio_prefix_limits.restype = ctypes.c_int
    lib.mnesio_layers_pass.argtypes = ([ctypes.c_void_p] + [ctypes.c_int] * 7 + [ctypes.c_float] * 2 + [ctypes.c_int64] * 2
                                       + [ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_void_p])
    lib.mnesio_layers_pass.restype = ctypes.c_int
    return lib


@functools.cache
def kernel() -> ctypes.CDLL | None:
    """This process's library (module docstring), or None."""
    return load()


def takes(packed: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernel takes this step: one row of packed queries ``[1, kv, rows, 64]`` over CPU key and value views
    of one dtype (bf16 or f32) whose heads are equally strided and whose positions are contiguous rows."""
    return (
        packed.shape[0] == 1 and packed.shape[-1] == HEAD_DIM and packed.shape[2] <= MAX_ROWS
        and key.dtype == value.dtype and key.dtype in KV_BITS and key.device.type == "cpu"
        and key.shape == value.shape and key.stride() == value.stride()
        and key.stride(3) == 1 and key.stride(2) == HEAD_DIM and key.shape[2] >= 1
        and not torch.compiler.is_compiling()
    )


def prefix_limits(mask: torch.Tensor, n: int) -> torch.Tensor | None:
    """Per query row of a boolean ``mask [1, 1, q, n]``, how many leading positions it sees (int64 ``[q]``), when every
    row sees exactly its first ones and at least one (a causal mask over a cache, or one that hides nothing); else
    None, and None where the kernel is unavailable. One scan of the mask (the library's), each layer's call a few
    microseconds where torch's comparisons took a third of a millisecond."""
    if (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[:2] != (1, 1) or mask.shape[-1] != n
            or mask.stride(-1) != 1 or mask.device.type != "cpu" or (lib := kernel()) is None):
        return None
    limits = torch.empty(mask.shape[2], dtype=torch.int64)
    if lib.mnesio_prefix_limits(mask.data_ptr(), mask.shape[2], n, mask.stride(2), limits.data_ptr()) != 0:
        return None
    return limits


def decode_attention(packed: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                     limits: torch.Tensor | None = None) -> torch.Tensor | None:
    """softmax(q k^T * scale) v for packed queries ``[1, kv, rows, 64]`` over ``key, value [1, kv, n, 64]``, in the
    values' dtype, row r over the first ``limits[r]`` positions (int64 ``[rows]``; None: all of them); None when the
    kernel does not take it or is unavailable (the caller runs the flash kernel)."""
    if not takes(packed, key, value) or (lib := kernel()) is None:
        return None
    _, heads, rows, dim = packed.shape
    n = key.shape[2]
    if limits is not None:  # one per row (the library reads that many); it refuses any outside [1, n] itself
        limits = limits.to(torch.int64).contiguous()
        if limits.shape != (rows,):
            return None
    q = (packed[0].float() * scale).contiguous()  # [kv, rows, d]
    threads = torch.get_num_threads()
    scores = torch.empty((rows + 15) // 16 * 16 * n, dtype=torch.float32)  # rows rounded up to 16 (kernels.c's lanes_)
    part = torch.empty(threads * heads * rows * (dim + 2), dtype=torch.float32)  # per thread: outputs, max, sum
    out = torch.empty(heads, rows, dim, dtype=torch.float32)
    rc = lib.mnesio_decode_attention(q.data_ptr(), key.data_ptr(), value.data_ptr(), key.stride(1), n, heads, rows,
                                     None if limits is None else limits.data_ptr(), dim, KV_BITS[key.dtype], threads,
                                     scores.data_ptr(), part.data_ptr(), out.data_ptr())
    if rc != 0:
        return None
    return out.to(value.dtype).unsqueeze(0)


# -- linear layers on a few rows ----------------------------------------------------------------------------------
def _rows(x: torch.Tensor, in_features: int) -> int:
    """How many rows of ``in_features`` an ``x`` holds, when the linear kernels take it (1 to MAX_LINEAR_ROWS); else 0."""
    if x.device.type != "cpu" or x.dim() < 1 or x.shape[-1] != in_features or in_features % 32 or not x.numel():
        return 0
    rows = x.numel() // in_features
    return rows if rows <= MAX_LINEAR_ROWS else 0


def linear_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor | None:
    """``x @ weight.T (+ bias)`` for an ``x`` of at most MAX_LINEAR_ROWS rows, its inputs rounded to the weights' dtype
    and the products accumulated in f32, returned in ``out_dtype``; each row's result is its one-row product's bit for
    bit, whatever rows it comes with (kernels.c, DEFINE_ROWS). None when the kernel does not take it."""
    rows = _rows(x, weight.shape[1]) if weight.dim() == 2 else 0
    if (not rows or weight.dtype not in KV_BITS or weight.numel() < MIN_ROW_WEIGHTS or not weight.is_contiguous()
            or torch.compiler.is_compiling() or (lib := kernel()) is None):
        return None
    flat = x.reshape(rows, -1).to(weight.dtype).float().contiguous()  # the rows the dense matmul would multiply, in f32
    y = torch.empty(rows, weight.shape[0], dtype=torch.float32)
    if lib.mnesio_linear_rows(flat.data_ptr(), rows, weight.data_ptr(), weight.shape[1], weight.shape[0],
                              KV_BITS[weight.dtype], torch.get_num_threads(), y.data_ptr()) != 0:
        return None
    if bias is not None:
        y += bias.float()
    return y.to(out_dtype).reshape(*x.shape[:-1], weight.shape[0])


def linear_rows_int8(x: torch.Tensor, layer) -> torch.Tensor | None:
    """An Int8WeightLinear's product for an ``x`` of at most MAX_LINEAR_ROWS rows, bit for bit its dense forward
    (torch's kernel's arithmetic, kernels.c's rows_i8: the rows and the product rounded to bf16, then ``out_dtype``);
    None when the kernel does not take it (bf16 activations only: torch's f32-activation kernel sums in another
    order)."""
    codes = layer.weight
    rows = _rows(x, layer.in_features)
    if (not rows or layer.act_dtype != torch.bfloat16 or not _torch_int8_kernel_is_avx512()
            or codes.numel() < MIN_ROW_WEIGHTS or torch.compiler.is_compiling() or (lib := kernel()) is None):
        return None
    flat = x.reshape(rows, -1)
    if flat.dtype != torch.float32 or not flat.is_contiguous():
        flat = flat.float().contiguous()
    bf16_out = layer.out_dtype == torch.bfloat16 and layer.bias is None
    y = torch.empty(rows, layer.out_features, dtype=torch.bfloat16 if bf16_out else torch.float32)
    if lib.mnesio_linear_rows_int8(flat.data_ptr(), rows, codes.data_ptr(), layer.scales.data_ptr(), layer.in_features,
                                   layer.out_features, torch.get_num_threads(), 16 if bf16_out else 32, y.data_ptr()) != 0:
        return None
    if layer.bias is not None:
        y = y + layer.bias
    return y.to(layer.out_dtype).reshape(*x.shape[:-1], layer.out_features)


@functools.cache
def _torch_int8_kernel_is_avx512() -> bool:
    """Whether torch runs its AVX-512 kernels here, whose int8 arithmetic rows_i8 reproduces (its AVX2 one sums 8
    lanes at a time: ATEN_CPU_CAPABILITY=avx2, or a CPU with AVX-512F but not all that torch's AVX-512 build needs)."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def _int8_row_forward(self, x: torch.Tensor) -> torch.Tensor:
    """A wrapped int8 layer's forward: a few rows through ``linear_rows_int8``, more through its dense forward."""
    y = linear_rows_int8(x, self)
    return self.mnesio_dense_forward(x) if y is None else y


def _row_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A wrapped linear layer's forward: a few rows through ``linear_rows``, more through its dense forward."""
    y = linear_rows(x, self.weight, self.bias, self.mnesio_row_dtype)
    return self.mnesio_dense_forward(x) if y is None else y


def row_weight_bits(linear: torch.nn.Module) -> int | None:
    """How row_linears' wrapper runs this layer's few rows: 8 for int8 codes on rows_i8 (torch's kernel's bits), 32 for
    f32 weights on the plain product (nn.Linear's own forward, not bf16r's exact one), no bias, at least
    MIN_ROW_WEIGHTS weights (a smaller layer goes to torch's product); None for anything else."""
    from . import precision

    if linear.weight.numel() < MIN_ROW_WEIGHTS:
        return None
    if isinstance(linear, precision.Int8WeightLinear):
        ok = (linear.act_dtype == torch.bfloat16 and linear.bias is None and linear.weight.is_contiguous()
              and getattr(linear.forward, "__func__", None) is _int8_row_forward and _torch_int8_kernel_is_avx512())
        return 8 if ok else None
    if (type(linear) is torch.nn.Linear and linear.bias is None and linear.weight.dtype == torch.float32
            and linear.weight.is_contiguous() and getattr(linear.forward, "__func__", None) is _row_forward
            and getattr(linear.mnesio_dense_forward, "__func__", None) is torch.nn.Linear.forward):
        return 32
    return None


def row_linears(model: torch.nn.Module) -> torch.nn.Module:
    """Route every nn.Linear of ``model`` with bf16 or f32 weights through ``linear_rows`` for inputs of at most
    MAX_LINEAR_ROWS rows, in place.

    A layer keeps the forward it had (bf16r's exact-output one included) for everything else; its few-row output
    has that forward's dtype: f32 for bf16r's exact outputs (kvengine.precision), the weights' dtype otherwise.
    Int8 layers (f32w8, bf16w8) send a few rows to ``linear_rows_int8`` the same way. Bound as methods, so a deep copy binds its
    copy; call it again after casting such a copy (kvengine.precision.cast_model).
    """
    from . import precision

    for module in model.modules():
        if isinstance(module, precision.Int8WeightLinear) and module.weight.is_contiguous():
            if getattr(module.forward, "__func__", None) is not _int8_row_forward:
                module.mnesio_dense_forward = module.forward
                module.forward = types.MethodType(_int8_row_forward, module)
            continue
        if not isinstance(module, torch.nn.Linear) or module.weight.dtype not in KV_BITS:
            continue
        dense = module.forward  # a copy cast to another dtype may have had it replaced (bf16r), or kept the wrapper
        if getattr(dense, "__func__", None) is _row_forward:
            dense = module.mnesio_dense_forward
        exact = getattr(dense, "__func__", None) is precision.exact_output_forward
        module.mnesio_dense_forward = dense
        module.mnesio_row_dtype = torch.float32 if exact else module.weight.dtype
        module.forward = types.MethodType(_row_forward, module)
    return model
