"""Block cartridges: KV state cut into fixed-size blocks that versions share, computed one on top of the other.

The log is append-only and attention is causal, so the KV state before a new memory does not change when it
is appended: a new version reuses its parent's blocks, computes only the tail and what changed, and stores
only the blocks no earlier version stored. A block is always computed on top of the blocks before it, so its
bytes depend only on the compatibility key and the token ids up to its end; its chain id (an HMAC under the
scope's secret) names exactly those. The tail (the last partial block and the template's closing) is
recomputed by every version. The header's Merkle digest over the parts commits to every block.

Design (block size, chain ids, positions, quantization per block, digests, stored forms):
docs/design/blocks.md.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from .format import FORMAT_VERSION, BlockRef, write_block_part, write_tail_part
from .header import CartridgeHeader, canonical_json
from .plans import calibrated_plan

BLOCK_SIZE = 64  # tokens per full block (transformers backend); a multiple of every quantization group length
# A lookup of stored block parts by block id (None: not stored). compile() reuses the longest run of
# blocks from block 0 that it finds; load_parts() needs every one.
BlockLookup = Callable[[str], "bytes | memoryview | TrustedPart | None"]


@dataclass(frozen=True)
class TrustedPart:
    """A block part a BlockLookup vouches for: the caller verified these exact bytes against the sha256 of the whole
    file recorded when the part was written (the Django side's block store does, at every read). compile() then
    checks the part's id, position and compatibility key but does not hash its tensors again: at 8k tokens that
    is ~350 MB of sha256 per incremental compile, for bytes verified moments before."""

    data: bytes | memoryview


def key_digest(compat_key: dict[str, str]) -> str:
    """The digest of a compatibility key and the file format version (a block id's and a version's key), and of q4's
    calibrated bits per KV head when the weights have a plan (plans.calibrated_plan): a block quantized under another
    plan gets another id, so a recalibration never mixes old blocks into a new version."""
    key: dict = {**compat_key, "format_version": FORMAT_VERSION}
    plan = calibrated_plan(compat_key.get("quant", ""), compat_key.get("weights_fingerprint", ""))
    if plan is not None:
        key["bit_plan"] = plan
    return hashlib.sha256(canonical_json(key).encode()).hexdigest()


def block_id(*, parent: str, key: str, block_size: int, first_position: int, token_ids: Sequence[int], secret: bytes = b"") -> str:
    """The chain id of a block: HMAC-SHA256 under ``secret``, a plain sha256 without one (docs/design/blocks.md, "Chain ids")."""
    if not isinstance(secret, bytes):
        raise TypeError(f"`secret` has to be bytes but got {type(secret).__name__}")
    h = hmac.new(secret, digestmod=hashlib.sha256) if secret else hashlib.sha256()
    h.update(canonical_json({"parent": parent, "key": key, "block_size": block_size, "first": first_position}).encode())
    h.update(b"\n")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.hexdigest()


def chain(token_ids: Sequence[int], *, num_blocks: int, block_size: int, key: str, secret: bytes = b"") -> list[tuple[str, int]]:
    """(block id, first position) of the first ``num_blocks`` full blocks of ``token_ids``, keyed by ``secret``."""
    out, parent = [], ""
    for index in range(num_blocks):
        first = index * block_size
        parent = block_id(
            parent=parent, key=key, block_size=block_size, first_position=first, token_ids=token_ids[first : first + block_size], secret=secret
        )
        out.append((parent, first))
    return out


def num_full_blocks(num_tokens: int, num_closing: int, block_size: int) -> int:
    """Full blocks in a prefix of ``num_tokens`` whose last ``num_closing`` tokens are the template's closing."""
    return max(0, num_tokens - num_closing) // block_size


@dataclass(frozen=True)
class CartridgeParts:
    """A cartridge as stored by parts: the tail part (header + tail tensors) and each block's part, in order."""

    tail: bytes
    blocks: tuple[tuple[BlockRef, bytes | None], ...]  # None: a block the caller stores already (not serialized)

    @property
    def digest(self) -> str:
        """sha256 of the tail part: the version digest (it commits to every block through the header)."""
        return hashlib.sha256(self.tail).hexdigest()

    @property
    def size_bytes(self) -> int:
        """Bytes of the parts serialized here (a block left out as stored counts nothing)."""
        return len(self.tail) + sum(len(data) for _, data in self.blocks if data is not None)


def parts_write(
    header: CartridgeHeader, refs: Sequence[BlockRef], part: Callable[[int], dict], *, stored: Container[BlockRef] = ()
) -> CartridgeParts:
    """Serialize a cartridge's parts: ``part(i)`` gives part i's tensors (the blocks in order, ``len(refs)`` the
    tail), asked for only when serialized; a block whose ref (id and digest) is in ``stored`` is not serialized
    again (its bytes are None): an incremental compile's reused blocks."""
    blocks = tuple((ref, None if ref in stored else write_block_part(header, ref, part(index))) for index, ref in enumerate(refs))
    return CartridgeParts(tail=write_tail_part(header, part(len(refs))), blocks=blocks)
