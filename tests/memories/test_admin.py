"""Admin: the log read-only and without plaintext, shred state visible, erasure requests processable."""
from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model

from memories.models import ErasureEvent, ErasureRequest, Memory, Scope, ScopeGrant, Subject
from memories.services import erasure_request_file, memory_append, subject_shred
from memories.tasks import erasure_request_process_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser(username="root", email="root@example.com", password="pw")
    client.force_login(user)
    client.user = user
    return client


def test_it_registers_the_log_without_add_change_or_delete(rf, admin_client):
    request = rf.get("/admin/")
    request.user = admin_client.user
    for model in (Memory, Subject):
        model_admin = site._registry[model]
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)
        assert model_admin.has_view_permission(request)


def test_the_log_list_shows_metadata_and_never_plaintext(admin_client, scope_a):
    memory_append(scope=scope_a, subject="p-1", content="The safe code is 8812.")
    memory_append(scope=scope_a, subject="p-2", content="p-2 owns a canoe.")
    subject_shred(subject=Subject.objects.get(external_id="p-2"))
    r = admin_client.get("/admin/memories/memory/")
    assert r.status_code == 200
    page = r.content.decode()
    assert "8812" not in page and "canoe" not in page
    assert "p-1" in page and "scope-a" in page
    detail = admin_client.get(f"/admin/memories/memory/{Memory.objects.get(seq=1).pk}/change/")
    assert detail.status_code == 200 and "8812" not in detail.content.decode()
    assert admin_client.post(f"/admin/memories/memory/{Memory.objects.get(seq=1).pk}/delete/").status_code == 403
    assert admin_client.get("/admin/memories/memory/add/").status_code == 403


def test_the_subject_list_shows_the_shred_state(admin_client, scope_a):
    memory_append(scope=scope_a, subject="kept", content="one")
    memory_append(scope=scope_a, subject="erased", content="two")
    subject_shred(subject=Subject.objects.get(external_id="erased"))
    page = admin_client.get("/admin/memories/subject/?shredded_at__isnull=False").content.decode()
    assert "erased" in page and ">kept<" not in page


def test_the_process_action_enqueues_after_commit(admin_client, scope_a, alice, monkeypatch, django_capture_on_commit_callbacks):
    memory_append(scope=scope_a, subject="p-1", content="one")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
    queued = []
    monkeypatch.setattr(erasure_request_process_task, "apply_async", lambda args, **options: queued.append(args[0]))
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client.post(
            "/admin/memories/erasurerequest/", {"action": "process", "_selected_action": [request.pk]}, follow=True
        )
    assert r.status_code == 200
    assert queued == [request.pk]
    assert "Queued 1 erasure request" in r.content.decode()


def test_an_operator_files_an_erasure_request_in_the_admin(admin_client, scope_a):
    memory_append(scope=scope_a, subject="p-1", content="one")
    subject = Subject.objects.get(external_id="p-1")
    r = admin_client.post("/admin/memories/erasurerequest/add/", {"subject": subject.pk, "reason": "phoned in"})
    assert r.status_code == 302, r.content.decode()[-2000:]
    request = ErasureRequest.objects.get()
    assert (request.requested_by.username, request.reason) == ("root", "phoned in")
    assert list(ErasureEvent.objects.values_list("status", flat=True)) == ["requested"]
    page = admin_client.get(f"/admin/memories/erasurerequest/{request.pk}/change/")
    assert page.status_code == 200 and "requested" in page.content.decode()
    assert admin_client.post(f"/admin/memories/erasurerequest/{request.pk}/delete/").status_code == 403


def test_scopes_and_grants_are_editable(admin_client, alice):
    r = admin_client.post(
        "/admin/memories/scope/add/",
        {
            "name": "scope-b",
            "description": "new",
            "grants-TOTAL_FORMS": "1",
            "grants-INITIAL_FORMS": "0",
            "grants-0-user": alice.pk,
        },
    )
    assert r.status_code == 302, r.content.decode()[-3000:]
    assert ScopeGrant.objects.filter(scope__name="scope-b", user=alice).exists()
    scope = Scope.objects.get(name="scope-b")
    assert admin_client.post(f"/admin/memories/scope/{scope.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Scope.objects.filter(name="scope-b").exists()
