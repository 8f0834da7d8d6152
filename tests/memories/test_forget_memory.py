"""Forget one memory (its own key shredded), delete a whole scope, and legacy memories without own keys."""
from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import connection, transaction

from core.errors import Conflict, NotFound
from memories import crypto
from memories.models import ErasureKind, ErasureRequest, ErasureStatus, LogHead, Memory, MemoryKey, ScopeKey, Subject
from memories.selectors import erasure_request_status, scope_memories, scope_memories_open
from memories.services import (
    master_key_rotate,
    memories_append_batch,
    memory_append,
    memory_forget_file,
    memory_keys_backfill,
    scope_create,
    scope_delete_file,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_a(alice, api_client_for):
    return api_client_for(alice)


def _texts(scope) -> list[tuple[int, str | None, bool]]:
    return [(m.seq, m.text, m.erased) for m in scope_memories_open(scope=scope)]


def _legacy_append(scope, content: str, subject: str | None = None) -> Memory:
    """A memory as appends wrote it before memories had own keys: sealed with the subject's or scope's key."""
    if subject is None:
        if not ScopeKey.objects.filter(scope=scope).exists():
            memory_append(scope=scope, content="(creates the scope key)")
        row = ScopeKey.objects.get(scope=scope)
        parent = crypto.unwrap(bytes(row.wrapped_key), wrapped_by=row.wrapped_by, aad=crypto.scope_key_aad(scope.pk))
        subject_row = None
    else:
        subject_row = Subject.objects.filter(scope=scope, external_id=subject).first()
        if subject_row is None:
            memory_append(scope=scope, subject=subject, content=f"(creates {subject}'s key)")
            subject_row = Subject.objects.get(scope=scope, external_id=subject)
        parent = crypto.unwrap(bytes(subject_row.wrapped_key), wrapped_by=subject_row.wrapped_by,
                               aad=crypto.subject_key_aad(subject_row.external_id, subject_row.scope_id))
    with transaction.atomic():
        LogHead.objects.filter(pk=1)._privileged_update(head=LogHead.objects.get(pk=1).head + 1)
        seq = LogHead.objects.get(pk=1).head
        nonce, ciphertext = crypto.seal(parent, content.encode(), aad=crypto.memory_aad(
            seq=seq, scope_id=scope.pk, subject_id=subject_row.pk if subject_row else None))
        return Memory.objects.create(seq=seq, scope=scope, subject=subject_row, nonce=nonce, ciphertext=ciphertext)


def test_forgetting_one_memory_shreds_its_own_key_and_nothing_else(client_a, scope_a):
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    memory_append(scope=scope_a, subject="dana", content="Dana parks in bay 12.")
    memory_append(scope=scope_a, content="The cat is called Miso.")
    r = client_a.delete("/api/v1/scopes/scope-a/memories/1/")
    assert r.status_code == 202, r.json()
    assert r.json()["kind"] == "memory" and r.json()["seq"] == 1 and r.json()["subject"] is None
    assert r.json()["status"] in ("keys_shredded", "views_rebuilt")
    assert _texts(scope_a) == [(1, None, True), (2, "Dana parks in bay 12.", False), (3, "The cat is called Miso.", False)]
    got = client_a.get("/api/v1/scopes/scope-a/memories/1/").json()
    assert got["erased"] is True and got["text"] is None and got["metadata"] == {}
    key = MemoryKey.objects.get(memory_id=1)
    assert key.wrapped_key is None and key.shredded_at is not None and key.resealed is None
    assert Memory.objects.count() == 3  # the log row stays
    assert Subject.objects.get(external_id="dana").wrapped_key is not None  # dana's other memory lives on


def test_forgetting_twice_returns_the_first_request(client_a, scope_a):
    memory_append(scope=scope_a, content="Forget me.")
    first = client_a.delete("/api/v1/scopes/scope-a/memories/1/", {"reason": "asked"}, format="json").json()
    second = client_a.delete("/api/v1/scopes/scope-a/memories/1/")
    assert second.status_code == 202 and second.json()["id"] == first["id"]
    assert ErasureRequest.objects.filter(kind=ErasureKind.MEMORY).count() == 1


def test_a_memory_erased_with_its_subject_is_a_conflict(scope_a):
    from memories.services import subject_shred

    memory_append(scope=scope_a, subject="dana", content="Dana's fact.")
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    with pytest.raises(Conflict, match="already erased"):
        memory_forget_file(scope=scope_a, seq=1, requested_by=None)


def test_forgetting_an_erased_memory_over_the_api_is_a_409_with_its_code(client_a, scope_a):
    from memories.services import subject_shred

    memory_append(scope=scope_a, subject="dana", content="Dana's fact.")
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    response = client_a.delete("/api/v1/scopes/scope-a/memories/1/")
    assert response.status_code == 409 and response.json()["code"] == "already_erased"


def test_another_scopes_seq_looks_like_no_memory(client_a, charlie, api_client_for, scope_a, scope_c):
    memory_append(scope=scope_a, content="A's fact.")
    memory_append(scope=scope_c, content="C's fact.")
    client_c = api_client_for(charlie)
    # charlie cannot reach A at all, nor A's seq 1 through C
    assert client_c.delete("/api/v1/scopes/scope-a/memories/1/").status_code == 404
    r = client_c.delete("/api/v1/scopes/scope-c/memories/1/")
    assert r.status_code == 404 and r.json()["extra"]["field"] == "seq"
    # and alice cannot forget C's seq 2 through A
    assert client_a.delete("/api/v1/scopes/scope-a/memories/2/").status_code == 404
    assert not MemoryKey.objects.filter(shredded_at__isnull=False).exists()
    with pytest.raises(NotFound):
        memory_forget_file(scope=scope_a, seq=2, requested_by=None)


@pytest.mark.postgres
def test_raw_sql_cannot_change_a_log_row_or_revive_a_shredded_key(scope_a):
    memory = memory_append(scope=scope_a, content="Forget me.")
    wrapped = bytes(MemoryKey.objects.get(memory_id=memory.seq).wrapped_key)
    memory_forget_file(scope=scope_a, seq=memory.seq, requested_by=None)
    statements = [
        ("UPDATE memories_memory SET ciphertext = %s", [b"x"]),
        ("DELETE FROM memories_memory", None),
        ("UPDATE memories_memorykey SET wrapped_key = %s, shredded_at = NULL", [wrapped]),
        ("UPDATE memories_memorykey SET shredded_at = now()", None),
        ("DELETE FROM memories_memorykey", None),
    ]
    for sql, params in statements:
        with pytest.raises(Exception, match="Cannot|append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    key = MemoryKey.objects.get(memory_id=memory.seq)
    assert key.wrapped_key is None and Memory.objects.count() == 1


@pytest.mark.postgres
def test_raw_sql_cannot_swap_a_live_own_key_for_another(scope_a):
    memory_append(scope=scope_a, content="one")
    memory_append(scope=scope_a, content="two")
    with pytest.raises(Exception, match="Cannot"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE memories_memorykey SET wrapped_key = (SELECT wrapped_key FROM memories_memorykey WHERE seq = 2) WHERE seq = 1")
    assert [t for _, t, _ in _texts(scope_a)] == ["one", "two"]


def test_a_legacy_memory_is_forgotten_alone_and_its_old_key_is_gone(scope_a):
    memory_append(scope=scope_a, subject="dana", content="new-style dana fact")  # seq 1, own key
    legacy_a = _legacy_append(scope_a, "Dana's old PIN is 1234.", subject="dana")
    legacy_b = _legacy_append(scope_a, "Dana's old bike is red.", subject="dana")
    legacy_c = _legacy_append(scope_a, "The office is on floor 3.")
    subject = Subject.objects.get(external_id="dana")
    old_subject_key = crypto.unwrap(bytes(subject.wrapped_key), wrapped_by=subject.wrapped_by,
                                    aad=crypto.subject_key_aad("dana", scope_a.pk))
    assert not MemoryKey.objects.filter(memory_id=legacy_a.seq).exists()
    before = _texts(scope_a)

    memory_forget_file(scope=scope_a, seq=legacy_a.seq, requested_by=None)

    after = dict((seq, (text, erased)) for seq, text, erased in _texts(scope_a))
    assert after[legacy_a.seq] == (None, True)
    assert after[legacy_b.seq] == ("Dana's old bike is red.", False)
    assert after[legacy_c.seq] == ("The office is on floor 3.", False)
    assert after[1] == ("new-style dana fact", False)
    assert len(after) == len(before)
    subject.refresh_from_db()
    assert subject.key_generation == 2
    new_subject_key = crypto.unwrap(bytes(subject.wrapped_key), wrapped_by=subject.wrapped_by,
                                    aad=crypto.subject_key_aad("dana", scope_a.pk))
    assert new_subject_key != old_subject_key
    # the forgotten row's ciphertext was sealed with the old key, which no row holds any more
    row = Memory.objects.get(seq=legacy_a.seq)
    with pytest.raises(crypto.InvalidTag):
        crypto.unseal(new_subject_key, row.nonce, row.ciphertext,
                      aad=crypto.memory_aad(seq=row.seq, scope_id=scope_a.pk, subject_id=subject.pk))
    assert ErasureRequest.objects.get(kind="memory").memory_id == legacy_a.seq


def test_the_backfill_command_gives_every_legacy_memory_an_own_key(scope_a, scope_c):
    legacy = [_legacy_append(scope_a, "legacy one"), _legacy_append(scope_a, "legacy two", subject="eve"),
              _legacy_append(scope_c, "legacy three")]
    texts_before = _texts(scope_a) + _texts(scope_c)
    call_command("memory_keys_backfill")
    assert all(MemoryKey.objects.filter(memory_id=m.seq, resealed__isnull=False).exists() for m in legacy)
    assert _texts(scope_a) + _texts(scope_c) == texts_before
    assert not Memory.objects.filter(own_key__isnull=True).exists()
    assert ScopeKey.objects.get(scope=scope_a).key_generation == 2
    assert memory_keys_backfill() == 0  # safe to repeat: nothing left to do
    # a backfilled memory is forgotten like any other
    memory_forget_file(scope=scope_a, seq=legacy[1].seq, requested_by=None)
    assert dict((s, e) for s, _, e in _texts(scope_a))[legacy[1].seq] is True


def test_master_key_rotation_keeps_own_keys_opening(scope_a, settings):
    old_key, new_key = os.urandom(32), os.urandom(32)
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = old_key, None
    memories_append_batch(scope=scope_a, items=[{"content": "a", "subject": "dana", "metadata": {"k": 1}}, {"content": "b"}])
    _legacy_append(scope_a, "legacy c")
    own_before = {k.memory_id: bytes(k.wrapped_key) for k in MemoryKey.objects.all()}
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = new_key, old_key
    report = master_key_rotate()
    assert report.by_table["subject keys"] == 1 and report.by_table["scope keys"] == 1
    settings.MNESIO_MASTER_KEY_OLD = None  # the new key alone from here on
    # own keys are wrapped by data keys, not by the master key: the rotation did not have to touch them
    assert {k.memory_id: bytes(k.wrapped_key) for k in MemoryKey.objects.all()} == own_before
    opened = scope_memories_open(scope=scope_a)
    assert [(m.text, m.metadata) for m in opened if m.text in ("a", "b", "legacy c")] == [
        ("a", {"k": 1}), ("b", {}), ("legacy c", {})
    ]
    # and the backfill and a forget work with the new key alone
    memory_forget_file(scope=scope_a, seq=opened[-1].seq, requested_by=None)
    assert scope_memories_open(scope=scope_a)[-1].erased


# ---------------------------------------------------------------------------
# Deleting a whole scope
# ---------------------------------------------------------------------------
def _grant_delete_scope(user) -> None:
    user.user_permissions.add(Permission.objects.get(codename="delete_scope", content_type__app_label="memories"))


def test_a_client_without_the_permission_cannot_delete_its_scope(client_a, scope_a):
    memory_append(scope=scope_a, content="stay")
    r = client_a.delete("/api/v1/scopes/scope-a/")
    assert r.status_code == 403 and "memories.delete_scope" in r.json()["message"]
    assert _texts(scope_a) == [(1, "stay", False)]
    scope_a.refresh_from_db()
    assert scope_a.deleted_at is None and not ErasureRequest.objects.exists()


def test_the_permission_does_not_reach_a_scope_that_is_not_granted(charlie, api_client_for, scope_a, scope_c):
    _grant_delete_scope(charlie)
    memory_append(scope=scope_a, content="A's fact")
    assert api_client_for(charlie).delete("/api/v1/scopes/scope-a/").status_code == 404
    assert _texts(scope_a) == [(1, "A's fact", False)]


def test_deleting_a_scope_shreds_every_key_of_it_and_hides_it(alice, client_a, scope_a, scope_c):
    _grant_delete_scope(alice)
    memories_append_batch(scope=scope_a, items=[
        {"content": "A one", "subject": "dana"}, {"content": "A two"}, {"content": "A three", "subject": "eve"},
    ])
    legacy = _legacy_append(scope_a, "A legacy")
    memory_append(scope=scope_c, content="C stays", subject="dana")
    r = client_a.delete("/api/v1/scopes/scope-a/", {"reason": "the agent is retired"}, format="json")
    assert r.status_code == 202, r.json()
    assert r.json()["kind"] == "scope"
    request = ErasureRequest.objects.get(kind="scope")
    assert erasure_request_status(erasure_request=request) in (ErasureStatus.KEYS_SHREDDED, ErasureStatus.VIEWS_REBUILT)
    assert all(m.erased and m.text is None for m in scope_memories_open(scope=scope_a))
    assert len(scope_memories_open(scope=scope_a)) == 4 and legacy.seq in [m.seq for m in scope_memories(scope=scope_a)]
    assert not MemoryKey.objects.filter(memory__scope=scope_a, wrapped_key__isnull=False).exists()
    assert not Subject.objects.filter(scope=scope_a, wrapped_key__isnull=False).exists()
    assert ScopeKey.objects.get(scope=scope_a).wrapped_key is None
    # gone for clients: reads, appends, listing, a second delete
    assert client_a.get("/api/v1/scopes/scope-a/memories/").status_code == 404
    assert client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "more"}, format="json").status_code == 404
    assert client_a.get("/api/v1/scopes/").json() == []
    assert client_a.delete("/api/v1/scopes/scope-a/").status_code == 404
    # and at the service level an append is refused too
    scope_a.refresh_from_db()
    with pytest.raises(NotFound):
        memory_append(scope=scope_a, content="more")
    # the other scope is untouched, its same-named subject included
    assert _texts(scope_c) == [(5, "C stays", False)]


def test_deleting_a_scope_twice_returns_the_first_request(scope_a, operator):
    memory_append(scope=scope_a, content="x")
    operator.user_permissions.add(Permission.objects.get(codename="delete_scope", content_type__app_label="memories"))
    first = scope_delete_file(scope=scope_a, requested_by=None)
    assert scope_delete_file(scope=scope_a, requested_by=None).pk == first.pk


def test_a_scope_created_after_a_deletion_cannot_reuse_its_name(scope_a):
    scope_delete_file(scope=scope_a, requested_by=None)
    with pytest.raises(Conflict):
        scope_create(name="scope-a")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_forgets_of_one_memory_file_one_request(scope_a):
    import threading

    from django.db import connection as thread_connection

    memory_append(scope=scope_a, content="Forget me once.")
    results, barrier = [], threading.Barrier(4)

    def forget() -> None:
        try:
            barrier.wait(10)
            results.append(memory_forget_file(scope=scope_a, seq=1, requested_by=None).pk)
        except BaseException as exc:  # reported to the test
            results.append(exc)
        finally:
            thread_connection.close()

    threads = [threading.Thread(target=forget) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 4 and all(isinstance(r, int) for r in results), results
    assert len(set(results)) == 1 and ErasureRequest.objects.filter(kind="memory").count() == 1
    assert scope_memories_open(scope=scope_a)[0].erased


def test_an_append_after_a_rekey_or_a_rotation_uses_the_scopes_current_key(scope_a, settings):
    # this process caches the scope's key; a backfill's re-key and a rotation's re-wrap change the row under it
    memory_append(scope=scope_a, content="cached")
    legacy = _legacy_append(scope_a, "legacy")
    memory_append(scope=scope_a, content="still cached")
    memory_keys_backfill()  # re-keys the scope key: the cached data key is no longer the scope's
    after_rekey = memory_append(scope=scope_a, content="after the re-key")
    old = crypto.master_key()
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = os.urandom(32), old
    master_key_rotate()
    settings.MNESIO_MASTER_KEY_OLD = None
    after_rotation = memory_append(scope=scope_a, content="after the rotation")
    texts = {seq: text for seq, text, _ in _texts(scope_a)}
    assert texts[legacy.seq] == "legacy"
    assert texts[after_rekey.seq] == "after the re-key" and texts[after_rotation.seq] == "after the rotation"
    scope_delete_file(scope=scope_a, requested_by=None)
    with pytest.raises(NotFound):  # the cached key does not outlive a deletion
        memory_append(scope=scope_a, content="too late")
    with pytest.raises(NotFound):
        memory_append(scope=scope_a, content="too late", subject="dana")
