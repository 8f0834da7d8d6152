"""Operator commands and housekeeping: compile/rebuild commands, orphan sweep, key re-wrap, blob key write-once."""
from __future__ import annotations

import os

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from cartridges.models import BlobKey, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import cartridge_compile, cartridge_rebuild
from cartridges.storage import blob_keys_rewrap, blob_read, blob_reserve, blob_write, blobs_sweep
from core.errors import Conflict
from memories.models import Subject
from memories.services import subject_shred
from tests.support.blobs import stored_files

pytestmark = pytest.mark.django_db


def test_it_compiles_and_activates_from_the_command(scope_a, append, fake_engine, capsys):
    append(scope_a, "The spare key is under the blue flowerpot.")
    call_command("cartridge_compile", "scope-a", "--activate")
    out = capsys.readouterr().out
    version = active_version(scope=scope_a)
    assert version is not None and f"version {version.pk}: head 1" in out and "state active" in out
    with pytest.raises(CommandError, match="`scope` 'nope' does not exist"):
        call_command("cartridge_compile", "nope")


def test_it_refuses_an_empty_scope_from_the_command(scope_a, fake_engine):
    with pytest.raises(CommandError, match="no memories to compile"):
        call_command("cartridge_compile", "scope-a")


def test_it_rebuilds_every_version_from_the_log_with_the_command(scope_a, append, fake_engine, capsys):
    append(scope_a, "The spare key is under the blue flowerpot.")
    v1 = cartridge_compile(scope=scope_a)
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    call_command("cartridge_rebuild", "--all")
    out = capsys.readouterr().out
    assert f"version {v1.pk}: rebuilt sha256 {v1.sha256} matches" in out
    assert f"version {v2.pk}: rebuilt sha256 {v2.sha256} matches" in out
    assert "2 version(s) rebuilt byte-identical" in out


def test_it_refuses_to_rebuild_a_version_whose_subject_was_erased(scope_a, append, fake_engine):
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    version = cartridge_compile(scope=scope_a)
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    with pytest.raises(Conflict, match="no longer yields the memories"):
        cartridge_rebuild(version=version)
    with pytest.raises(CommandError, match="did not rebuild"):
        call_command("cartridge_rebuild", str(version.pk))


def test_it_sweeps_the_blob_of_a_compile_that_died_before_its_row(scope_a, append, fake_engine, blob_root):
    append(scope_a, "The spare key is under the blue flowerpot.")
    live = cartridge_compile(scope=scope_a)
    # what a compile killed between writing its blob and committing its row leaves behind
    dead, key = blob_reserve(scope=scope_a)
    blob_write(blob=dead, key=key, data=b"partial cartridge")
    assert len(stored_files(blob_root)) == 2
    assert blobs_sweep(older_than_s=3600) == []  # a compile that young may still be running
    assert blobs_sweep(older_than_s=0) == [dead.storage_name]
    assert [str(p.relative_to(blob_root)) for p in stored_files(blob_root)] == [live.storage_name]
    assert list(BlobKey.objects.values_list("storage_name", flat=True)) == [live.storage_name]
    assert blob_read(version=live)  # the live blob is untouched


def test_it_rewraps_blob_keys_after_a_master_key_rotation(scope_a, append, fake_engine, settings):
    from memories import crypto

    append(scope_a, "The spare key is under the blue flowerpot.")
    version = cartridge_compile(scope=scope_a)
    old_key = crypto.master_key()
    new_key = os.urandom(32)
    settings.MNESIO_MASTER_KEY = new_key
    settings.MNESIO_MASTER_KEY_OLD = old_key
    assert blob_keys_rewrap() == 1 and blob_keys_rewrap() == 0
    settings.MNESIO_MASTER_KEY_OLD = None  # the old key is retired
    assert b"flowerpot" in blob_read(version=version)
    assert BlobKey.objects.get().wrapped_by == crypto.master_key_id(new_key)


@pytest.mark.postgres
def test_it_refuses_any_other_change_of_a_blob_key_by_sql(scope_a, append, fake_engine):
    append(scope_a, "The spare key is under the blue flowerpot.")
    version = cartridge_compile(scope=scope_a)
    with pytest.raises(DatabaseError, match="Cannot update"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {BlobKey._meta.db_table} SET storage_name = 'elsewhere' WHERE storage_name = %s",
                [version.storage_name],
            )
    assert CartridgeVersion.objects.get().storage_name == BlobKey.objects.get().storage_name


def test_rotate_master_key_rewraps_cartridge_blob_keys_in_the_same_run(scope_a, append, fake_engine, settings):
    from io import StringIO

    from django.core.management import call_command

    from memories import crypto

    append(scope_a, "The spare key is under the blue flowerpot.")
    version = cartridge_compile(scope=scope_a)
    old_key, new_key = crypto.master_key(), os.urandom(32)
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = new_key, old_key
    out = StringIO()
    call_command("rotate_master_key", stdout=out)
    assert "cartridge blob keys: re-wrapped 1 key(s)" in out.getvalue()
    settings.MNESIO_MASTER_KEY_OLD = None  # the old key is retired
    assert b"flowerpot" in blob_read(version=version)
    assert BlobKey.objects.get().wrapped_by == crypto.master_key_id(new_key)
