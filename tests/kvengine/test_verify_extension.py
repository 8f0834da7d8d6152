"""verify_extension(): the new part of a block cartridge re-read once on top of its verified blocks and compared."""
from __future__ import annotations

import pytest
import torch

from kvengine import ConfigError
from kvengine.fake import FakeKvBackend
from kvengine.format import header_blocks

MEMORIES = [
    "Alice lives in Lisbon and bakes bread on Sundays.",
    "Bob owns a red car that he parks on level three.",
    "Carol plays the cello in the city orchestra.",
]
NEW = "Dan's locker code is 4417."
PROBE = "What is Dan's locker code?"


def _verified(parent, child) -> int:
    """Leading blocks the child shares with its parent (id and digest)."""
    num = 0
    for a, b in zip(header_blocks(parent.header), header_blocks(child.header), strict=False):
        if a != b:
            break
        num += 1
    return num


@pytest.fixture(scope="module")
def appended(small_blocks):
    """A parent of three memories and the version after appending a fourth, compiled reusing the parent's blocks."""
    parent = small_blocks.compile(MEMORIES)
    stored = {ref.block_id: data for ref, data in small_blocks.dump_parts(parent).blocks}
    child = small_blocks.compile([*MEMORIES, NEW], blocks=stored.get)
    assert child.stats["blocks_reused"] >= 2
    return parent, child


@pytest.mark.model
def test_it_re_reads_the_new_part_once_and_agrees_with_the_cartridge(small_blocks, appended):
    parent, child = appended
    num = _verified(parent, child)
    check = small_blocks.verify_extension(
        child, [*MEMORIES, NEW], [PROBE], num_verified_blocks=num, max_new_tokens=6, questions=[PROBE], answer_max_new_tokens=10
    )
    assert child.stats["blocks_computed"] >= 1  # the append completed blocks, prefilled one by one, then the tail
    assert check.chain_matches and check.num_verified_tokens == 16 * num
    assert check.num_new_tokens == child.header.num_tokens - 16 * num
    # read in compile's chunks by its own code path, a right f32 cartridge is its re-reading bit for bit
    assert check.max_abs_diff == 0.0 and check.by_construction
    assert check.fidelity.top1_agreement == 1.0 and check.fidelity.answers_identical == 1.0
    (from_cartridge, from_text), = check.answers
    assert "4417" in from_cartridge.text and from_cartridge.token_ids == from_text.token_ids
    assert "Dan" not in str(check.as_dict())  # figures are numbers only


@pytest.mark.model
def test_it_sees_a_new_memory_the_cartridge_does_not_hold(small_blocks, appended):
    parent, child = appended
    num = _verified(parent, child)
    other = [*MEMORIES, "Dan's locker code is 9981."]
    check = small_blocks.verify_extension(child, other, [PROBE], num_verified_blocks=num, questions=[PROBE], answer_max_new_tokens=10)
    assert not check.chain_matches  # the new block's tokens differ
    assert check.max_abs_diff > 1.0
    (from_cartridge, from_text), = check.answers
    assert "4417" in from_cartridge.text and "9981" in from_text.text
    assert check.fidelity.answers_identical == 0.0


@pytest.mark.model
def test_it_refuses_more_verified_blocks_than_the_cartridge_has(small_blocks, appended):
    _, child = appended
    with pytest.raises(ConfigError, match="num_verified_blocks"):
        small_blocks.verify_extension(child, [*MEMORIES, NEW], [PROBE], num_verified_blocks=len(header_blocks(child.header)) + 1)


def test_the_fake_re_reads_the_new_memories_on_top_of_the_verified_ones():
    fake = FakeKvBackend()
    texts = [f"Person {i} keeps item {i} in drawer {i}." for i in range(6)]
    cartridge = fake.compile(texts)
    check = fake.verify_extension(cartridge, texts, ["Where is item 5?"], num_verified_blocks=1, questions=["Where is item 5?"])
    assert check.chain_matches and check.max_abs_diff == 0.0 and check.num_new_tokens == 2
    assert check.answers[0][0].text == check.answers[0][1].text == texts[5]
    lying = fake.compile([*texts[:5], "Person 5 keeps nothing anywhere."])  # the new memory is not the log's
    check = fake.verify_extension(lying, texts, ["Where is item 5?"], num_verified_blocks=1, questions=["Where is item 5?"])
    assert check.max_abs_diff == 1.0 and check.fidelity.answers_identical == 0.0
    assert check.answers[0][0].text != check.answers[0][1].text


@pytest.mark.model
def test_a_new_part_equal_to_its_re_reading_bit_for_bit_is_not_probed_again(long_blocks):
    """256-token blocks and a short log: compile reads the whole tail in one pass, as the re-reading does, so the two
    KV states are equal bit for bit and every answer is the same by construction; probes are not decoded."""
    real_backend = long_blocks
    child = real_backend.compile([*MEMORIES, NEW])
    assert child.stats["blocks_computed"] == 0  # only the tail
    check = real_backend.verify_extension(
        child, [*MEMORIES, NEW], [PROBE] * 3, num_verified_blocks=0, questions=[PROBE], answer_max_new_tokens=10
    )
    assert check.chain_matches and check.max_abs_diff == 0.0 and check.by_construction
    assert check.fidelity.num_probes == 3 and check.fidelity.top1_agreement == 1.0
    (from_cartridge, from_text), = check.answers
    assert "4417" in from_cartridge.text and from_text.token_ids == from_cartridge.token_ids
    # a log that differs from what the cartridge holds is never taken as equal: the probes run
    other = real_backend.verify_extension(child, [*MEMORIES, "Dan's locker code is 9981."], [PROBE], num_verified_blocks=0)
    assert not other.by_construction and other.max_abs_diff > 0


@pytest.mark.model
def test_a_new_block_off_by_float_noise_is_not_taken_as_equal_and_the_probes_run(small_blocks, appended):
    """KV that differs from the re-reading by less than the gate's tolerance is not "equal by construction": the
    probes are decoded both ways and compared (a wrong value hiding under float noise still meets the answers)."""
    parent, child = appended
    num = _verified(parent, child)
    nudged = small_blocks.loads(small_blocks.dumps(child))  # a copy of its own
    state = small_blocks._payload(nudged).state
    keys, _ = state.prefix(3)
    with torch.inference_mode():
        keys[0, 0, 16 * num + 1, 0] += 1e-5  # one value of the first new block, in layer 3
    check = small_blocks.verify_extension(
        nudged, [*MEMORIES, NEW], [PROBE], num_verified_blocks=num, max_new_tokens=6, questions=[PROBE], answer_max_new_tokens=10
    )
    assert not check.by_construction and 0 < check.max_abs_diff < 1e-4
    assert check.probe_s > 0 and check.fidelity.num_probes == 1 and check.fidelity.top1_agreement == 1.0
