"""Block cartridges (format 4): KV state cut into fixed-size blocks that versions share, computed one on top of the other.

Why: the log is append-only and attention is causal, so the KV state of everything before a new memory does
not change when it is appended. A cartridge that is a chain of blocks lets a new version reuse its parent's
blocks and compute only what changed, and lets every version store only the blocks no earlier version stored.

Decisions
---------
- **Blocks over token ids.** A cartridge's prefix tokens (the chat template's system turn with the memories)
  are cut into full blocks of ``block_size`` tokens (BLOCK_SIZE, 64, for the transformers backend; it is in
  the header and in every block id, so a change makes new ids). What follows the last full block is the
  **tail**: the last partial block, the template's closing of the system turn and the user-turn opener. The
  tail is recomputed by every version; it is never shared.
- **Why 64 tokens (256 before).** An append recomputes the tail: the last partial block (half a block on average)
  plus the new memory. With 256-token blocks that was ~200 tokens per append for a ~70-token memory, and the
  freshness cycle (the incremental compile plus the gate's re-reading of the same tokens) followed it: on a
  7.4k-token scope of SmolLM2, 1 thread, 11 appends alternated between two block sizes in one process
  (bench/block_size_bench.py), 256 gave a cycle of p50 5.35 s (max 8.55 s, 202.5 tokens computed on average) and 64
  gave p50 3.50 s (max 4.10 s, 103.5 tokens). The price is a full compile cut into 4x as many passes, each reading
  every weight: 58.2 s against 51.3 s (+14%) there, +36% with 2 threads through the services (BENCHMARKS.md,
  "Blocks of 64 tokens"). Appends happen all day, full compiles once per scope and configuration, so the cycle
  wins; MNESIO_KV_BLOCK_SIZE lets an operator choose otherwise. q8's 16-token and q4's 64-token key
  groups still divide the block; 64 keeps q4 at 0.158x of f32 at 1k tokens (the parts' headers cost 0.0003x).
- **A block is computed on top of the blocks before it, always.** Block i's KV is the prefill of block i's
  tokens with blocks 0..i-1 in the cache, in a full compile and an incremental one alike, so its bytes depend
  only on the compatibility key and the token ids up to its end. The cache the next block attends to holds
  exactly what is served (a quantized block's dequantized values, a bf16 block's bf16 values), so a block
  loaded from storage and the block just computed are the same input to the next one. The attention over the
  cache runs on contiguous tensors whose shape depends only on the token count (never on a buffer's spare
  capacity), so the arithmetic does not depend on which compile computes a block.
- **Chain ids.** ``block_id = HMAC-SHA256(secret, parent id, compatibility key digest, block size, first
  position, token ids)``: equal ids under one secret mean equal token ids from position 0 to the block's end under
  the same model, weights, tokenizer, template, rope, dtype and quant, hence (above) equal bytes. Block 0's parent
  is "". The secret is the caller's (``compile``/``verify_extension`` take ``block_secret``): without it an id is
  a plain hash of public values and the token ids, and anyone holding an id could test a guess of the text
  (a 4-digit PIN in milliseconds). The Django side passes a secret per scope (cartridges.blocksecret): ids of one
  scope are stable across its versions (blocks are shared), equal texts in two scopes get unrelated ids, and
  shredding the secret when the scope is deleted leaves every id of it useless. An empty secret (tests, benches,
  the pinned cartridge bytes of tests/kvengine/test_cartridge_bytes.py) gives the public ids: a plain sha256 of the
  same values.
- **Positions and rope.** Every block records its first position (part metadata and the header), and its
  part carries the rope configuration with the rest of the compatibility key: a block is only reused at the
  position it was computed at today; a later step may re-rotate keys to place blocks elsewhere.
- **Quantization per block.** q8/q4 quantize each block (and the tail) on its own: key groups along tokens
  never straddle a block boundary (BLOCK_SIZE is a multiple of every group length), and the first
  EXACT_PREFIX_TOKENS positions of the cartridge (block 0, or the tail when there is no full block) stay exact.
- **Tokenization.** Blocks are keyed by token ids, not by memories, so a tokenizer that merged a memory with
  the next one across the boundary would only make the block that holds the merge a new block (recomputed,
  never wrong). The question split is checked as before (layout.check_split).
- **Digests.** A block's part file carries its id, position and compatibility key and the digest of its
  tensors (``part_sha256``). The header lists the blocks with those digests, and its ``payload_sha256`` is a
  Merkle digest over them and the tail's tensors (format.merkle_sha256), so the version's tail part (header +
  tail tensors) commits to every byte of every block: ``CartridgeParts.digest`` is the version digest.

Stored forms (both deterministic): the whole cartridge file (``KvBackend.dumps``/``loads``: every block's
tensors under ``blocks.NNNNN.`` and the tail's under ``tail.``), or parts (``dump_parts``/``load_parts``: a
tail part plus one part per block, what the Django side stores, each block once per scope).
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
    """The chain id of a block: HMAC-SHA256 under ``secret``, a plain sha256 without one (module docstring, "Chain ids")."""
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
