"""Block cartridges under attack: SQL tampering, a prune racing a compile, and another scope's blocks.

- An operator or attacker with SQL access cannot rewrite what erasure and loading rely on: a version's
  ``entry_positions`` (which blocks an erased memory reaches) and ``block_size``, a version's block links,
  a block row, or the prune and block destruction records (the triggers refuse, as for every append-only table).
- A compile that reuses a block of a version being pruned (services/retention.py, "Races") ends with every block
  it links live, whichever side takes the block's key row first; nothing is left without a version or a record;
  and the two lock the shared key rows in one order, whatever plan each query gets (no deadlock).
- Blocks are per scope: identical memories in two scopes give unrelated block ids (keyed per scope), never one shared row, and
  an erasure in one scope leaves the other's identical version whole.

The fake backend cuts blocks of 4 memories (kvengine.fake.FAKE_BLOCK_MEMORIES): 9 memories give blocks b0 b1 and a
tail, 5 memories b0 and a tail, 13 memories b0 b1 b2 and a tail.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from django.conf import settings as django_settings
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
from cartridges.services import (
    cartridge_activate,
    cartridge_compile,
    cartridge_evaluate,
    cartridge_rollback,
    kv_configuration_switch,
)
from cartridges.services.erase import first_block_reached
from cartridges.services.scope_settings import scope_settings_update
from cartridges.storage import BlobTampered, blob_read, block_lookup, scope_blocks_live, version_parts_read
from core.errors import MnesioError
from memories.services import erasure_request_file, erasure_request_process, scope_create
from tests.support.blobs import stored_files
from tests.support.procs import database_url

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # generous: the 2 cores are shared with other test runs


def _fill(scope, append, num, *, start=0):
    """Append ``num`` numbered facts; return the last memory (its seq is a head to compile at)."""
    last = None
    for i in range(start, start + num):
        last = append(scope, f"Fact {i}: the locker number {i} holds item {i * 7}.")
    return last


def _links(version) -> list[CartridgeVersionBlock]:
    return list(CartridgeVersionBlock.objects.filter(version=version).select_related("block").order_by("index"))


def _raw(sql: str, params) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def _assert_blocks_consistent() -> None:
    """Rows and store agree: no orphan, no version missing a block, every live version opens.

    Every block is live (key row) or recorded destroyed, never both or neither; every key row is claimed by a
    version or a block; every stored file has a key row; every version neither destroyed nor pruned links only
    live blocks and its parts and whole file read back with every digest checked."""
    keys = set(BlobKey.objects.values_list("storage_name", flat=True))
    destroyed = set(CartridgeBlockDestruction.objects.values_list("block_id", flat=True))
    for block in CartridgeBlock.objects.all():
        assert (block.storage_name in keys) != (block.pk in destroyed), f"block {block.pk} is neither live nor recorded destroyed"
    claimed = set(CartridgeVersion.objects.values_list("storage_name", flat=True)) | set(
        CartridgeBlock.objects.values_list("storage_name", flat=True)
    )
    assert keys <= claimed, f"key rows no version or block claims: {keys - claimed}"
    root = Path(django_settings.STORAGES["cartridges"]["OPTIONS"]["location"])
    assert {str(p.relative_to(root)) for p in stored_files(root)} == keys
    live = CartridgeVersion.objects.filter(destruction__isnull=True, prune__isnull=True)
    for version in live:
        for link in _links(version):
            assert link.block.storage_name in keys, f"live version {version.pk} links destroyed block {link.block_id}"
        tail, blocks = version_parts_read(version=version)
        assert tail and len(blocks) == len(_links(version))
        assert blob_read(version=version)


# ---------------------------------------------------------------------------------------------------------------
# 1. SQL tampering
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def pruned(scope_a, append, fake_engine):
    """keep_previous_versions=0; ``old`` (b0 b1) was active and is pruned by activating ``new`` (b0 only, a lower
    head): b1 is destroyed with a prune. Every block table has rows."""
    fifth = _fill(scope_a, append, 5)
    _fill(scope_a, append, 4, start=5)
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    scope_settings_update(scope=scope_a, actor=None, keep_previous_versions=0)
    new = cartridge_compile(scope=scope_a, log_head=fifth.seq)
    cartridge_activate(version=new)
    old_links = _links(old)
    assert len(old_links) == 2 and [link.block_id for link in _links(new)] == [old_links[0].block_id]
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=1).exists()
    assert CartridgeBlockDestruction.objects.filter(block=old_links[1].block).exists()
    return old, new


def _tamper(old, new) -> dict[str, tuple[str, list]]:
    """Statements an attacker would run, each with its parameters."""
    destroyed = _links(old)[1].block
    link = _links(new)[0]
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
        [(link.index, link.block_id, link.block.first_position, link.block.storage_name) for link in _links(version)],
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
# 2. A prune racing a compile that reuses the pruned version's block (two processes)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_row(fake_engine):
    """The fake engine as the active configuration row (the compile subprocess reads it too)."""
    return kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)


def _race_setup(scope, append) -> tuple[CartridgeVersion, CartridgeVersion]:
    """``old`` (b0 b1) active, keep_previous_versions=0, ``new`` (b0 only, a lower head) evaluated and ready to
    activate (which prunes ``old`` and, unless another version links it, b1); 4 more memories appended, so a compile
    now reuses b0 and b1 and adds b2."""
    fifth = _fill(scope, append, 5)
    _fill(scope, append, 4, start=5)
    old = cartridge_compile(scope=scope)
    cartridge_activate(version=old)
    new = cartridge_compile(scope=scope, log_head=fifth.seq)
    assert cartridge_evaluate(version=new).passed
    scope_settings_update(scope=scope, actor=None, keep_previous_versions=0)
    _fill(scope, append, 4, start=9)
    return old, new


@pytest.fixture
def race(scope_a, append, fake_row):
    """_race_setup in scope A."""
    return _race_setup(scope_a, append)


def _compile_process(scope, *, pause_s: float, pgoptions: str = "") -> subprocess.Popen:
    """``manage.py cartridge_compile`` in its own process against the test database, pausing ``pause_s`` between
    writing its blobs and recording its version (MNESIO_CARTRIDGE_STORE_PAUSE_S, services/compile.py); ``pgoptions``
    are its PostgreSQL session settings (PGOPTIONS)."""
    env = {
        **({"PGOPTIONS": pgoptions} if pgoptions else {}),
        **os.environ,
        "DATABASE_URL": database_url(),
        "MNESIO_KV_BACKEND": "fake",
        "MNESIO_KV_MODEL": "fake-model",
        "MNESIO_BLOB_ROOT": django_settings.STORAGES["cartridges"]["OPTIONS"]["location"],
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
        "MNESIO_LOG_LEVEL": "INFO",
        "MNESIO_CARTRIDGE_STORE_PAUSE_S": str(pause_s),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "cartridge_compile", scope.name], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def _wait(predicate, *, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the compile process ended (rc {proc.returncode}) before {what}: {proc.stdout.read()}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _finish(proc: subprocess.Popen) -> tuple[CartridgeVersion, str]:
    """Wait for the compile process; return the version it printed and its whole output."""
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, out
    found = re.search(r"^version (\d+):", out, re.MULTILINE)
    assert found, out
    return CartridgeVersion.objects.get(pk=int(found.group(1))), out


def _waiting_on_a_lock(query_prefix: str) -> int:
    """How many backends are blocked on a lock while running a statement starting with ``query_prefix``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE %s", [query_prefix + "%"]
        )
        return cursor.fetchone()[0]


@pytest.fixture
def killed_at_teardown():
    """Processes a test starts; killed at teardown if still running."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_compile_whose_reused_block_is_pruned_before_it_stores_compiles_again(race, scope_a, killed_at_teardown):
    old, new = race
    b1 = _links(old)[1].block
    blobs_before = BlobKey.objects.count()
    proc = _compile_process(scope_a, pause_s=4)
    killed_at_teardown.append(proc)
    # the compile wrote its tail and b2, found b0 and b1 live, and now pauses before its transaction
    _wait(lambda: BlobKey.objects.count() == blobs_before + 2, what="the compile to write its blobs", proc=proc)
    cartridge_activate(version=new)  # prunes old: b1 is used by no version (the compile has not linked it yet)
    assert CartridgeBlockDestruction.objects.filter(block=b1).exists() and proc.poll() is None

    version, _ = _finish(proc)  # its lock finds b1's key gone: BlockGoneDuringCompile, so it compiles again
    links = _links(version)
    assert len(links) == 3
    assert links[0].block_id == _links(new)[0].block_id  # b0, still live, reused
    assert links[1].block.block_id == b1.block_id and links[1].block_id != b1.pk  # b1 stored again as a new row
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=1).exists()
    _assert_blocks_consistent()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_prune_that_waits_for_a_compile_holding_the_reused_blocks_keeps_them(race, scope_a, killed_at_teardown):
    old, new = race
    b1 = _links(old)[1].block
    # hold the compile inside its transaction, after it locked the reused blocks' key rows: a SHARE lock on the
    # version table lets it lock but not insert its version row
    holder = psycopg.connect(database_url())
    try:
        holder.execute(f"LOCK TABLE {CartridgeVersion._meta.db_table} IN SHARE MODE")
        proc = _compile_process(scope_a, pause_s=0)
        killed_at_teardown.append(proc)
        _wait(lambda: _waiting_on_a_lock('INSERT INTO "cartridges_cartridgeversion"'), what="the compile to hold its locks", proc=proc)
        errors: list[BaseException] = []

        def activate() -> None:
            try:
                cartridge_activate(version=new)  # prunes old, which waits for the compile's lock on b0 and b1
            except BaseException as exc:  # noqa: BLE001 (reported by the test thread)
                errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=activate)
        thread.start()
        _wait(lambda: _waiting_on_a_lock('SELECT "cartridges_blobkey"'), what="the prune to wait on the block keys", proc=proc)
        assert not CartridgePrune.objects.filter(version=old).exists()
    finally:
        holder.commit()  # the compile inserts and commits, then the prune reads who uses b0 and b1
        holder.close()
    version, _ = _finish(proc)
    thread.join(timeout=TIMEOUT_S)
    assert not thread.is_alive() and not errors, errors
    assert [link.block_id for link in _links(version)[:2]] == [link.block_id for link in _links(old)]  # the same rows
    assert active_version(scope=scope_a) == new
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=0).exists()  # only old's tail went
    assert not CartridgeBlockDestruction.objects.filter(block=b1).exists()
    _assert_blocks_consistent()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_prune_and_a_compile_that_scan_the_block_keys_in_other_orders_do_not_deadlock(
    scope_a, append, fake_row, monkeypatch, killed_at_teardown
):
    """Which order each side locks the key rows in must not depend on the query plan.

    The block keys' names sort in the reverse of their insertion order (b1 before b0); the compile scans the heap
    (b0 first) and the prune the storage_name index (b1 first), as the planner may well choose for lists of
    different sizes. A third session holds b0 until both wait, so each holds one key the other needs."""
    names = itertools.count(10**6, -1)
    monkeypatch.setattr("cartridges.storage.uuid", SimpleNamespace(uuid4=lambda: SimpleNamespace(hex=f"{next(names):032x}")))
    old, new = _race_setup(scope_a, append)
    monkeypatch.undo()
    b0, b1 = [link.block for link in _links(old)]
    assert b1.storage_name < b0.storage_name
    holder = psycopg.connect(database_url())
    errors: list[BaseException] = []

    def activate() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET enable_seqscan = off; SET enable_bitmapscan = off")  # the index: b1, then b0
            cartridge_activate(version=new)
        except BaseException as exc:  # noqa: BLE001 (reported by the test thread)
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=activate)
    try:
        holder.execute("SELECT 1 FROM cartridges_blobkey WHERE storage_name = %s FOR UPDATE", [b0.storage_name])
        proc = _compile_process(scope_a, pause_s=0, pgoptions="-c enable_indexscan=off -c enable_bitmapscan=off -c enable_indexonlyscan=off")
        killed_at_teardown.append(proc)
        blob_keys = 'SELECT "cartridges_blobkey"'
        _wait(lambda: _waiting_on_a_lock(blob_keys) == 1, what="the compile to wait for b0", proc=proc)
        thread.start()
        _wait(lambda: _waiting_on_a_lock(blob_keys) == 2, what="the prune to wait for b0", proc=proc)
    finally:
        holder.commit()
        holder.close()
    version, _ = _finish(proc)
    thread.join(timeout=TIMEOUT_S)
    assert not thread.is_alive() and not errors, errors
    assert active_version(scope=scope_a) == new
    links = _links(version)
    assert [link.block_id for link in links[:2]] == [b0.pk, b1.pk]  # the compile locked first: the prune kept both
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=0).exists()
    _assert_blocks_consistent()


# ---------------------------------------------------------------------------------------------------------------
# 3. Another scope's blocks
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_scope_never_finds_or_links_another_scopes_identical_block(scope_a, append, fake_engine):
    theirs = scope_create(name="tenant-b")
    _fill(scope_a, append, 9)
    _fill(theirs, append, 9)
    mine = cartridge_compile(scope=scope_a)
    mine_ids = [link.block.block_id for link in _links(mine)]
    # tenant-b's lookup finds none of A's blocks before it stores its own
    lookup = block_lookup(scope=theirs, live=scope_blocks_live(scope=theirs))
    assert scope_blocks_live(scope=theirs) == {} and [lookup(block_id) for block_id in mine_ids] == [None, None]
    other = cartridge_compile(scope=theirs)
    other_links = _links(other)
    # identical content (the same tensors)...
    assert [link.block.part_sha256 for link in other_links] == [link.block.part_sha256 for link in _links(mine)]
    assert not {link.block.block_id for link in other_links} & set(mine_ids)  # ...under ids keyed per scope...
    assert {link.block.scope_id for link in other_links} == {theirs.pk}  # ...in rows of its own
    assert not {link.block_id for link in other_links} & {link.block_id for link in _links(mine)}
    assert all(link.block.storage_name.startswith(f"scope-{theirs.pk}/") for link in other_links)
    assert BlobKey.objects.filter(scope=theirs).count() == 3  # b0, b1 and its tail: nothing borrowed


@pytest.mark.postgres  # its raw SQL is PostgreSQL's
@pytest.mark.django_db
def test_a_link_to_another_scopes_block_inserted_by_sql_is_refused_at_read(scope_a, append, fake_engine):
    """The link tables are append-only, so INSERT is the one write raw SQL can still make: a link from tenant B's
    version to tenant A's block. Reading the version refuses it, so it is never served or gated."""
    theirs = scope_create(name="tenant-b")
    _fill(scope_a, append, 9)
    _fill(theirs, append, 5)
    mine, other = cartridge_compile(scope=scope_a), cartridge_compile(scope=theirs)
    foreign = _links(mine)[1].block
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO cartridges_cartridgeversionblock (version_id, index, block_id) VALUES (%s, %s, %s)",
            [other.pk, len(_links(other)), foreign.pk],
        )
    with pytest.raises(BlobTampered, match="belongs to another scope"):
        version_parts_read(version=other)
    assert version_parts_read(version=mine)[1]  # the owner's version is untouched


@pytest.mark.django_db
def test_erasing_a_subject_in_one_scope_leaves_another_scopes_identical_version_whole(scope_a, append, fake_engine):
    theirs = scope_create(name="tenant-b")
    for scope in (scope_a, theirs):  # the same subject id and the same texts in both: identical block contents
        _fill(scope, append, 3)
        append(scope, "Dana's locker code is 4417.", subject="dana")  # block 0
        _fill(scope, append, 5, start=3)
        cartridge_activate(version=cartridge_compile(scope=scope))
    mine, other = active_version(scope=scope_a), active_version(scope=theirs)
    other_links = _links(other)
    assert [link.block.part_sha256 for link in other_links] == [link.block.part_sha256 for link in _links(mine)]
    other_bytes = blob_read(version=other)

    request = erasure_request_file(subject="dana", requested_by=None, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)

    assert CartridgeDestruction.objects.filter(version=mine).exists()
    assert CartridgeBlockDestruction.objects.filter(block__scope=scope_a).count() == 2  # from block 0 on, in A only
    assert not CartridgeBlockDestruction.objects.filter(block__scope=theirs).exists()
    assert not CartridgeDestruction.objects.filter(version=other).exists() and active_version(scope=theirs) == other
    assert blob_read(version=other) == other_bytes and b"4417" in other_bytes  # B's Dana was not erased
    assert b"4417" not in blob_read(version=active_version(scope=scope_a))
    _assert_blocks_consistent()
