"""Version rows and their state rows cannot be changed: triggers on PostgreSQL, the ORM everywhere."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from cartridges.models import (
    BlobKey,
    CartridgeActivation,
    CartridgeDestruction,
    CartridgeEvaluation,
    CartridgeVersion,
    CartridgeVersionSubject,
    KvConfiguration,
)
from cartridges.services import cartridge_activate, cartridge_compile, cartridge_destroy, kv_configuration_switch
from core.models import ImmutableRowError

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(scope_a, append, fake_engine):
    """One version with a subject, evaluated, activated, plus a second one destroyed, and a configuration row."""
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    v1 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v1)
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_destroy(version=v2, reason="retention")
    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    return v1


def _raw(sql: str, params: list) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


TABLES = [CartridgeVersion, CartridgeVersionSubject, CartridgeEvaluation, CartridgeActivation, CartridgeDestruction, KvConfiguration]


@pytest.mark.postgres
@pytest.mark.parametrize(
    "statement",
    ["UPDATE {table} SET id = id WHERE id = %s", "DELETE FROM {table} WHERE id = %s"],
    ids=["update", "delete"],
)
@pytest.mark.parametrize("model", TABLES, ids=lambda m: m.__name__)
def test_it_refuses_update_and_delete_of_a_lifecycle_row_by_sql(history, model, statement):
    row = model.objects.order_by("id").first()
    with pytest.raises(DatabaseError, match="Cannot (update|delete) rows"):
        _raw(statement.format(table=model._meta.db_table), [row.pk])
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.postgres
def test_it_refuses_changing_a_version_sha256_by_sql(history):
    with pytest.raises(DatabaseError):
        _raw(f"UPDATE {CartridgeVersion._meta.db_table} SET sha256 = %s WHERE id = %s", ["0" * 64, history.pk])
    history.refresh_from_db()
    assert history.sha256 != "0" * 64


def test_it_refuses_update_and_delete_through_the_orm(history):
    with pytest.raises(ImmutableRowError):
        history.save()
    with pytest.raises(ImmutableRowError):
        history.delete()
    with pytest.raises(ImmutableRowError):
        CartridgeVersion.objects.filter(pk=history.pk).update(log_head=99)
    with pytest.raises(ImmutableRowError):
        CartridgeEvaluation.objects.all().delete()
    assert CartridgeVersion.objects.filter(pk=history.pk, log_head=1).exists()


def _truncate(table: str) -> str:
    """Run TRUNCATE in a savepoint (deferred FK checks fired first, as the log tests do); return the error."""
    with pytest.raises(DatabaseError) as info, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f"TRUNCATE {table} CASCADE")
    return str(info.value)


@pytest.mark.postgres
@pytest.mark.parametrize("model", [*TABLES, BlobKey], ids=lambda m: m.__name__)
def test_it_refuses_truncate_of_every_append_only_cartridge_table(history, model):
    before = model.objects.count()
    assert "TRUNCATE is not allowed" in _truncate(model._meta.db_table)
    assert model.objects.count() == before > 0


@pytest.mark.postgres
def test_an_emptied_subject_index_does_not_let_an_erased_cartridge_serve(scope_a, append, fake_engine):
    """A superuser who disables the triggers and empties the index: erasure still finds and destroys the version."""
    import pgtrigger

    from cartridges.selectors import active_version, version_state
    from cartridges.services import cartridge_answer
    from memories.models import ErasureStatus
    from memories.selectors import erasure_request_status
    from memories.services import erasure_request_file, erasure_request_process

    append(scope_a, "The car is parked on level 3.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    with pgtrigger.ignore("cartridges.CartridgeVersionSubject:cartridgeversionsubject_protect_delete"):
        _raw("DELETE FROM cartridges_cartridgeversionsubject", [])
    assert not CartridgeVersionSubject.objects.exists()

    request = erasure_request_file(subject="dana", requested_by=None, reason="asked")
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert version_state(version=version) == "destroyed"
    answer = cartridge_answer(scope=scope_a, question="What is Dana's locker code?")
    assert answer.version_id != version.pk and "4417" not in answer.answer
    assert active_version(scope=scope_a).manifest["left_out"] == [2]


@pytest.mark.postgres
def test_the_migrated_database_holds_only_the_triggers_the_models_declare():
    """A migration that renames a table drops its old triggers first: none is left that no model declares."""
    import pgtrigger

    assert pgtrigger.prunable() == []
