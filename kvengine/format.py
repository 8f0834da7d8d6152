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

from .errors import CorruptCartridgeError, IncompatibleCartridgeError
from .header import BackendDescription, CartridgeHeader, canonical_json

# The cartridge file layout this engine reads and writes: a change to the stored tensors' names, dtypes, shapes or
# arithmetic bumps it, and a cartridge of another version is refused with "recompile it" (docs/design/cartridge-format.md).
FORMAT_VERSION = 8
# Bytes per element of every safetensors dtype the engines write.
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
# A header larger than this is not one we wrote: refuse before parsing (guards against garbage lengths).
MAX_HEADER_BYTES = 16 * 1024 * 1024
_INT_FIELDS = ("format_version", "num_tokens", "log_head", "block_size")


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
    sha = payload_sha256(header, tensors)
    if header.payload_sha256 and header.payload_sha256 != sha:
        # the in-memory header was computed from other tensors: a bug in the backend, not bad input
        raise AssertionError("header.payload_sha256 does not match the tensors being written")
    return write_file(header_to_metadata(replace(header, payload_sha256=sha)), tensors)


def parse_file(data: bytes | memoryview) -> tuple[dict[str, Any], dict[str, Any], memoryview]:
    """Split a safetensors file into its raw metadata, tensor index and data section; verify the structure.

    The digest is the caller's to check (a cartridge's payload_sha256, a block part's part_sha256).
    """
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
    meta = doc.pop("__metadata__")
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
    return meta, doc, body


def file_tensors(index: Mapping[str, Any], body: memoryview) -> dict[str, RawTensor]:
    """The tensors of a parsed file (zero-copy views into ``body``)."""
    return {
        name: RawTensor(entry["dtype"], tuple(int(d) for d in entry["shape"]), body[entry["data_offsets"][0] : entry["data_offsets"][1]])
        for name, entry in index.items()
    }


def write_file(meta: Mapping[str, str], tensors: Mapping[str, RawTensor]) -> bytes:
    """A deterministic safetensors file of ``tensors`` with the string metadata ``meta`` (sorted keys, 8-aligned)."""
    index, names = _index(tensors)
    doc = {"__metadata__": dict(meta), **index}
    head = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
    return b"".join([struct.pack("<Q", len(head)), head, *(memoryview(tensors[n].data).cast("B") for n in names)])


def _parse(data: bytes | memoryview) -> tuple[CartridgeHeader, dict[str, Any], memoryview]:
    """Split a cartridge file into header, tensor index and data section; verify structure and sha256."""
    meta, doc, body = parse_file(data)
    header = metadata_to_header(meta)
    sha = payload_sha256(header, file_tensors(doc, body))
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
    return header, file_tensors(index, body)


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


# -- blocks and parts (docs/design/blocks.md explains the design) --------------------------------------------
TAIL_PREFIX = "tail."


def block_prefix(index: int) -> str:
    """The tensor-name prefix of full block ``index`` in a whole cartridge file."""
    return f"blocks.{index:05d}."


@dataclass(frozen=True)
class BlockRef:
    """One full block of a cartridge: its chain id, first position, token count and the digest of its part."""

    block_id: str
    first_position: int
    num_tokens: int
    sha256: str  # part_sha256 of the block's part file (payload_digest over its tensor index and data)

    def as_list(self) -> list[Any]:
        return [self.block_id, self.first_position, self.num_tokens, self.sha256]


def blocks_to_json(refs: list[BlockRef] | tuple[BlockRef, ...]) -> str:
    """The header's ``blocks`` field for ``refs``."""
    return canonical_json([ref.as_list() for ref in refs])


def header_blocks(header: CartridgeHeader) -> list[BlockRef]:
    """Parse and check the header's ``blocks`` (consecutive positions, one size); CorruptCartridgeError otherwise."""
    try:
        raw = json.loads(header.blocks)
        refs = [BlockRef(str(b), int(f), int(n), str(s)) for b, f, n, s in raw]
    except (ValueError, TypeError):
        raise CorruptCartridgeError("cartridge header field 'blocks' is not a list of [id, first, tokens, sha256]") from None
    position = 0
    for ref in refs:
        if ref.first_position != position or ref.num_tokens != header.block_size or ref.num_tokens <= 0:
            raise CorruptCartridgeError("cartridge header field 'blocks' is not a chain of consecutive full blocks")
        position += ref.num_tokens
    if position > header.num_tokens:
        raise CorruptCartridgeError("cartridge header's blocks hold more tokens than the cartridge")
    return refs


def tensor_digest(tensors: Mapping[str, RawTensor]) -> str:
    """payload_digest over ``tensors`` as one file would hold them (a block part's part_sha256)."""
    index, names = _index(tensors)
    return payload_digest(index, [memoryview(tensors[n].data).cast("B") for n in names])


def merkle_sha256(block_shas: list[str], tail: Mapping[str, RawTensor]) -> str:
    """The payload_sha256 of a block cartridge: over the blocks' part digests, in order, and the tail's tensors."""
    index, names = _index(tail) if tail else ({}, [])
    h = hashlib.sha256()
    h.update(canonical_json({"blocks": block_shas, "tail": index}).encode())
    h.update(b"\n")
    for name in names:
        h.update(memoryview(tail[name].data).cast("B"))
    return h.hexdigest()


def split_tensors(tensors: Mapping[str, RawTensor], num_blocks: int) -> tuple[list[dict[str, RawTensor]], dict[str, RawTensor]]:
    """A whole file's tensors by part: each block's (prefix removed) and the tail's; refuse stray names."""
    blocks: list[dict[str, RawTensor]] = [{} for _ in range(num_blocks)]
    tail: dict[str, RawTensor] = {}
    for name, tensor in tensors.items():
        if name.startswith(TAIL_PREFIX):
            tail[name[len(TAIL_PREFIX) :]] = tensor
            continue
        head, _, rest = name.partition(".")
        number, _, rest = rest.partition(".")
        if head != "blocks" or not number.isdigit() or int(number) >= num_blocks or not rest:
            raise CorruptCartridgeError(f"cartridge tensor {name!r} belongs to no block of the header nor to the tail")
        blocks[int(number)][rest] = tensor
    return blocks, tail


def join_tensors(blocks: list[Mapping[str, RawTensor]], tail: Mapping[str, RawTensor]) -> dict[str, RawTensor]:
    """The inverse of split_tensors: every part's tensors under its prefix."""
    out = {block_prefix(j) + name: t for j, block in enumerate(blocks) for name, t in block.items()}
    out.update({TAIL_PREFIX + name: t for name, t in tail.items()})
    return out


def payload_sha256(header: CartridgeHeader, tensors: Mapping[str, RawTensor]) -> str:
    """The payload_sha256 a whole file with ``header`` and ``tensors`` carries (merkle_sha256)."""
    refs = header_blocks(header)
    blocks, tail = split_tensors(tensors, len(refs))
    return merkle_sha256([tensor_digest(block) for block in blocks], tail)


def write_block_part(header: CartridgeHeader, ref: BlockRef, tensors: Mapping[str, RawTensor]) -> bytes:
    """The stored file of one block: its tensors, its chain id, position and the cartridge's compatibility key."""
    meta = {
        "mnesio_part": "block", "format_version": str(header.format_version), "block_id": ref.block_id,
        "first_position": str(ref.first_position), "num_tokens": str(ref.num_tokens), "part_sha256": ref.sha256,
        **header.compat_key(),
    }
    return write_file(meta, tensors)


def read_block_part(
    data: bytes | memoryview, *, block_id: str, first_position: int, num_tokens: int, compat_key: Mapping[str, str],
    sha256: str | None = None, digest_checked: bool = False,
) -> tuple[BlockRef, dict[str, RawTensor]]:
    """A stored block's ref and tensors after checking its id, position, compatibility key and digest.

    ``sha256`` (when the caller knows it, from a version's header) must equal the part's digest too.
    ``digest_checked``: the caller verified these exact bytes against a digest of the whole file recorded when the
    part was written (blocks.TrustedPart), so the part digest it carries is taken without hashing the tensors again.
    """
    meta, index, body = parse_file(data)
    expected = {
        "mnesio_part": "block", "format_version": str(FORMAT_VERSION), "block_id": block_id,
        "first_position": str(first_position), "num_tokens": str(num_tokens), **compat_key,
    }
    wrong = sorted(k for k, v in expected.items() if meta.get(k) != v)
    if wrong:
        raise CorruptCartridgeError(f"block {block_id[:12]} is not the block expected (differs in: {', '.join(wrong)})")
    digest = str(meta.get("part_sha256")) if digest_checked else payload_digest(index, [body])
    if digest != meta.get("part_sha256") or (sha256 is not None and digest != sha256):
        raise CorruptCartridgeError(f"block {block_id[:12]} fails its sha256; the stored block is corrupt")
    return BlockRef(block_id, first_position, num_tokens, digest), file_tensors(index, body)


def write_tail_part(header: CartridgeHeader, tail: Mapping[str, RawTensor]) -> bytes:
    """The stored file of a version: the whole header (blocks included) and the tail's tensors."""
    return write_file({**header_to_metadata(header), "mnesio_part": "tail"}, tail)


def read_tail_part(data: bytes | memoryview) -> tuple[CartridgeHeader, list[BlockRef], dict[str, RawTensor]]:
    """The header, block refs and tail tensors of a version's stored file; its digest checked against the header."""
    meta, index, body = parse_file(data)
    if meta.pop("mnesio_part", None) != "tail":
        raise CorruptCartridgeError("the stored file is not a cartridge tail part")
    header = metadata_to_header(meta)
    refs = header_blocks(header)
    tail = file_tensors(index, body)
    if merkle_sha256([ref.sha256 for ref in refs], tail) != header.payload_sha256:
        raise CorruptCartridgeError("the cartridge tail part does not match its header's payload sha256; it is corrupt")
    return header, refs, tail
