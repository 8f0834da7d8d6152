"""Nothing that outlives an erasure lets anyone test a guess about the erased text through block ids or digests.

The attacker brute-forces a 4-digit PIN erased from a scope: for each guess it computes the block id the erased
memory's block would have had (under the public derivation, and under the scope's own block secret, which an
operator holding the master key can unwrap) and looks for it in every column of every block, version and evaluation
row. The fake backend cuts blocks of 4 memories: the PIN's memory is the 5th, so it opens the second block.
"""
from __future__ import annotations

import hashlib
import struct

import pytest
from django.db import connection

from cartridges.models import (
    CartridgeBlock,
    CartridgeEvaluation,
    CartridgeVersion,
    CartridgeVersionBlock,
    ScopeBlockSecret,
)
from cartridges.selectors import active_configuration
from cartridges.services import cartridge_activate, cartridge_compile
from cartridges.services.blocksecret import scope_block_secret
from kvengine.base import canonical_json
from kvengine.blocks import block_id, key_digest
from kvengine.fake import FAKE_BLOCK_MEMORIES
from memories.services import (
    erasure_request_file,
    erasure_request_process,
    memory_append,
    memory_forget_file,
    scope_delete_file,
)

pytestmark = pytest.mark.django_db

PIN = "4821"
FILLERS = [f"Fact {i}: locker {i} holds item {i * 7}." for i in range(8)]


def _texts(pin: str) -> list[str]:
    return [*FILLERS[:4], f"Dana's phone PIN is {pin}.", *FILLERS[4:]]


def _public_id(*, parent: str, key: str, first: int, token_ids: list[int]) -> str:
    """A plain sha256 of the public values and the token ids: what a block id would be without a secret."""
    h = hashlib.sha256(canonical_json({"parent": parent, "key": key, "block_size": FAKE_BLOCK_MEMORIES, "first": first}).encode())
    h.update(b"\n")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.hexdigest()


def _second_block_ids(pin: str, *, key: str, secret: bytes | None) -> str:
    """The id of the block opened by the PIN's memory, as the fake backend chains it."""
    texts, parent = _texts(pin), ""
    for index in range(2):
        chunk = texts[index * FAKE_BLOCK_MEMORIES : (index + 1) * FAKE_BLOCK_MEMORIES]
        tokens = list("\n".join(chunk).encode())
        first = index * FAKE_BLOCK_MEMORIES
        if secret is None:
            parent = _public_id(parent=parent, key=key, first=first, token_ids=tokens)
        else:
            parent = block_id(parent=parent, key=key, block_size=FAKE_BLOCK_MEMORIES, first_position=first, token_ids=tokens, secret=secret)
    return parent


def _stored_text() -> str:
    """Every column of every block, version and evaluation row, as text."""
    chunks = []
    for model in (CartridgeBlock, CartridgeVersion, CartridgeEvaluation):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(model._meta.db_table)}")
            chunks += [str(value) for row in cursor.fetchall() for value in row]
    return "\n".join(chunks)


@pytest.fixture(params=["subject", "memory", "scope"])
def erased_pin(request, scope_a, fake_engine):
    """A served, gated scope whose PIN memory was then erased (with its subject, alone, or with the whole scope);
    returns (the version, its key digest, the scope's block secret as unwrapped before the erasure)."""
    memories = [memory_append(scope=scope_a, content=text, subject="dana" if "PIN" in text else None) for text in _texts(PIN)]
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)  # the gate's figures record the verified blocks
    from cartridges import engine

    key = key_digest(engine.backend_for(active_configuration()).describe().compat_key())
    secret = scope_block_secret(scope=scope_a)  # an operator with the master key unwrapped it before the erasure
    assert _second_block_ids(PIN, key=key, secret=secret) in _stored_text()  # live: stored
    if request.param == "subject":
        erasure = erasure_request_file(subject="dana", scope=scope_a, requested_by=None, reason="asked")
    elif request.param == "memory":
        erasure = memory_forget_file(scope=scope_a, seq=memories[4].seq, requested_by=None, reason="asked")
    else:
        erasure = scope_delete_file(scope=scope_a, requested_by=None, reason="retired")
    erasure_request_process(erasure_request=erasure)
    return version, key, secret


def test_it_leaves_no_stored_value_a_pin_guess_can_be_checked_against(erased_pin):
    version, key, secret = erased_pin
    stored = _stored_text()
    found = [
        pin for pin in (f"{n:04d}" for n in range(10_000))
        if _second_block_ids(pin, key=key, secret=None) in stored or _second_block_ids(pin, key=key, secret=secret) in stored
    ]
    assert found == []
    destroyed = CartridgeVersionBlock.objects.get(version=version, index=1).block
    destroyed.refresh_from_db()
    assert (destroyed.block_id, destroyed.part_sha256, destroyed.sha256) == ("", "", "")
    version.refresh_from_db()
    assert (version.sha256, version.payload_sha256) == ("", "")
    for evaluation in CartridgeEvaluation.objects.filter(version=version):
        assert all(isinstance(row, int) for row in evaluation.figures.get("verified_blocks", []))  # block rows, not ids


def test_it_keys_block_ids_per_scope(scope_a, scope_c, fake_engine):
    for scope in (scope_a, scope_c):
        for text in _texts(PIN):
            memory_append(scope=scope, content=text)
    ids = [
        set(CartridgeBlock.objects.filter(version_links__version=cartridge_compile(scope=scope)).values_list("block_id", flat=True))
        for scope in (scope_a, scope_c)
    ]
    assert len(ids[0]) == 2 and not ids[0] & ids[1]
    assert scope_block_secret(scope=scope_a) != scope_block_secret(scope=scope_c)


def test_it_shows_no_full_block_id_or_digest_on_the_admin_block_page(scope_a, fake_engine, admin_client):
    for text in _texts(PIN):
        memory_append(scope=scope_a, content=text)
    version = cartridge_compile(scope=scope_a)
    for block in CartridgeBlock.objects.filter(version_links__version=version):
        page = admin_client.get(f"/admin/cartridges/cartridgeblock/{block.pk}/change/").content.decode()
        listing = admin_client.get("/admin/cartridges/cartridgeblock/").content.decode()
        for secret_free in (block.block_id, block.part_sha256, block.sha256, block.block_id[:16]):
            assert secret_free not in page and secret_free not in listing
        assert block.block_id[:8] in page  # a short prefix of the keyed id, to tell blocks apart
    version_page = admin_client.get(f"/admin/cartridges/cartridgeversion/{version.pk}/change/").content.decode()
    assert version.sha256 not in version_page and version.payload_sha256 not in version_page


def test_it_shreds_the_block_secret_when_the_scope_is_deleted(scope_a, fake_engine):
    for text in _texts(PIN):
        memory_append(scope=scope_a, content=text)
    cartridge_compile(scope=scope_a)
    assert ScopeBlockSecret.objects.filter(scope=scope_a).exists()
    erasure_request_process(erasure_request=scope_delete_file(scope=scope_a, requested_by=None, reason="retired"))
    assert not ScopeBlockSecret.objects.filter(scope=scope_a).exists()
    assert set(CartridgeBlock.objects.filter(scope=scope_a).values_list("block_id", flat=True)) == {""}


def test_it_keeps_block_ids_stable_across_versions_and_a_rebuild_reproduces_the_bytes(scope_a, fake_engine):
    from cartridges.services.compile import cartridge_rebuild

    for text in _texts(PIN):
        memory_append(scope=scope_a, content=text)
    first = cartridge_compile(scope=scope_a)
    memory_append(scope=scope_a, content="Fact 8: locker 8 holds item 56.")
    second = cartridge_compile(scope=scope_a)
    first_links = CartridgeVersionBlock.objects.filter(version=first).order_by("index")
    second_links = CartridgeVersionBlock.objects.filter(version=second).order_by("index")
    assert [link.block_id for link in first_links] == [link.block_id for link in second_links][:2]  # the same rows
    rebuilt = cartridge_rebuild(version=second)
    assert rebuilt.rebuilt_sha256 == second.sha256  # from scratch, under the same scope secret
