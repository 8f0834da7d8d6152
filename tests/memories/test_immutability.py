"""The log cannot be edited or lost: triggers on PostgreSQL (raw SQL too), the ORM everywhere."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from core.models import ImmutableRowError
from memories.models import ErasureEvent, ErasureRequest, LogHead, Memory, ScopeKey, Subject
from memories.services import erasure_request_file, memory_append

pytestmark = pytest.mark.django_db


def _raw(sql: str, params: list | None = None) -> None:
    """Run raw SQL in a savepoint, so a rejected statement leaves the test transaction usable."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Fire the deferred FK checks of this test's inserts now, or PostgreSQL refuses TRUNCATE for
        # "pending trigger events" before our trigger gets a say.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(sql, params or [])


def _rejected(sql: str, params: list | None = None) -> str:
    with pytest.raises(DatabaseError) as info:
        _raw(sql, params)
    return str(info.value)


@pytest.fixture
def two_memories(scope_a):
    memory_append(scope=scope_a, subject="subject-1", content="Subject one likes tea.")
    memory_append(scope=scope_a, content="The agent speaks French.")
    return list(Memory.objects.order_by("seq"))


@pytest.mark.postgres
def test_it_refuses_update_of_a_log_row_in_raw_sql(two_memories):
    message = _rejected("UPDATE memories_memory SET created_at = now() WHERE seq = 1")
    assert "Cannot update" in message
    message = _rejected("UPDATE memories_memory SET ciphertext = %s", [b"forged"])
    assert "Cannot update" in message
    assert bytes(Memory.objects.get(seq=1).ciphertext) == bytes(two_memories[0].ciphertext)


@pytest.mark.postgres
def test_it_refuses_delete_of_a_log_row_in_raw_sql(two_memories):
    message = _rejected("DELETE FROM memories_memory WHERE seq = 2")
    assert "Cannot delete" in message
    assert Memory.objects.count() == 2


@pytest.mark.postgres
def test_it_refuses_truncate_of_the_log_in_raw_sql(two_memories):
    message = _rejected("TRUNCATE memories_memory CASCADE")
    assert "TRUNCATE is not allowed" in message
    assert Memory.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.parametrize(
    "table",
    ["memories_subject", "memories_scopekey", "memories_memorykey", "memories_loghead", "memories_erasurerequest",
     "memories_erasureevent"],
)
def test_it_refuses_delete_and_truncate_of_keys_counter_and_erasure_records(two_memories, alice, table):
    erasure_request_file(subject="subject-1", requested_by=alice, reason="asked by the person")
    assert "Cannot delete" in _rejected(f"DELETE FROM {table}")
    assert "TRUNCATE is not allowed" in _rejected(f"TRUNCATE {table} CASCADE")


@pytest.mark.postgres
def test_it_refuses_updates_of_erasure_records_in_raw_sql(two_memories, alice):
    erasure_request_file(subject="subject-1", requested_by=alice, reason="asked by the person")
    assert "Cannot update" in _rejected("UPDATE memories_erasurerequest SET reason = 'changed'")
    assert "Cannot update" in _rejected("UPDATE memories_erasureevent SET status = 'views_rebuilt'")


@pytest.mark.postgres
def test_it_allows_only_the_one_way_shred_of_a_subject_key(two_memories):
    subject = Subject.objects.get(external_id="subject-1")
    # Swapping the key bytes, renaming the subject, or clearing the shred are all rejected.
    assert "Cannot update" in _rejected("UPDATE memories_subject SET wrapped_key = %s", [b"\x00" * 60])
    assert "Cannot update" in _rejected("UPDATE memories_subject SET external_id = 'someone-else'")
    # A shred without destroying the key bytes is rejected by the check constraint.
    _rejected("UPDATE memories_subject SET shredded_at = now()")
    _raw("UPDATE memories_subject SET shredded_at = now(), wrapped_key = NULL WHERE id = %s", [subject.pk])
    assert "Cannot update" in _rejected("UPDATE memories_subject SET shredded_at = NULL, wrapped_key = %s", [b"k"])
    assert "Cannot update" in _rejected("UPDATE memories_subject SET shredded_at = now()")


@pytest.mark.postgres
def test_it_lets_the_seq_counter_move_only_forward(two_memories):
    # a batch append moves it by its number of rows in one UPDATE, so + 2 is no longer refused
    assert "Cannot update" in _rejected("UPDATE memories_loghead SET head = 1")
    assert "Cannot update" in _rejected("UPDATE memories_loghead SET head = head")
    assert "Cannot update" in _rejected("UPDATE memories_loghead SET head = head - 1")
    assert LogHead.objects.get().head == 2


@pytest.mark.postgres
def test_it_allows_no_scope_key_change_but_a_rewrap(two_memories):
    assert "Cannot update" in _rejected("UPDATE memories_scopekey SET wrapped_key = %s", [b"\x00" * 60])
    assert ScopeKey.objects.count() == 1


def test_it_refuses_orm_changes_of_log_rows(two_memories):
    memory = two_memories[0]
    with pytest.raises(ImmutableRowError):
        memory.save()
    with pytest.raises(ImmutableRowError):
        memory.delete()
    with pytest.raises(ImmutableRowError):
        Memory.objects.filter(seq=1).update(idempotency_key="x")
    with pytest.raises(ImmutableRowError):
        Memory.objects.all().delete()
    with pytest.raises(ImmutableRowError):
        Subject.objects.all().update(shredded_at=None)
    with pytest.raises(ImmutableRowError):
        Subject.objects.get(external_id="subject-1").delete()
    assert Memory.objects.count() == 2


def test_it_refuses_orm_changes_of_erasure_records(two_memories, alice):
    request = erasure_request_file(subject="subject-1", requested_by=alice, reason="asked by the person")
    request.reason = "changed"
    with pytest.raises(ImmutableRowError):
        request.save()
    with pytest.raises(ImmutableRowError):
        ErasureEvent.objects.filter(request=request).delete()
    assert ErasureRequest.objects.get().reason == "asked by the person"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_refuses_truncate_of_committed_log_rows_outside_any_transaction():
    from memories.services import scope_create

    scope = scope_create(name="committed")
    memory_append(scope=scope, content="A committed memory.")
    with connection.cursor() as cursor:  # autocommit: the rows above are committed
        with pytest.raises(DatabaseError, match="TRUNCATE is not allowed"):
            cursor.execute("TRUNCATE memories_memory CASCADE")
        with pytest.raises(DatabaseError, match="Cannot delete"):
            cursor.execute("DELETE FROM memories_memory")
    assert Memory.objects.count() == 1
    # Teardown flushes the test database through memories' `flush`, which may ignore the triggers there only.


@pytest.mark.postgres
def test_the_database_rejects_changes_even_when_the_orm_guard_is_bypassed(two_memories):
    with pytest.raises(DatabaseError, match="Cannot update"), transaction.atomic():
        Memory.objects.filter(seq=1)._privileged_update(idempotency_key="forged")
    with pytest.raises(DatabaseError, match="Cannot delete"), transaction.atomic():
        Memory.objects.filter(seq=1)._raw_delete(using="default")
    assert Memory.objects.count() == 2 and Memory.objects.get(seq=1).idempotency_key is None


@pytest.mark.postgres
def test_it_refuses_to_undelete_a_scope_in_raw_sql(scope_a, scope_c, alice):
    from memories.models import Scope
    from memories.services import scope_delete_file

    memory_append(scope=scope_a, content="The agent speaks French.")
    alice.user_permissions.add(*_permissions("memories.delete_scope"))
    alice = type(alice).objects.get(pk=alice.pk)  # a fresh row: has_perm caches permissions
    scope_delete_file(scope=scope_a, requested_by=alice)
    assert "Cannot update" in _rejected("UPDATE memories_scope SET deleted_at = NULL WHERE id = %s", [scope_a.pk])
    assert "Cannot update" in _rejected("UPDATE memories_scope SET name = 'reborn' WHERE id = %s", [scope_a.pk])
    assert "Cannot delete" in _rejected("DELETE FROM memories_scope WHERE id = %s", [scope_a.pk])
    assert "TRUNCATE is not allowed" in _rejected("TRUNCATE memories_scope CASCADE")
    assert Scope.objects.get(pk=scope_a.pk).deleted_at is not None
    # a live scope's row still takes the one change it needs: being deleted (and a description edit)
    _raw("UPDATE memories_scope SET description = 'edited' WHERE id = %s", [scope_c.pk])
    assert Scope.objects.get(pk=scope_c.pk).description == "edited"


def _permissions(*dotted: str) -> list:
    from django.contrib.auth.models import Permission

    return [Permission.objects.get(content_type__app_label=d.split(".")[0], codename=d.split(".")[1]) for d in dotted]
