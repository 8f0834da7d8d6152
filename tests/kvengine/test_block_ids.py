"""Block ids are keyed: HMAC-SHA256 under the caller's secret (kvengine.blocks, "Chain ids")."""
from __future__ import annotations

import pytest

from kvengine.blocks import block_id, chain

TOKENS = list(range(100, 164))


def _id(secret: bytes, tokens=TOKENS) -> str:
    return block_id(parent="", key="k", block_size=64, first_position=0, token_ids=tokens, secret=secret)


def test_it_gives_equal_ids_under_one_secret_and_unrelated_ids_under_two():
    assert _id(b"a" * 32) == _id(b"a" * 32)
    assert _id(b"a" * 32) != _id(b"b" * 32)
    assert _id(b"a" * 32) != _id(b"a" * 32, TOKENS[:-1] + [7])


def test_it_chains_under_the_secret():
    ids = [link for link, _ in chain(TOKENS * 2, num_blocks=2, block_size=64, key="k", secret=b"s")]
    again = [link for link, _ in chain(TOKENS * 2, num_blocks=2, block_size=64, key="k", secret=b"t")]
    assert len(set(ids)) == 2 and not set(ids) & set(again)


def test_it_refuses_a_secret_that_is_not_bytes():
    with pytest.raises(TypeError, match="`secret` has to be bytes"):
        _id("a-string")  # type: ignore[arg-type]


def test_it_gives_a_plain_sha256_without_a_secret():
    import hashlib
    import struct

    from kvengine.base import canonical_json

    expected = hashlib.sha256(canonical_json({"parent": "", "key": "k", "block_size": 64, "first": 0}).encode())
    expected.update(b"\n")
    expected.update(struct.pack(f"<{len(TOKENS)}q", *TOKENS))
    assert _id(b"") == expected.hexdigest() != _id(b"s")
