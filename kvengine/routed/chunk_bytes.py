"""A memory chunk as bytes: one safetensors file, its K/V whole (f32/bf16) or in q8 (quant.py's groups).

Tensors: "ids" (int64 [num_tokens]) and, unquantized, "k"/"v" ``[num_layers, num_kv_heads, num_tokens,
head_dim]``; in q8, quant.quantize_kv's parts of each ("k.exact", "k.q", "k.scale", "k.zero", "k.bits", and
"v.*"): keys grouped per channel, values per token, the first EXACT_PREFIX_TOKENS positions kept as they are
(the chunk's first tokens, where attention concentrates). The header's metadata carries the chunk's first
position, P's digest, the separator's token count and the quant. Keys are stored after RoPE at the chunk's
compiled positions; moving a dequantized key is exact up to its quantization error (rotation.py).
"""
from __future__ import annotations

import torch

from ..config import CHUNK_QUANTS, check_choice
from ..errors import CorruptCartridgeError
from ..format import file_tensors, parse_file, write_file
from ..payload import from_raw, to_raw
from ..quant import KINDS, dequantize_kv, quantize_kv
from .chunks import MemoryChunk

CHUNK_FORMAT = "mnesio-chunk-v1"  # bump when the tensors or metadata below change
_PARTS = ("exact", "q", "scale", "zero", "bits")


def chunk_dumps(chunk: MemoryChunk, *, quant: str = "none") -> bytes:
    """Serialize ``chunk`` (deterministic bytes: format.write_file); ``quant``: "none" (its own dtype) or "q8"."""
    check_choice("quant", quant, CHUNK_QUANTS)
    tensors = {"ids": torch.tensor(chunk.token_ids, dtype=torch.int64)}
    for kind, layers in (("k", chunk.keys), ("v", chunk.values)):
        stacked = torch.stack([t.cpu() for t in layers]).contiguous()  # (num_layers, H, T, D)
        if quant == "none":
            tensors[kind] = stacked
        else:
            for part, tensor in quantize_kv(stacked, quant, axis=KINDS[kind]).items():
                tensors[f"{kind}.{part}"] = tensor.contiguous()
    metadata = {
        "format": CHUNK_FORMAT, "quant": quant, "first_position": str(chunk.first_position), "prefix_sha256": chunk.prefix_sha256,
        "num_separator_tokens": str(chunk.num_separator_tokens),
    }
    return write_file(metadata, {name: to_raw(tensor) for name, tensor in tensors.items()})


def chunk_loads(data: bytes, *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> MemoryChunk:
    """Read ``chunk_dumps``' bytes back into a chunk with K/V in ``dtype`` on ``device``; CorruptCartridgeError if malformed."""
    meta, index, body = parse_file(data)  # CorruptCartridgeError when truncated or garbled
    if meta.get("format") != CHUNK_FORMAT or meta.get("quant") not in CHUNK_QUANTS:
        raise CorruptCartridgeError(f"not a memory chunk of format {CHUNK_FORMAT!r} (format {meta.get('format')!r}, quant {meta.get('quant')!r})")
    try:
        tensors = {name: from_raw(raw) for name, raw in file_tensors(index, body).items()}
        ids = tuple(int(i) for i in tensors["ids"].tolist())
        layers = {}
        for kind in "kv":
            if meta["quant"] == "none":
                stacked = tensors[kind].to(dtype, copy=True)  # off the read-only bytes
            else:
                stacked = dequantize_kv({p: tensors[f"{kind}.{p}"] for p in _PARTS}, meta["quant"], dtype, axis=KINDS[kind])
            if stacked.ndim != 4 or stacked.shape[2] != len(ids):
                raise ValueError(f"{kind} has shape {tuple(stacked.shape)} for {len(ids)} tokens")
            layers[kind] = tuple(t.to(device).contiguous() for t in stacked.unbind(0))
        return MemoryChunk(
            token_ids=ids, keys=layers["k"], values=layers["v"], first_position=int(meta["first_position"]),
            prefix_sha256=meta["prefix_sha256"], num_separator_tokens=int(meta["num_separator_tokens"]),
        )
    except (KeyError, ValueError, RuntimeError) as error:
        raise CorruptCartridgeError(f"a memory chunk's tensors are malformed: {error}") from None
