"""The append-only triggers cannot be switched off by a non-superuser SQL client.

django-pgtrigger's triggers honour the session setting ``pgtrigger.ignore``, which any role may set: before
``core.triggers`` a non-superuser role with plain table privileges deleted a log row and un-shredded a subject.
"""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from memories.models import Memory, Subject
from memories.services import memory_append, subject_shred

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _trigger_names(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal", [table])
        return [row[0] for row in cursor.fetchall()]


def _as_plain_role(statements: list[tuple[str, list]]) -> None:
    """Run ``statements`` as a role that is neither superuser nor owner, with the ignore switch set for every trigger."""
    ignore = "{" + ",".join(_trigger_names("memories_memory") + _trigger_names("memories_subject")) + "}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mnesio_plain_role') THEN "
            "CREATE ROLE mnesio_plain_role NOSUPERUSER NOCREATEDB NOCREATEROLE; END IF; END $$"
        )
        cursor.execute("GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public TO mnesio_plain_role")
        cursor.execute("SET LOCAL ROLE mnesio_plain_role")
        cursor.execute("SELECT current_setting('is_superuser')")
        assert cursor.fetchone() == ("off",)
        cursor.execute("SELECT set_config('pgtrigger.ignore', %s, true)", [ignore])
        for sql, params in statements:
            cursor.execute(sql, params)


def test_a_plain_role_cannot_skip_the_triggers_with_pgtrigger_ignore(scope_a):
    memory = memory_append(scope=scope_a, subject="bob", content="bob parks on level 3")
    subject = Subject.objects.get(scope=scope_a, external_id="bob")
    subject_shred(subject=subject)
    with pytest.raises(DatabaseError, match="Cannot delete rows"):
        _as_plain_role([("DELETE FROM memories_memory WHERE id = %s", [memory.pk])])
    with pytest.raises(DatabaseError, match="Cannot update rows"):
        _as_plain_role([
            ("UPDATE memories_subject SET shredded_at = NULL, wrapped_key = 'x'::bytea WHERE id = %s", [subject.pk])
        ])
    with pytest.raises(DatabaseError, match="TRUNCATE is not allowed"):
        _as_plain_role([("SET CONSTRAINTS ALL IMMEDIATE", []), ("TRUNCATE memories_memory CASCADE", [])])
    assert Memory.objects.filter(pk=memory.pk).exists() and Subject.objects.get(pk=subject.pk).is_shredded
