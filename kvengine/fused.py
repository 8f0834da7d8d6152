"""The fused decoding-attention kernel (kvengine/native/decode_attention.c): built on first use, called through ctypes.

kvengine.attention sends a single-token step here; ``decode_attention`` returns None for anything the kernel does
not take (then the flash kernel serves). The library is built with the system C compiler (``$CC``, else cc) into
``<MNESIO_MODEL_CACHE_DIR>/kernels/``, named by a hash of the source and the flags: into a temporary file, then
renamed, so processes building at once each load a whole library. The folder must be the process owner's and
writable by no one else, or nothing there is loaded. No compiler, a failed build or a CPU without AVX-512F: the
kernel is unavailable (logged once) and answers are the flash kernel's.

Design and measurements: docs/design/attention.md, "A fused decoding kernel".
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
from pathlib import Path

import torch

from .models import default_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parent / "native" / "decode_attention.c"
FLAGS = ("-O3", "-mavx512f", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11")
HEAD_DIM, MAX_ROWS = 64, 16  # the shapes the kernel takes (decode_attention.c)
KV_BITS = {torch.bfloat16: 16, torch.float32: 32}


def library_path(folder: Path | None = None) -> Path:
    """Where the library of this source and these flags is (or would be) built."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    return (folder or default_cache_dir() / "kernels") / f"decode_attention-{digest}.so"


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
        subprocess.run([compiler, *FLAGS, "-o", temporary, str(SOURCE), "-lm"], check=True, capture_output=True, timeout=120)
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
        log.warning("kvengine: the fused decoding kernel is unavailable (%s); the flash kernel serves", exc)
        return None
    if not lib.mnesio_decode_attention_supported():
        log.warning("kvengine: this CPU lacks AVX-512F; the flash kernel serves single-token steps")
        return None
    lib.mnesio_decode_attention.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 5 + [ctypes.c_void_p] * 3
    lib.mnesio_decode_attention.restype = ctypes.c_int
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


def decode_attention(packed: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor | None:
    """softmax(q k^T * scale) v for packed queries ``[1, kv, rows, 64]`` over ``key, value [1, kv, n, 64]``, in the
    values' dtype; None when the kernel does not take the step or is unavailable (the caller runs the flash kernel)."""
    if not takes(packed, key, value) or (lib := kernel()) is None:
        return None
    _, heads, rows, dim = packed.shape
    n = key.shape[2]
    q = (packed[0].float() * scale).contiguous()  # [kv, rows, d]
    threads = torch.get_num_threads()
    scores = torch.empty(rows * n, dtype=torch.float32)
    part = torch.empty(threads * heads * rows * (dim + 2), dtype=torch.float32)  # per thread: outputs, max, sum
    out = torch.empty(heads, rows, dim, dtype=torch.float32)
    rc = lib.mnesio_decode_attention(q.data_ptr(), key.data_ptr(), value.data_ptr(), key.stride(1), n, heads, rows,
                                     dim, KV_BITS[key.dtype], threads, scores.data_ptr(), part.data_ptr(), out.data_ptr())
    if rc != 0:
        return None
    return out.to(value.dtype).unsqueeze(0)
