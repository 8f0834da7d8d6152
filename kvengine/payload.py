"""A transformers cartridge's tensors: the servable KV state in memory and the tensors stored in its file.

Stored tensors, per layer ``i`` (zero-padded to three digits), each ``[1, num_kv_heads, num_tokens, head_dim]``
in the cartridge's dtype:

- quant "none": ``layers.{i}.k`` and ``layers.{i}.v``;
- q8 / q4: for ``kv`` in k, v the parts of quant.quantize_kv: ``layers.{i}.{kv}.exact`` (the leading positions,
  unquantized), ``.q`` (codes, two per byte for q4), ``.scale`` and ``.zero`` (float16). Keys are quantized
  per channel (their outliers sit in fixed channels), values per token (see quant.py).

A quantized cartridge serves its dequantized state, so compile() and loads() give the same answers. The names,
dtypes and shapes here are the file format (format.py writes them): changing them changes cartridge bytes.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .errors import CorruptCartridgeError
from .format import RawTensor, tensors_sha256
from .kvcache import KvState
from .quant import dequantize_kv, quantize_kv

# torch dtype <-> safetensors dtype name, for every dtype a cartridge stores
ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64"}
TORCH_FROM_ST = {name: dtype for dtype, name in ST_DTYPES.items()}
QUANT_PARTS = ("exact", "q", "scale", "zero")  # see quant.quantize_kv
QUANT_AXIS = {"k": "channel", "v": "token"}  # keys per channel, values per token (see quant.py)


@dataclass
class KvPayload:
    """A transformers cartridge in memory: the servable KV state and (if quantized) its stored form."""

    state: KvState
    stored: dict[str, RawTensor] | None  # quantized parts as written to disk; None when quant == "none"

    def tensors(self) -> dict[str, RawTensor]:
        """The tensors the cartridge file holds (the quantized parts, or the state's cartridge region)."""
        if self.stored is not None:
            return self.stored
        keys, values = zip(*(self.state.prefix(layer) for layer in range(self.state.num_layers)), strict=True)
        return raw_layers(keys, values)


def to_raw(tensor: torch.Tensor) -> RawTensor:
    """A torch tensor as safetensors raw bytes (zero-copy for contiguous CPU tensors)."""
    tensor = tensor.detach().to("cpu").contiguous()
    return RawTensor(ST_DTYPES[tensor.dtype], tuple(tensor.shape), tensor.view(torch.uint8).numpy().reshape(-1).data)


def from_raw(raw: RawTensor) -> torch.Tensor:
    """A read-only torch view of stored bytes (copy before writing)."""
    dtype = TORCH_FROM_ST[raw.dtype]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "buffer is not writable": we only read it
        flat = torch.frombuffer(raw.data, dtype=dtype) if raw.num_bytes else torch.empty(0, dtype=dtype)
    return flat.view(raw.shape)


def raw_layers(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> dict[str, RawTensor]:
    """Unquantized per-layer keys and values ``[1, num_kv_heads, num_tokens, head_dim]`` as stored tensors."""
    raw = {}
    for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
        raw[f"layers.{layer:03d}.k"] = to_raw(key)
        raw[f"layers.{layer:03d}.v"] = to_raw(value)
    return raw


def quantized_names(num_layers: int) -> list[str]:
    """The stored tensor names of a quantized cartridge with ``num_layers`` layers."""
    return [f"layers.{layer:03d}.{kv}.{part}" for layer in range(num_layers) for kv in "kv" for part in QUANT_PARTS]


def quantize_layers(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], quant: str) -> dict[str, RawTensor]:
    """Quantize per-layer keys and values into their stored parts."""
    stored = {}
    for layer, (key, value) in enumerate(zip(keys, values, strict=True)):
        for kv, tensor in (("k", key), ("v", value)):
            for part, part_tensor in quantize_kv(tensor, quant, axis=QUANT_AXIS[kv]).items():
                stored[f"layers.{layer:03d}.{kv}.{part}"] = to_raw(part_tensor)
    return stored


def dequantize_layers(
    stored: Mapping[str, RawTensor], num_layers: int, quant: str, dtype: torch.dtype, device: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Invert quantize_layers(): per-layer keys and values in ``dtype`` on ``device``; KeyError if a part is missing."""
    keys, values = [], []
    for layer in range(num_layers):
        for kv, out in (("k", keys), ("v", values)):
            parts = {part: from_raw(stored[f"layers.{layer:03d}.{kv}.{part}"]).to(device) for part in QUANT_PARTS}
            out.append(dequantize_kv(parts, quant, dtype, axis=QUANT_AXIS[kv]))
    return keys, values


def build_payload(
    keys: list[torch.Tensor], values: list[torch.Tensor], *, quant: str, dtype: torch.dtype, device: str
) -> tuple[KvPayload, str]:
    """The payload for freshly computed KV (quantized if ``quant`` says so) and its file's payload sha256.

    A quantized payload serves the dequantized values, exactly what loads() will serve from the file.
    Call under torch.inference_mode().
    """
    keys, values = [k.to(dtype) for k in keys], [v.to(dtype) for v in values]  # bf16r's prefill keeps f32 keys
    stored = None
    if quant != "none":
        stored = quantize_layers(keys, values, quant)
        keys, values = dequantize_layers(stored, len(keys), quant, dtype, device)
    sha = tensors_sha256(stored if stored is not None else raw_layers(keys, values))
    return KvPayload(state=KvState(keys, values), stored=stored), sha


def load_payload(
    tensors: Mapping[str, RawTensor], *, num_layers: int, num_tokens: int, quant: str, dtype: torch.dtype, device: str
) -> KvPayload:
    """The payload of a verified cartridge file's ``tensors``; CorruptCartridgeError if they do not fit the header.

    Call under torch.inference_mode(). The stored parts of a quantized cartridge are copied out of the
    file's buffer, so the payload does not keep the whole file alive.
    """
    try:
        if quant == "none":
            keys = [from_raw(tensors[f"layers.{layer:03d}.k"]).to(device) for layer in range(num_layers)]
            values = [from_raw(tensors[f"layers.{layer:03d}.v"]).to(device) for layer in range(num_layers)]
            stored = None
        else:
            stored = {name: tensors[name] for name in quantized_names(num_layers)}
            keys, values = dequantize_layers(stored, num_layers, quant, dtype, device)
        if any(tensor.shape[-2] != num_tokens or tensor.dtype != dtype for tensor in keys + values):
            raise CorruptCartridgeError("cartridge tensors do not match the header's num_tokens and dtype")
        state = KvState(keys, values)
    except KeyError as exc:
        raise CorruptCartridgeError(f"cartridge lacks the tensor {exc.args[0]!r}; the file is incomplete") from None
    if stored is not None:
        stored = {name: RawTensor(raw.dtype, raw.shape, bytes(raw.data)) for name, raw in stored.items()}  # own the bytes
    return KvPayload(state=state, stored=stored)
