"""The cartridge file: a safetensors file whose header metadata carries the full CartridgeHeader.

Layout (the standard safetensors layout, written here byte by byte so the output is deterministic):

    [8 bytes little-endian u64 N][N bytes JSON header, space-padded to a multiple of 8][data section]

The JSON header has sorted keys: ``"__metadata__"`` (every CartridgeHeader field as a string; ``labels``
as canonical JSON) and one entry per tensor ``{"dtype", "shape", "data_offsets"}``. Tensors are laid out
in sorted name order. Any safetensors reader can open the file (``safetensors.numpy.load`` /
``safetensors.torch.load``).

``payload_sha256`` = sha256 over ``canonical_json(tensor index) + b"\\n" + data section``, so a garbled
shape or dtype in the header is caught as well as flipped data bytes. Only json and hashlib are needed to
check a blob (``read_header``), so the Django side can verify integrity without torch.
"""
from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .base import BackendDescription, CartridgeHeader, canonical_json
from .errors import CorruptCartridgeError, IncompatibleCartridgeError

FORMAT_VERSION = 3  # 2: q8/q4 keep their first positions exact ("exact" parts); 3: rotated q8/q4, q4 in 32-value groups (quant.py)
# Bytes per element of every safetensors dtype the engines write.
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
# A header larger than this is not one we wrote: refuse before parsing (guards against garbage lengths).
MAX_HEADER_BYTES = 16 * 1024 * 1024
_INT_FIELDS = ("format_version", "num_tokens", "log_head")


@dataclass(frozen=True)
class RawTensor:
    """One stored tensor: safetensors dtype name, shape, and its raw little-endian bytes."""

    dtype: str  # a key of DTYPE_SIZES
    shape: tuple[int, ...]
    data: bytes | memoryview

    @property
    def num_bytes(self) -> int:
        n = DTYPE_SIZES[self.dtype]
        for dim in self.shape:
            n *= dim
        return n


def _index(tensors: Mapping[str, RawTensor]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Compute the tensor index (dtype, shape, offsets) in sorted name order."""
    index: dict[str, dict[str, Any]] = {}
    names = sorted(tensors)
    offset = 0
    for name in names:
        t = tensors[name]
        if name == "__metadata__" or not name:
            raise ValueError(f"tensor name {name!r} is reserved or empty")
        if t.dtype not in DTYPE_SIZES:
            raise ValueError(f"`dtype` of tensor {name!r} has to be one of {sorted(DTYPE_SIZES)} but got {t.dtype!r}")
        size = len(memoryview(t.data).cast("B"))
        if size != t.num_bytes:
            raise ValueError(f"tensor {name!r} has {size} bytes but dtype {t.dtype} and shape {t.shape} need {t.num_bytes}")
        index[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    return index, names


def payload_digest(index: Mapping[str, Any], chunks: list[bytes | memoryview]) -> str:
    """sha256 over the canonical tensor index and the data section (see the module docstring)."""
    h = hashlib.sha256()
    h.update(canonical_json(dict(index)).encode())
    h.update(b"\n")
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def tensors_sha256(tensors: Mapping[str, RawTensor]) -> str:
    """The payload_sha256 the file for ``tensors`` will carry (compile() uses it to fill the header)."""
    index, names = _index(tensors)
    return payload_digest(index, [memoryview(tensors[n].data).cast("B") for n in names])


def header_to_metadata(header: CartridgeHeader) -> dict[str, str]:
    """Every CartridgeHeader field as a string (labels as canonical JSON)."""
    meta: dict[str, str] = {}
    for f in fields(CartridgeHeader):
        value = getattr(header, f.name)
        meta[f.name] = canonical_json(value) if f.name == "labels" else str(value)
    return meta


def metadata_to_header(meta: Mapping[str, Any]) -> CartridgeHeader:
    """Parse header metadata back; raise CorruptCartridgeError naming the missing or bad field."""
    values: dict[str, Any] = {}
    for f in fields(CartridgeHeader):
        if f.name not in meta:
            raise CorruptCartridgeError(f"cartridge header lacks the field {f.name!r}; the file is not a mnesio cartridge")
        raw = meta[f.name]
        if not isinstance(raw, str):
            raise CorruptCartridgeError(f"cartridge header field {f.name!r} is not a string")
        if f.name in _INT_FIELDS:
            try:
                values[f.name] = int(raw)
            except ValueError:
                raise CorruptCartridgeError(f"cartridge header field {f.name!r} is not an integer") from None
        elif f.name == "labels":
            try:
                labels = json.loads(raw)
            except ValueError:
                raise CorruptCartridgeError("cartridge header field 'labels' is not JSON") from None
            if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
                raise CorruptCartridgeError("cartridge header field 'labels' is not a string-to-string map")
            values[f.name] = labels
        else:
            values[f.name] = raw
    return CartridgeHeader(**values)


def write_cartridge(header: CartridgeHeader, tensors: Mapping[str, RawTensor]) -> bytes:
    """Serialize ``tensors`` with ``header`` (its payload_sha256 is recomputed); deterministic bytes."""
    if not tensors:
        raise ValueError("a cartridge needs at least one tensor")
    index, names = _index(tensors)
    chunks = [memoryview(tensors[n].data).cast("B") for n in names]
    sha = payload_digest(index, chunks)
    if header.payload_sha256 and header.payload_sha256 != sha:
        # the in-memory header was computed from other tensors: a bug in the backend, not bad input
        raise AssertionError("header.payload_sha256 does not match the tensors being written")
    meta = header_to_metadata(replace(header, payload_sha256=sha))
    doc = {"__metadata__": meta, **index}
    head = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
    return b"".join([struct.pack("<Q", len(head)), head, *chunks])


def _parse(data: bytes | memoryview) -> tuple[CartridgeHeader, dict[str, Any], memoryview]:
    """Split a file into header, tensor index and data section; verify structure and sha256."""
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise CorruptCartridgeError(f"cartridge file is truncated: {len(view)} bytes, not even a header length")
    (n,) = struct.unpack("<Q", view[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(view):
        raise CorruptCartridgeError(
            f"cartridge file is truncated or garbled: header length {n} but the file has {len(view)} bytes"
        )
    try:
        doc = json.loads(bytes(view[8 : 8 + n]))
    except (ValueError, UnicodeDecodeError):
        raise CorruptCartridgeError("cartridge header is not valid JSON; the file is garbled") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("__metadata__"), dict):
        raise CorruptCartridgeError("cartridge header has no __metadata__; the file is not a mnesio cartridge")
    header = metadata_to_header(doc.pop("__metadata__"))
    body = view[8 + n :]
    expected = 0
    for name in sorted(doc):
        entry = doc[name]
        try:
            begin, end = entry["data_offsets"]
            num = DTYPE_SIZES[entry["dtype"]]
            for dim in entry["shape"]:
                num *= int(dim)
        except (KeyError, TypeError, ValueError):
            raise CorruptCartridgeError(f"cartridge tensor entry {name!r} is malformed") from None
        if begin != expected or end - begin != num:
            raise CorruptCartridgeError(f"cartridge tensor {name!r} has inconsistent offsets; the file is garbled")
        expected = end
    if expected != len(body):
        raise CorruptCartridgeError(
            f"cartridge data section has {len(body)} bytes but the header describes {expected}; the file is truncated"
        )
    sha = payload_digest(doc, [body])
    if sha != header.payload_sha256:
        raise CorruptCartridgeError(
            f"cartridge payload sha256 is {sha} but the header says {header.payload_sha256}; the file is corrupt"
        )
    return header, doc, body


def read_header(data: bytes | memoryview) -> CartridgeHeader:
    """Return the header of a cartridge file after verifying its structure and payload sha256."""
    header, _, _ = _parse(data)
    return header


def read_cartridge(data: bytes | memoryview) -> tuple[CartridgeHeader, dict[str, RawTensor]]:
    """Return the verified header and the tensors (zero-copy views into ``data``)."""
    header, index, body = _parse(data)
    tensors = {
        name: RawTensor(entry["dtype"], tuple(int(d) for d in entry["shape"]), body[entry["data_offsets"][0] : entry["data_offsets"][1]])
        for name, entry in index.items()
    }
    return header, tensors


def check_compatible(header: CartridgeHeader, description: BackendDescription) -> None:
    """Refuse a cartridge whose compatibility key differs from the backend's, naming every difference."""
    if header.format_version != FORMAT_VERSION:
        raise IncompatibleCartridgeError(
            f"cartridge format_version is {header.format_version} but this engine reads {FORMAT_VERSION}; recompile it"
        )
    mine = description.compat_key()
    theirs = header.compat_key()
    diffs = [f"{k}: cartridge {theirs[k]!r} != backend {mine[k]!r}" for k in mine if mine[k] != theirs.get(k)]
    if diffs:
        raise IncompatibleCartridgeError(
            "cartridge was compiled for another configuration (" + "; ".join(diffs) + "); recompile it for this backend"
        )
