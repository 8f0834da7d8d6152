"""Block cartridges under attack: SQL tampering, and another scope's blocks (a prune racing a compile is
test_block_prune_race.py's).

- An operator or attacker with SQL access cannot rewrite what erasure and loading rely on: a version's
  ``entry_positions`` (which blocks an erased memory reaches) and ``block_size``, a version's block links,
  a block row, or the prune and block destruction records (the triggers refuse, as for every append-only table).
- Blocks are per scope: identical memories in two scopes give unrelated block ids (keyed per scope), never one shared row, and
  an erasure in one scope leaves the other's identical version whole.

The fake backend cuts blocks of 4 memories (kvengine.fake.FAKE_BLOCK_MEMORIES): 9 memories give blocks b0 b1 and a
tail, 5 memories b0 and a tail, 13 memories b0 b1 b2 and a tail.
"""
from __future__ import annotations

import json

import pytest
from django.db import DatabaseError, connection, transaction

from cartridges.models import (
    BlobKey,
    CartridgeBlock,
    CartridgeBlockDestruction,
    CartridgeDestruction,
    CartridgePrune,
    CartridgeVersion,
    CartridgeVersionBlock,
)
from cartridges.selectors import active_version
from cartridges.services import cartridge_activate, cartridge_compile, cartridge_rollback
from cartridges.services.erase import first_block_reached
from cartridges.services.scope_settings import scope_settings_update
from cartridges.storage import BlobTampered, blob_read, block_lookup, scope_blocks_live, version_parts_read
from core.errors import MnesioError
from memories.services import erasure_request_file, erasure_request_process, scope_create
from tests.support.block_rows import assert_blocks_consistent, fill_facts, version_links


def _raw(sql: str, params) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


# ---------------------------------------------------------------------------------------------------------------
# 1. SQL tampering
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def pruned(scope_a, append, fake_engine):
    """keep_previous_versions=0; ``old`` (b0 b1) was active and is pruned by activating ``new`` (b0 only, a lower
    head): b1 is destroyed with a prune. Every block table has rows."""
    fifth = fill_facts(scope_a, append, 5)
    fill_facts(scope_a, append, 4, start=5)
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    scope_settings_update(scope=scope_a, actor=None, keep_previous_versions=0)
    new = cartridge_compile(scope=scope_a, log_head=fifth.seq)
    cartridge_activate(version=new)
    old_links = version_links(old)
    assert len(old_links) == 2 and [link.block_id for link in version_links(new)] == [old_links[0].block_id]
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=1).exists()
    assert CartridgeBlockDestruction.objects.filter(block=old_links[1].block).exists()
    return old, new


def _tamper(old, new) -> dict[str, tuple[str, list]]:
    """Statements an attacker would run, each with its parameters."""
    destroyed = version_links(old)[1].block
    link = version_links(new)[0]
    many = json.dumps([10**6] * new.num_memories)  # "every memory starts past the end": erasure would keep every block
    return {
        "entry_positions pushed past every block": (
            "UPDATE cartridges_cartridgeversion SET entry_positions = %s::jsonb WHERE id = %s", [many, new.pk]),
        "entry_positions emptied": ("UPDATE cartridges_cartridgeversion SET entry_positions = '[]'::jsonb WHERE id = %s", [new.pk]),
        "block_size enlarged": ("UPDATE cartridges_cartridgeversion SET block_size = block_size * 1000 WHERE id = %s", [new.pk]),
        "block_size zeroed": ("UPDATE cartridges_cartridgeversion SET block_size = 0 WHERE id = %s", [new.pk]),
        "link moved to a destroyed block": (
            "UPDATE cartridges_cartridgeversionblock SET block_id = %s WHERE id = %s", [destroyed.pk, link.pk]),
        "link moved to another position": ("UPDATE cartridges_cartridgeversionblock SET index = index + 7 WHERE id = %s", [link.pk]),
        "link moved to another version": ("UPDATE cartridges_cartridgeversionblock SET version_id = %s WHERE id = %s", [old.pk, link.pk]),
        "link deleted": ("DELETE FROM cartridges_cartridgeversionblock WHERE id = %s", [link.pk]),
        "block position rewritten": ("UPDATE cartridges_cartridgeblock SET first_position = first_position + 1 WHERE id = %s", [link.block_id]),
        "block pointed at another blob": (
            "UPDATE cartridges_cartridgeblock SET storage_name = %s WHERE id = %s", [destroyed.storage_name + "x", link.block_id]),
        "block destruction record deleted": ("DELETE FROM cartridges_cartridgeblockdestruction WHERE block_id = %s", [destroyed.pk]),
        "prune record deleted": ("DELETE FROM cartridges_cartridgeprune WHERE version_id = %s", [old.pk]),
        "prune record rewritten": ("UPDATE cartridges_cartridgeprune SET keep_previous_versions = 99 WHERE version_id = %s", [old.pk]),
    }


TAMPERING = [
    "entry_positions pushed past every block", "entry_positions emptied", "block_size enlarged", "block_size zeroed",
    "link moved to a destroyed block", "link moved to another position", "link moved to another version", "link deleted",
    "block position rewritten", "block pointed at another blob", "block destruction record deleted",
    "prune record deleted", "prune record rewritten",
]


def _snapshot(old, new) -> tuple:
    version = CartridgeVersion.objects.get(pk=new.pk)
    return (
        version.entry_positions, version.block_size,
        [(link.index, link.block_id, link.block.first_position, link.block.storage_name) for link in version_links(version)],
        list(CartridgeBlockDestruction.objects.order_by("id").values_list("block_id", flat=True)),
        list(CartridgePrune.objects.order_by("id").values_list("version_id", "keep_previous_versions")),
    )


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("what", TAMPERING)
def test_it_refuses_sql_tampering_of_what_blocks_and_erasure_rely_on(pruned, what):
    old, new = pruned
    before = _snapshot(old, new)
    assert new.block_size and len(new.entry_positions) == new.num_memories  # the columns are filled, so worth tampering
    sql, params = _tamper(old, new)[what]
    with pytest.raises(DatabaseError, match="Cannot (update|delete) rows"):
        _raw(sql, params)
    assert _snapshot(old, new) == before
    assert blob_read(version=new)
    with pytest.raises(MnesioError, match="pruned by retention"):
        cartridge_rollback(scope=new.scope)  # the prune record still stands


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_plain_role_cannot_rewrite_entry_positions_with_the_ignore_switch(pruned):
    """The superuser-only ignore switch (core/triggers.py) covers the block tables too."""
    old, new = pruned
    names = []
    with connection.cursor() as cursor:
        for table in ("cartridges_cartridgeversion", "cartridges_cartridgeversionblock"):
            cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table])
            names += [row[0] for row in cursor.fetchall()]
    assert any("cartridgeversionblock" in name for name in names)
    seqs = {entry[0] for entry in new.manifest["entries"]}
    reached = first_block_reached(version=new, seqs={max(seqs)})
    for sql, params in [
        ("UPDATE cartridges_cartridgeversion SET entry_positions = '[]'::jsonb, block_size = 0 WHERE id = %s", [new.pk]),
        ("UPDATE cartridges_cartridgeversionblock SET index = index + 7 WHERE version_id = %s", [new.pk]),
    ]:
        with pytest.raises(DatabaseError, match="Cannot update rows"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mnesio_plain_role') THEN "
                "CREATE ROLE mnesio_plain_role NOSUPERUSER NOCREATEDB NOCREATEROLE; END IF; END $$"
            )
            cursor.execute("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public TO mnesio_plain_role")
            cursor.execute("SET LOCAL ROLE mnesio_plain_role")
            cursor.execute("SELECT set_config('pgtrigger.ignore', %s, true)", ["{" + ",".join(names) + "}"])
            cursor.execute(sql, params)
    assert first_block_reached(version=CartridgeVersion.objects.get(pk=new.pk), seqs={max(seqs)}) == reached


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("model", [CartridgeBlock, CartridgeVersionBlock, CartridgeBlockDestruction, CartridgePrune],
                         ids=lambda m: m.__name__)
def test_it_refuses_truncate_of_the_block_tables(pruned, model):
    before = model.objects.count()
    with pytest.raises(DatabaseError, match="TRUNCATE is not allowed"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f"TRUNCATE {model._meta.db_table} CASCADE")
    assert model.objects.count() == before > 0


# ---------------------------------------------------------------------------------------------------------------
# 2. Another scope's blocks
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_scope_never_finds_or_links_another_scopes_identical_block(scope_a, append, fake_engine):
    theirs = scope_create(name="tenant-b")
    fill_facts(scope_a, append, 9)
    fill_facts(theirs, append, 9)
    mine = cartridge_compile(scope=scope_a)
    mine_ids = [link.block.block_id for link in version_links(mine)]
    # tenant-b's lookup finds none of A's blocks before it stores its own
    lookup = block_lookup(scope=theirs, live=scope_blocks_live(scope=theirs))
    assert scope_blocks_live(scope=theirs) == {} and [lookup(block_id) for block_id in mine_ids] == [None, None]
    other = cartridge_compile(scope=theirs)
    other_links = version_links(other)
    # identical content (the same tensors)...
    assert [link.block.part_sha256 for link in other_links] == [link.block.part_sha256 for link in version_links(mine)]
    assert not {link.block.block_id for link in other_links} & set(mine_ids)  # ...under ids keyed per scope...
    assert {link.block.scope_id for link in other_links} == {theirs.pk}  # ...in rows of its own
    assert not {link.block_id for link in other_links} & {link.block_id for link in version_links(mine)}
    assert all(link.block.storage_name.startswith(f"scope-{theirs.pk}/") for link in other_links)
    assert BlobKey.objects.filter(scope=theirs).count() == 3  # b0, b1 and its tail: nothing borrowed


@pytest.mark.postgres  # its raw SQL is PostgreSQL's
@pytest.mark.django_db
def test_a_link_to_another_scopes_block_inserted_by_sql_is_refused_at_read(scope_a, append, fake_engine):
    """The link tables are append-only, so INSERT is the one write raw SQL can still make: a link from tenant B's
    version to tenant A's block. Reading the version refuses it, so it is never served or gated."""
    theirs = scope_create(name="tenant-b")
    fill_facts(scope_a, append, 9)
    fill_facts(theirs, append, 5)
    mine, other = cartridge_compile(scope=scope_a), cartridge_compile(scope=theirs)
    foreign = version_links(mine)[1].block
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO cartridges_cartridgeversionblock (version_id, index, block_id) VALUES (%s, %s, %s)",
            [other.pk, len(version_links(other)), foreign.pk],
        )
    with pytest.raises(BlobTampered, match="belongs to another scope"):
        version_parts_read(version=other)
    assert version_parts_read(version=mine)[1]  # the owner's version is untouched


@pytest.mark.django_db
def test_erasing_a_subject_in_one_scope_leaves_another_scopes_identical_version_whole(scope_a, append, fake_engine):
    theirs = scope_create(name="tenant-b")
    for scope in (scope_a, theirs):  # the same subject id and the same texts in both: identical block contents
        fill_facts(scope, append, 3)
        append(scope, "Dana's locker code is 4417.", subject="dana")  # block 0
        fill_facts(scope, append, 5, start=3)
        cartridge_activate(version=cartridge_compile(scope=scope))
    mine, other = active_version(scope=scope_a), active_version(scope=theirs)
    other_links = version_links(other)
    assert [link.block.part_sha256 for link in other_links] == [link.block.part_sha256 for link in version_links(mine)]
    other_bytes = blob_read(version=other)

    request = erasure_request_file(subject="dana", requested_by=None, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)

    assert CartridgeDestruction.objects.filter(version=mine).exists()
    assert CartridgeBlockDestruction.objects.filter(block__scope=scope_a).count() == 2  # from block 0 on, in A only
    assert not CartridgeBlockDestruction.objects.filter(block__scope=theirs).exists()
    assert not CartridgeDestruction.objects.filter(version=other).exists() and active_version(scope=theirs) == other
    assert blob_read(version=other) == other_bytes and b"4417" in other_bytes  # B's Dana was not erased
    assert b"4417" not in blob_read(version=active_version(scope=scope_a))
    assert_blocks_consistent()
