"""One tenant erasing another's data, and what a client can learn about scopes it is not granted.

Before the fix subjects were global: charlie, granted only scope C, appended one memory for `bob` in C, filed
an erasure for `bob` through C, and bob's memories in alice's scope A became erased; the 409 on appending
for an erased subject told a client that a subject it had never seen existed and when it was erased; the
head endpoint showed the global head. Subjects are now per scope (memories.models.Subject).
"""
from __future__ import annotations

import pytest

from memories.models import ErasureStatus, Subject
from memories.selectors import erasure_request_status, scope_memories_open
from memories.services import erasure_request_file, erasure_request_process, memory_append

pytestmark = pytest.mark.django_db

ALICES = "Bob (alice's colleague) parks on level 3."


@pytest.fixture
def bob_in_a(scope_a, alice):
    return memory_append(scope=scope_a, subject="bob", content=ALICES)


def test_a_client_cannot_erase_a_subject_of_a_scope_it_is_not_granted(
    bob_in_a, scope_a, scope_c, charlie, api_client_for, eager_tasks, record_figures, django_capture_on_commit_callbacks
):
    from memories.models import ErasureRequest

    client = api_client_for(charlie)
    appended = client.post("/api/v1/scopes/scope-c/memories/", {"content": "bob said hi", "subject": "bob"}, format="json")
    assert appended.status_code == 201
    with django_capture_on_commit_callbacks(execute=True):  # processed in-process after commit (eager tasks)
        filed = client.post("/api/v1/scopes/scope-c/erasure-requests/", {"subject": "bob", "reason": "take-over"}, format="json")
    assert filed.status_code == 201, filed.content
    request = ErasureRequest.objects.get(pk=filed.json()["id"])
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT

    in_a = scope_memories_open(scope=scope_a)
    assert [(m.subject, m.text, m.erased) for m in in_a] == [("bob", ALICES, False)]  # alice's bob untouched
    in_c = scope_memories_open(scope=scope_c)
    assert [m.erased for m in in_c] == [True]
    assert Subject.objects.filter(external_id="bob", shredded_at__isnull=True).count() == 1
    record_figures(scenario="erasure through a foreign scope", scopes_affected=1, other_scope_memories_erased=0)


def test_appending_for_a_subject_erased_in_another_scope_reveals_nothing(
    bob_in_a, scope_a, alice, charlie, api_client_for
):
    request = erasure_request_file(subject="bob", requested_by=alice, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)
    # charlie has never seen alice's bob: appending for "bob" in C is an ordinary first memory
    r = api_client_for(charlie).post("/api/v1/scopes/scope-c/memories/", {"content": "x", "subject": "bob"}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["erased"] is False and "shredded" not in r.content.decode()
    # in A itself the erased subject stays erased (the client of A knows it filed the erasure)
    r = api_client_for(alice).post("/api/v1/scopes/scope-a/memories/", {"content": "y", "subject": "bob"}, format="json")
    assert r.status_code == 409 and r.json()["extra"]["field"] == "subject"


def test_a_client_sees_its_scope_head_never_the_global_one(scope_a, scope_c, alice, charlie, api_client_for):
    for i in range(5):
        memory_append(scope=scope_a, content=f"busy scope fact {i}")
    memory_append(scope=scope_c, content="charlie's only memory")  # seq 6
    for i in range(4):
        memory_append(scope=scope_a, content=f"more busy facts {i}")  # global head 10
    client = api_client_for(charlie)
    head = client.get("/api/v1/scopes/scope-c/head/").json()
    assert head == {"scope": "scope-c", "head": 6, "scope_head": 6}
    listing = client.get("/api/v1/scopes/scope-c/memories/").json()
    assert listing["as_of"] == 6
    too_far = client.get("/api/v1/scopes/scope-c/memories/?as_of=9").json()
    assert "10" not in too_far["message"] and too_far["extra"]["head"] == 6
    compile_too_far = client.post("/api/v1/scopes/scope-c/cartridges/compile/", {"log_head": 10}, format="json")
    metrics = client.get("/api/v1/kv/metrics").json()
    assert metrics["log_head"] == 6 and [row["scope"] for row in metrics["scopes"]] == ["scope-c"]
    message = compile_too_far.json()["message"]
    assert compile_too_far.status_code == 400 and message.endswith("head 6 but got 10") and message.count("10") == 1


def test_a_scope_not_granted_answers_exactly_like_one_that_does_not_exist(scope_a, charlie, api_client_for):
    client = api_client_for(charlie)
    for path in ("/api/v1/scopes/{}/head/", "/api/v1/scopes/{}/memories/", "/api/v1/scopes/{}/cartridges/"):
        granted_elsewhere = client.get(path.format("scope-a"))
        unknown = client.get(path.format("scope-q"))
        assert granted_elsewhere.status_code == unknown.status_code == 404
        assert granted_elsewhere.json()["message"] == unknown.json()["message"].replace("scope-q", "scope-a")


def test_an_operator_erasure_without_a_scope_covers_the_subject_in_every_scope(bob_in_a, scope_a, scope_c):
    memory_append(scope=scope_c, subject="bob", content="charlie's bob")
    request = erasure_request_file(subject="bob", requested_by=None, reason="erase everywhere")
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert not Subject.objects.filter(external_id="bob", shredded_at__isnull=True).exists()
    assert [m.erased for m in scope_memories_open(scope=scope_a)] == [True]
    assert [m.erased for m in scope_memories_open(scope=scope_c)] == [True]


def test_a_client_cannot_erase_a_legacy_global_subject_that_also_lives_in_a_foreign_scope(
    scope_a, scope_c, alice, charlie
):
    """A subject filed before subjects were per scope (no scope) with memories in A and C."""
    from memories import crypto
    from memories.models import Memory

    data_key = crypto.new_data_key()
    wrapped, kid = crypto.wrap(data_key, aad=crypto.subject_key_aad("eve"))
    legacy = Subject.objects.create(external_id="eve", wrapped_key=wrapped, wrapped_by=kid)
    for scope, text in ((scope_a, "eve in A"), (scope_c, "eve in C")):
        seq = memory_append(scope=scope, content="placeholder").seq + 1000  # a seq no append will take here
        nonce, ciphertext = crypto.seal(
            data_key, text.encode(), aad=crypto.memory_aad(seq=seq, scope_id=scope.pk, subject_id=legacy.pk)
        )
        Memory.objects.create(seq=seq, scope=scope, subject=legacy, nonce=nonce, ciphertext=ciphertext)
    from core.errors import Conflict

    with pytest.raises(Conflict) as refused:
        erasure_request_file(subject="eve", requested_by=charlie, reason="take-over", scope=scope_c)
    assert refused.value.extra["kind"] == "legacy_subject_needs_operator"
    assert not Subject.objects.get(pk=legacy.pk).is_shredded
    # through A alone (alice is granted A only) it is refused too; an operator's erasure everywhere works
    with pytest.raises(Conflict):
        erasure_request_file(subject="eve", requested_by=alice, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=erasure_request_file(subject="eve", requested_by=None, reason="operator"))
    assert Subject.objects.get(pk=legacy.pk).is_shredded


def _legacy(external_id, scopes_texts):
    """A subject filed before subjects were per scope (no scope), with a memory in each given scope."""
    from memories import crypto
    from memories.models import Memory

    data_key = crypto.new_data_key()
    wrapped, kid = crypto.wrap(data_key, aad=crypto.subject_key_aad(external_id))
    legacy = Subject.objects.create(external_id=external_id, wrapped_key=wrapped, wrapped_by=kid)
    for scope, text in scopes_texts:
        seq = memory_append(scope=scope, content="placeholder").seq + 1000
        nonce, ct = crypto.seal(data_key, text.encode(), aad=crypto.memory_aad(seq=seq, scope_id=scope.pk, subject_id=legacy.pk))
        Memory.objects.create(seq=seq, scope=scope, subject=legacy, nonce=nonce, ciphertext=ct)
    return legacy


def test_a_per_scope_row_with_the_same_id_does_not_carry_a_client_erasure_to_a_legacy_subject(
    scope_a, scope_c, alice, charlie
):
    """Review finding: one append of "eve" in C made the legacy "eve" (A and C) erasable through C."""
    from core.errors import Conflict

    legacy = _legacy("eve", [(scope_a, "eve in A"), (scope_c, "eve in C")])
    memory_append(scope=scope_c, subject="eve", content="eve again in C")
    with pytest.raises(Conflict) as refused:
        erasure_request_file(subject="eve", requested_by=charlie, reason="take-over", scope=scope_c)
    assert refused.value.extra["kind"] == "legacy_subject_needs_operator"
    assert not Subject.objects.get(pk=legacy.pk).is_shredded
    assert [m.erased for m in scope_memories_open(scope=scope_a) if m.subject == "eve"] == [False]


def test_subject_ids_with_invisible_characters_are_refused(scope_a, alice, api_client_for):
    """Review finding: "bob\\u200b" looked like "bob" but was another subject, which an erasure of "bob" missed."""
    client = api_client_for(alice)
    for sneaky in ("bob\u200b", "b\u200dob", "\u202ebob", "bob\u2028"):
        r = client.post("/api/v1/scopes/scope-a/memories/", {"content": "x", "subject": sneaky}, format="json")
        assert r.status_code == 400 and r.json()["extra"]["field"] == "subject", (sneaky, r.content)
    assert not Subject.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_append_racing_a_shred_is_refused_or_seen_by_the_erasure(scope_a, monkeypatch):
    """Review finding: an append that unwrapped the key before the shred committed still committed (201)."""
    import threading

    from django.db import connection

    from memories import crypto

    memory_append(scope=scope_a, subject="bob", content="bob parks on level 3")
    subject = Subject.objects.get(scope=scope_a, external_id="bob")
    sealed, go = threading.Event(), threading.Event()
    real_seal = crypto.seal

    def slow_seal(key, data, *, aad):
        out = real_seal(key, data, aad=aad)
        if threading.current_thread().name == "appender":
            sealed.set()
            assert go.wait(10)
        return out

    monkeypatch.setattr(crypto, "seal", slow_seal)
    result = {}

    def appender():
        try:
            result["memory"] = memory_append(scope=scope_a, subject="bob", content="bob's new phone is 555-0199")
        except Exception as exc:  # the 409 is the expected outcome; anything is reported to the test
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=appender, name="appender")
    thread.start()
    assert sealed.wait(10)
    def shredder_run():
        from memories.services import subject_shred

        try:
            subject_shred(subject=subject)
        finally:
            connection.close()

    shredder = threading.Thread(target=shredder_run)
    shredder.start()
    shredder.join(1.0)
    assert shredder.is_alive()  # the shred waits for the append holding the subject's row
    go.set()
    thread.join(20)
    shredder.join(20)
    assert "memory" in result  # the append committed first; the shred came after it and erased it
    assert [m.erased for m in scope_memories_open(scope=scope_a)] == [True, True]
