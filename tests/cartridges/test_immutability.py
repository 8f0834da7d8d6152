"""Version rows and their state rows cannot be changed: triggers on PostgreSQL, the ORM everywhere."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from cartridges.models import (
    CartridgeActivation,
    CartridgeDestruction,
    CartridgeEvaluation,
    CartridgeVersion,
    CartridgeVersionSubject,
    ImmutableRowError,
    KvConfiguration,
)
from cartridges.services import cartridge_activate, cartridge_compile, cartridge_destroy, kv_configuration_switch

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
@pytest.mark.parametrize("model", TABLES, ids=lambda m: m.__name__)
def test_it_refuses_update_of_a_lifecycle_row_by_sql(history, model):
    row = model.objects.order_by("id").first()
    with pytest.raises(DatabaseError, match="Cannot update or delete rows"):
        _raw(f"UPDATE {model._meta.db_table} SET id = id WHERE id = %s", [row.pk])


@pytest.mark.postgres
@pytest.mark.parametrize("model", TABLES, ids=lambda m: m.__name__)
def test_it_refuses_delete_of_a_lifecycle_row_by_sql(history, model):
    row = model.objects.order_by("id").first()
    with pytest.raises(DatabaseError, match="Cannot update or delete rows"):
        _raw(f"DELETE FROM {model._meta.db_table} WHERE id = %s", [row.pk])
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
