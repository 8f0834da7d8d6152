"""Block storage: each block stored once per scope, erasure per block, retention, and what an attacker tries.

The fake backend cuts blocks of 4 memories (kvengine.fake.FAKE_BLOCK_MEMORIES), so a dozen memories make a chain.
"""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from cartridges.models import (
    BlobKey,
    CartridgeBlock,
    CartridgeBlockDestruction,
    CartridgePrune,
    CartridgeVersion,
    CartridgeVersionBlock,
)
from cartridges.selectors import active_version
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, cartridge_rollback
from cartridges.services.scope_settings import scope_settings_update
from cartridges.storage import blob_exists, blob_read, version_parts_read
from core.errors import MnesioError
from memories.services import erasure_request_file, erasure_request_process, scope_create
from tests.support.blobs import share_block_secret

pytestmark = pytest.mark.django_db


def _fill(scope, append, num, *, start=0, subject=None):
    for i in range(start, start + num):
        append(scope, f"Fact {i}: the locker number {i} holds item {i * 7}.", subject=subject)


def _live_blocks(scope) -> set[str]:
    names = set(BlobKey.objects.filter(scope=scope).values_list("storage_name", flat=True))
    return {b.block_id for b in CartridgeBlock.objects.filter(scope=scope) if b.storage_name in names}


def test_versions_of_a_growing_scope_store_each_block_once(scope_a, append, fake_engine, blob_root):
    other = scope_create(name="scratch")  # the same log in a scope that stores nothing else (filled first: lower seqs)
    share_block_secret(source=scope_a, target=other)  # block ids are keyed per scope: equal bytes need one secret
    _fill(other, append, 13)
    _fill(scope_a, append, 9)
    first = cartridge_compile(scope=scope_a)
    assert CartridgeVersionBlock.objects.filter(version=first).count() == 2  # memories 0-3, 4-7; 8 in the tail
    _fill(scope_a, append, 4, start=9)
    second = cartridge_compile(scope=scope_a)
    links = list(CartridgeVersionBlock.objects.filter(version=second).order_by("index"))
    assert len(links) == 3
    first_links = list(CartridgeVersionBlock.objects.filter(version=first).order_by("index"))
    assert [link.block_id for link in links[:2]] == [link.block_id for link in first_links]  # the same rows, not copies
    assert CartridgeBlock.objects.filter(scope=scope_a).count() == 3
    # the stored bytes: one blob per block and one per version (its tail)
    assert BlobKey.objects.filter(scope=scope_a).count() == 3 + 2
    # and it is byte-identical to a compile from scratch of the same log in a scope that stored nothing
    scratch = cartridge_compile(scope=other, log_head=second.log_head)
    assert scratch.sha256 == second.sha256 and blob_read(version=scratch) == blob_read(version=second)
    assert scratch.size_bytes == second.size_bytes  # reused blocks count by their rows, new ones by their bytes


def test_an_incremental_compile_serializes_only_the_blocks_the_scope_does_not_store(scope_a, append, fake_engine, blob_root, monkeypatch):
    from kvengine import blocks

    _fill(scope_a, append, 9)
    cartridge_compile(scope=scope_a)
    written = []
    original = blocks.write_block_part
    monkeypatch.setattr(blocks, "write_block_part", lambda header, ref, tensors: written.append(ref.block_id) or original(header, ref, tensors))
    _fill(scope_a, append, 4, start=9)
    second = cartridge_compile(scope=scope_a)
    links = list(CartridgeVersionBlock.objects.filter(version=second).order_by("index").select_related("block"))
    assert written == [links[2].block.block_id]  # the two reused blocks are linked, not written out again
    _, parts = version_parts_read(version=second)
    assert len(parts) == 3


def test_another_scopes_blocks_are_never_reused(scope_a, append, fake_engine, blob_root):
    other = scope_create(name="tenant-b")
    _fill(other, append, 9)
    theirs = cartridge_compile(scope=other)
    _fill(scope_a, append, 9)  # the same texts: the same token ids, under another scope's block secret
    mine = cartridge_compile(scope=scope_a)
    blocks = CartridgeBlock.objects.filter(version_links__version=mine)
    assert blocks.count() == 2 and set(blocks.values_list("scope_id", flat=True)) == {scope_a.pk}
    # equal texts in two scopes give unrelated ids: an id of one scope says nothing about another's content
    their_ids = set(CartridgeBlock.objects.filter(version_links__version=theirs).values_list("block_id", flat=True))
    assert their_ids and not their_ids & set(blocks.values_list("block_id", flat=True))
    assert theirs.payload_sha256 == mine.payload_sha256  # while the KV itself is the same


def test_erasure_destroys_the_blocks_an_erased_memory_reaches_and_keeps_the_ones_before(scope_a, append, fake_engine, blob_root):
    never = scope_create(name="never-dana")  # the log without Dana, filled first (lower seqs)
    share_block_secret(source=scope_a, target=never)
    _fill(never, append, 8)
    _fill(never, append, 4, start=9)
    _fill(scope_a, append, 8)  # blocks 0 and 1 hold no subject memory
    append(scope_a, "Dana's locker code is 4417.", subject="dana")  # memory 8: block 2
    _fill(scope_a, append, 4, start=9)
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    links = list(CartridgeVersionBlock.objects.filter(version=version).select_related("block").order_by("index"))
    assert len(links) == 3

    erasure_request_process(erasure_request=erasure_request_file(subject="dana", requested_by=None, reason="asked"))

    assert [blob_exists(storage_name=link.block.storage_name) for link in links] == [True, True, False]
    assert CartridgeBlockDestruction.objects.filter(block=links[2].block).exists()
    assert not BlobKey.objects.filter(storage_name=links[2].block.storage_name).exists()
    rebuilt = active_version(scope=scope_a)
    rebuilt_links = list(CartridgeVersionBlock.objects.filter(version=rebuilt).order_by("index"))
    assert [link.block_id for link in rebuilt_links[:2]] == [links[0].block_id, links[1].block_id]  # kept and reused
    assert b"4417" not in blob_read(version=rebuilt)
    assert cartridge_compile(scope=never, log_head=rebuilt.log_head).sha256 == rebuilt.sha256  # rebuilt == never had it


def test_a_version_sharing_an_erased_block_by_content_is_destroyed_too(scope_a, append, fake_engine, blob_root):
    _fill(scope_a, append, 3)
    append(scope_a, "The code is 4417.", subject="dana")
    _fill(scope_a, append, 2, start=3)
    old = cartridge_compile(scope=scope_a)  # its block 0 holds Dana's memory
    cartridge_activate(version=old)
    # another person says exactly the same thing in another scope: no shared rows across scopes, nothing destroyed there
    other = scope_create(name="other")
    _fill(other, append, 3)
    append(other, "The code is 4417.", subject="eve")
    _fill(other, append, 2, start=3)
    theirs = cartridge_compile(scope=other)
    erasure_request_process(erasure_request=erasure_request_file(subject="dana", requested_by=None, reason="asked"))
    assert blob_read(version=theirs)  # eve's version in another scope still opens
    assert b"4417" not in blob_read(version=active_version(scope=scope_a))


def test_retention_prunes_old_versions_and_rollback_to_a_pruned_one_says_so(scope_a, append, fake_engine, blob_root):
    scope_settings_update(scope=scope_a, actor=None, keep_previous_versions=1)
    versions = []
    for step in range(4):
        _fill(scope_a, append, 5, start=step * 5)
        versions.append(cartridge_compile(scope=scope_a))
        cartridge_activate(version=versions[-1])
    pruned = set(CartridgePrune.objects.values_list("version_id", flat=True))
    assert pruned == {versions[0].pk, versions[1].pk}
    for version in versions[:2]:
        assert not blob_exists(storage_name=version.storage_name)
        with pytest.raises(MnesioError, match="pruned"):
            version_parts_read(version=version)
    # every block the kept versions use is still there: they load, and the active one answers
    for version in versions[2:]:
        assert blob_read(version=version)
    assert cartridge_answer(scope=scope_a, question="What does locker number 3 hold?").answer
    assert CartridgeVersion.objects.filter(scope=scope_a).count() == 4  # rows are kept
    cartridge_rollback(scope=scope_a)  # to versions[2], kept
    assert active_version(scope=scope_a) == versions[2]
    scope_settings_update(scope=scope_a, actor=None, keep_previous_versions=0)
    cartridge_activate(version=versions[3])  # prunes versions[2] now
    assert CartridgePrune.objects.filter(version=versions[2]).exists() and blob_read(version=versions[3])
    with pytest.raises(MnesioError, match="pruned by retention"):
        cartridge_rollback(scope=scope_a)  # the newest earlier activated version, versions[2], is pruned


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the database's own triggers are PostgreSQL's")
def test_raw_sql_cannot_rewrite_or_delete_a_versions_block_links(scope_a, append, fake_engine, blob_root):
    _fill(scope_a, append, 9)
    version = cartridge_compile(scope=scope_a)
    for sql in (
        "UPDATE cartridges_cartridgeversionblock SET block_id = block_id WHERE version_id = %s",
        "DELETE FROM cartridges_cartridgeversionblock WHERE version_id = %s",
        "UPDATE cartridges_cartridgeblock SET sha256 = 'x' WHERE scope_id = %s",
    ):
        with pytest.raises(DatabaseError, match="Cannot (update|delete) rows"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [version.pk if "version" in sql else scope_a.pk])
    assert CartridgeVersionBlock.objects.filter(version=version).count() == 2
