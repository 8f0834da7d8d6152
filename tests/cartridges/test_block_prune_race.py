"""Block cartridges under attack: a prune racing a compile that reuses the pruned version's block (two processes).

A compile that reuses a block of a version being pruned (services/retention.py, "Races") ends with every block
it links live, whichever side takes the block's key row first; nothing is left without a version or a record;
and the two lock the shared key rows in one order, whatever plan each query gets (no deadlock).

The fake backend cuts blocks of 4 memories (kvengine.fake.FAKE_BLOCK_MEMORIES): 9 memories give blocks b0 b1 and a
tail, 5 memories b0 and a tail, 13 memories b0 b1 b2 and a tail.
"""
from __future__ import annotations

import itertools
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
from django.db import connection

from cartridges.models import (
    BlobKey,
    CartridgeBlockDestruction,
    CartridgePrune,
    CartridgeVersion,
)
from cartridges.selectors import active_version
from cartridges.services import (
    cartridge_activate,
    cartridge_compile,
    cartridge_evaluate,
    kv_configuration_switch,
)
from cartridges.services.scope_settings import scope_settings_update
from tests.support.block_rows import assert_blocks_consistent, fill_facts, version_links
from tests.support.procs import database_url

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # generous: the 2 cores are shared with other test runs


# ---------------------------------------------------------------------------------------------------------------
# A prune racing a compile that reuses the pruned version's block (two processes)
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_row(fake_engine):
    """The fake engine as the active configuration row (the compile subprocess reads it too)."""
    return kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)


def _race_setup(scope, append) -> tuple[CartridgeVersion, CartridgeVersion]:
    """``old`` (b0 b1) active, keep_previous_versions=0, ``new`` (b0 only, a lower head) evaluated and ready to
    activate (which prunes ``old`` and, unless another version links it, b1); 4 more memories appended, so a compile
    now reuses b0 and b1 and adds b2."""
    fifth = fill_facts(scope, append, 5)
    fill_facts(scope, append, 4, start=5)
    old = cartridge_compile(scope=scope)
    cartridge_activate(version=old)
    new = cartridge_compile(scope=scope, log_head=fifth.seq)
    assert cartridge_evaluate(version=new).passed
    scope_settings_update(scope=scope, actor=None, keep_previous_versions=0)
    fill_facts(scope, append, 4, start=9)
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
    b1 = version_links(old)[1].block
    blobs_before = BlobKey.objects.count()
    proc = _compile_process(scope_a, pause_s=4)
    killed_at_teardown.append(proc)
    # the compile wrote its tail and b2, found b0 and b1 live, and now pauses before its transaction
    _wait(lambda: BlobKey.objects.count() == blobs_before + 2, what="the compile to write its blobs", proc=proc)
    cartridge_activate(version=new)  # prunes old: b1 is used by no version (the compile has not linked it yet)
    assert CartridgeBlockDestruction.objects.filter(block=b1).exists() and proc.poll() is None

    version, _ = _finish(proc)  # its lock finds b1's key gone: BlockGoneDuringCompile, so it compiles again
    links = version_links(version)
    assert len(links) == 3
    assert links[0].block_id == version_links(new)[0].block_id  # b0, still live, reused
    assert links[1].block.block_id == b1.block_id and links[1].block_id != b1.pk  # b1 stored again as a new row
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=1).exists()
    assert_blocks_consistent()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_prune_that_waits_for_a_compile_holding_the_reused_blocks_keeps_them(race, scope_a, killed_at_teardown):
    old, new = race
    b1 = version_links(old)[1].block
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
    assert [link.block_id for link in version_links(version)[:2]] == [link.block_id for link in version_links(old)]  # the same rows
    assert active_version(scope=scope_a) == new
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=0).exists()  # only old's tail went
    assert not CartridgeBlockDestruction.objects.filter(block=b1).exists()
    assert_blocks_consistent()


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
    b0, b1 = [link.block for link in version_links(old)]
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
    links = version_links(version)
    assert [link.block_id for link in links[:2]] == [b0.pk, b1.pk]  # the compile locked first: the prune kept both
    assert CartridgePrune.objects.filter(version=old, num_blocks_destroyed=0).exists()
    assert_blocks_consistent()
