"""Block parts a lookup vouches for (kvengine.blocks.TrustedPart): checked for id, position and key, not hashed again."""
from __future__ import annotations

import pytest

from kvengine import CorruptCartridgeError
from kvengine.blocks import TrustedPart

MEMORIES = [
    "Alice lives in Lisbon and bakes bread on Sundays.",
    "Bob owns a red car that he parks on level three.",
    "Carol plays the cello in the city orchestra.",
]


@pytest.mark.model
def test_a_compile_on_trusted_parts_is_byte_identical_to_one_from_scratch(small_blocks):
    parent = small_blocks.compile(MEMORIES)
    stored = {ref.block_id: data for ref, data in small_blocks.dump_parts(parent).blocks}
    grown = [*MEMORIES, "Dan's locker code is 4417."]
    child = small_blocks.compile(grown, blocks=lambda block_id: TrustedPart(stored[block_id]) if block_id in stored else None)
    assert child.stats["blocks_reused"] == len(stored) >= 2
    assert small_blocks.dump_parts(child).digest == small_blocks.dump_parts(small_blocks.compile(grown)).digest


@pytest.mark.model
def test_a_trusted_part_is_still_refused_when_it_is_another_block(small_blocks):
    parent = small_blocks.compile(MEMORIES)
    (first, data), (second, other) = small_blocks.dump_parts(parent).blocks[:2]
    # the lookup hands block 1's part for block 0's id: the id in the part's metadata is checked, trusted or not
    with pytest.raises(CorruptCartridgeError, match="not the block expected"):
        small_blocks.compile(MEMORIES, blocks=lambda block_id: TrustedPart(other) if block_id == first.block_id else None)
    # and untrusted bytes are hashed: one flipped byte in the tensors is refused
    flipped = bytearray(data)
    flipped[-1] ^= 0x01
    with pytest.raises(CorruptCartridgeError, match="sha256"):
        small_blocks.compile(MEMORIES, blocks=lambda block_id: bytes(flipped) if block_id == first.block_id else None)
