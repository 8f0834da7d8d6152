"""A transformers cartridge's tensors: the servable KV state in memory and the tensors stored in its file.

Each part (a full block or the tail, blocks.py) stores, per kind, every layer stacked in one tensor
``[num_layers, 1, num_kv_heads, part_tokens, head_dim]``: ``k`` and ``v`` unquantized, or quant.quantize_kv's
parts (``.exact``, ``.bits``, ``.q``, ``.scale``, ``.zero``) for q8/q4. A quantized cartridge serves its
dequantized state, so compile() and loads() give the same answers. The names, dtypes and shapes here are the
file format (format.py writes them): changing them changes cartridge bytes.

Layout of every tensor: docs/design/cartridge-format.md.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .errors import CorruptCartridgeError
from .format import RawTensor, join_tensors
from .kvcache import KvState
from .quant import EXACT_PREFIX_TOKENS, INT_ZERO, KINDS, code_bytes, dequantize_kv, group_size, quantize_kv, token_group

# torch dtype <-> safetensors dtype name, for every dtype a cartridge stores
ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8", torch.uint8: "U8", torch.int64: "I64"}
TORCH_FROM_ST = {name: dtype for dtype, name in ST_DTYPES.items()}
QUANT_PARTS = ("exact", "q", "scale", "zero", "bits")  # see quant.quantize_kv
QUANT_AXIS = KINDS  # keys per channel, values per token (see quant.py)


@dataclass
class KvPayload:
    """A transformers cartridge in memory: the servable KV state, its parts' token bounds and stored forms.

    ``bounds`` are the first positions of each full block and of the tail, then the token count. ``stored``
    holds each part's quantized tensors (blocks in order, the tail last) when quantized; None when not, the
    parts' tensors then being slices of the state.
    """

    state: KvState
    bounds: list[int]
    stored: list[dict[str, RawTensor]] | None

    @property
    def num_parts(self) -> int:
        """Full blocks plus the tail."""
        return len(self.bounds) - 1

    def part_tensor(self, index: int) -> dict[str, RawTensor]:
        """The stored tensors of part ``index`` (a full block; ``num_parts - 1``: the tail), made when asked (an
        unquantized part stacks its layers: a copy, so a caller that needs one part does not pay for all)."""
        if self.stored is not None:
            return self.stored[index]
        begin, end = self.bounds[index], self.bounds[index + 1]
        keys, values = zip(*(self.state.prefix(layer) for layer in range(self.state.num_layers)), strict=True)
        return raw_layers([k[:, :, begin:end] for k in keys], [v[:, :, begin:end] for v in values])

    def part_tensors(self) -> list[dict[str, RawTensor]]:
        """The stored tensors of every part: each full block, then the tail."""
        return [self.part_tensor(index) for index in range(self.num_parts)]

    def tensors(self) -> dict[str, RawTensor]:
        """The tensors the whole cartridge file holds (format.join_tensors of the parts)."""
        parts = self.part_tensors()
        return join_tensors(parts[:-1], parts[-1])


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
    """Unquantized per-layer keys and values ``[1, num_kv_heads, num_tokens, head_dim]`` as the stored "k" and "v"
    ``[num_layers, 1, num_kv_heads, num_tokens, head_dim]`` (one tensor per kind: a part's header stays small)."""
    return {"k": to_raw(torch.stack(list(keys))), "v": to_raw(torch.stack(list(values)))}


def quantized_names() -> list[str]:
    """The stored tensor names of a quantized part (every layer stacked in each)."""
    return [f"{kv}.{part}" for kv in "kv" for part in QUANT_PARTS]


def quantize_layers(
    keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], quant: str, *, exact: int = EXACT_PREFIX_TOKENS,
    plan: Mapping[str, Sequence] | None = None,
) -> dict[str, RawTensor]:
    """Quantize per-layer keys and values, stacked, into their stored parts (the first ``exact`` positions kept),
    each layer's heads with their ``plan`` bits (quant.bit_plan; None: quant.AXIS_BITS')."""
    stored = {}
    for kv, tensors in (("k", keys), ("v", values)):
        bits = plan[kv] if plan is not None else None
        for part, part_tensor in quantize_kv(torch.stack(list(tensors)), quant, axis=QUANT_AXIS[kv], exact=exact, bits=bits).items():
            stored[f"{kv}.{part}"] = to_raw(part_tensor)
    return stored


def dequantize_layers(
    stored: Mapping[str, RawTensor], num_layers: int, quant: str, dtype: torch.dtype, device: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Invert quantize_layers(): per-layer keys and values in ``dtype`` on ``device``; KeyError if a part is missing,
    ValueError if the parts do not fit each other."""
    out = []
    for kv in "kv":
        parts = {part: from_raw(stored[f"{kv}.{part}"]).to(device) for part in QUANT_PARTS}
        stacked = dequantize_kv(parts, quant, dtype, axis=QUANT_AXIS[kv])
        if stacked.shape[0] != num_layers:
            raise CorruptCartridgeError(f"cartridge part holds {stacked.shape[0]} layers but the model has {num_layers}")
        out.append(list(stacked.unbind(0)))
    return out[0], out[1]


def part_store(
    keys: list[torch.Tensor], values: list[torch.Tensor], *, quant: str, dtype: torch.dtype, device: str, first_position: int,
    plan: Mapping[str, Sequence] | None = None,
) -> tuple[dict[str, RawTensor] | None, list[torch.Tensor], list[torch.Tensor]]:
    """One part's freshly computed KV: its stored tensors (None when unquantized) and what it serves.

    The served keys and values are what the next block attends to and what loads() gives back: the
    dequantized values when quantized, else the KV cast to ``dtype`` (bf16r's prefill keeps f32 keys). The
    cartridge's first EXACT_PREFIX_TOKENS positions stay exact (quant.py). Call under torch.inference_mode().
    """
    keys, values = [k.to(dtype) for k in keys], [v.to(dtype) for v in values]
    if quant == "none":
        return None, keys, values
    exact = max(0, EXACT_PREFIX_TOKENS - first_position)
    stored = quantize_layers(keys, values, quant, exact=exact, plan=plan)
    keys, values = dequantize_layers(stored, len(keys), quant, dtype, device)
    return stored, keys, values


def _check_stored(
    tensors: Mapping[str, RawTensor], *, num_layers: int, num_tokens: int, quant: str, kv_shape: tuple[int, int], dtype: torch.dtype
) -> None:
    """Refuse a part whose tensors' dtypes, shapes and code bytes are not the ones the model, the header and its own
    bits imply, before any is decoded (a forged ``head_dim`` would otherwise size a Hadamard matrix, a forged
    ``bits`` the code split, a short ``q`` be broadcast over the positions)."""
    heads, head_dim = kv_shape
    kv_dtype = ST_DTYPES[dtype]
    if quant == "none":
        for kv in "kv":
            if tensors[kv].dtype != kv_dtype or tensors[kv].shape != (num_layers, 1, heads, num_tokens, head_dim):
                raise CorruptCartridgeError(f"cartridge tensor {kv!r} is {tensors[kv].dtype} {tensors[kv].shape}, not the model's")
        return
    for kv, axis in KINDS.items():
        exact = tensors[f"{kv}.exact"]
        bits, codes = tensors[f"{kv}.bits"], tensors[f"{kv}.q"]
        if (exact.dtype != kv_dtype or len(exact.shape) != 5 or exact.shape[:3] != (num_layers, 1, heads) or exact.shape[4] != head_dim
                or exact.shape[3] > num_tokens):
            raise CorruptCartridgeError(f"cartridge tensor {kv + '.exact'!r} is {exact.dtype} {exact.shape}, not the model's")
        if bits.dtype != "U8" or bits.shape != (num_layers, heads) or codes.dtype != "U8" or len(codes.shape) != 1:
            raise CorruptCartridgeError(f"cartridge tensors {kv + '.bits'!r} and {kv + '.q'!r} are not uint8 [layers, heads] and a uint8 row")
        rest = num_tokens - exact.shape[3]
        try:
            widths = [code_bytes(b, head_dim, quant, axis) for b in bytes(bits.data)]
        except ValueError as exc:
            raise CorruptCartridgeError(f"cartridge tensor {kv + '.bits'!r} holds bits the format lacks: {exc}") from None
        if codes.shape[0] != rest * sum(widths):
            raise CorruptCartridgeError(f"cartridge tensor {kv + '.q'!r} holds {codes.shape[0]} code bytes, not the {rest * sum(widths)} of "
                                        f"{rest} positions at its bits")
        groups = (head_dim, -(-rest // token_group(quant))) if axis == "channel" else (rest, head_dim // group_size(head_dim, quant))
        zero_dtype = "U8" if INT_ZERO[(quant, axis)] else "F16"
        for name, dtype in (("scale", "F16"), ("zero", zero_dtype)):
            raw = tensors[f"{kv}.{name}"]
            if raw.dtype != dtype or raw.shape != (num_layers, 1, heads, *groups):
                raise CorruptCartridgeError(f"cartridge tensor {kv + '.' + name!r} is {raw.dtype} {raw.shape}, not the format's")


def part_serve(
    tensors: Mapping[str, RawTensor], *, num_layers: int, num_tokens: int, quant: str, dtype: torch.dtype, device: str,
    kv_shape: tuple[int, int],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The served keys and values of one stored part; CorruptCartridgeError if its tensors do not fit (``kv_shape``:
    the model's KV heads and head_dim)."""
    try:
        _check_stored(tensors, num_layers=num_layers, num_tokens=num_tokens, quant=quant, kv_shape=kv_shape, dtype=dtype)
        if quant == "none":
            keys, values = (list(from_raw(tensors[kv]).to(device).unbind(0)) for kv in "kv")
            if len(keys) != num_layers or len(values) != num_layers:
                raise CorruptCartridgeError(f"cartridge part holds {len(keys)} layers but the model has {num_layers}")
        else:
            keys, values = dequantize_layers(tensors, num_layers, quant, dtype, device)
    except KeyError as exc:
        raise CorruptCartridgeError(f"cartridge lacks the tensor {exc.args[0]!r}; the file is incomplete") from None
    except CorruptCartridgeError:
        raise
    except (ValueError, RuntimeError, IndexError, TypeError, ZeroDivisionError, OverflowError) as exc:  # what the checks missed
        raise CorruptCartridgeError(f"cartridge part's quantized tensors do not fit each other: {exc}") from None
    if any(tensor.shape[-2] != num_tokens or tensor.dtype != dtype for tensor in keys + values):
        raise CorruptCartridgeError("cartridge tensors do not match the header's token counts and dtype")
    expected = quantized_names() if quant != "none" else ["k", "v"]
    if sorted(tensors) != sorted(expected):
        raise CorruptCartridgeError("cartridge part holds tensors the format does not name")
    return keys, values


def payload_of(
    parts: Sequence[tuple[list[torch.Tensor], list[torch.Tensor]]], stored: list[dict[str, RawTensor]] | None, bounds: list[int],
    *, state: KvState | None = None,
) -> KvPayload:
    """A payload from each part's served keys and values (in order), copied into one KvState (or ``state``: those
    parts already in place, compile()'s)."""
    if stored is not None:  # own the bytes: the payload must not keep a whole file's buffer alive
        stored = [{name: RawTensor(raw.dtype, raw.shape, bytes(raw.data)) for name, raw in part.items()} for part in stored]
    if state is None:
        state = KvState.of_parts(list(parts))
    return KvPayload(state=state, bounds=list(bounds), stored=stored)
