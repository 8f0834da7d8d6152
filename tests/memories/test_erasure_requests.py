"""Erasure requests: filed with who/when/why, processed by a service and a task, with a visible status."""
from __future__ import annotations

import pytest

from core.errors import MnesioError, NotFound
from memories import registry
from memories.jobs import erasure_request_enqueue
from memories.models import ErasureEvent, ErasureRequest, Subject
from memories.selectors import erasure_request_status, scope_memories_open
from memories.services import erasure_request_file, erasure_request_process, memory_append
from memories.tasks import erasure_request_process_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def rebuilt():
    """Register a view rebuilder that records the requests it saw."""
    seen: list[int] = []

    def rebuilder(erasure_request):
        seen.append(erasure_request.pk)

    registry.register_view_rebuilder(rebuilder)
    yield seen
    registry.unregister_view_rebuilder(rebuilder)


def test_it_files_a_request_with_who_when_and_why(scope_a, alice):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="GDPR art. 17 request", scope=scope_a)
    assert (request.subject.external_id, request.requested_by, request.reason) == ("p-1", alice, "GDPR art. 17 request")
    assert request.created_at is not None
    assert erasure_request_status(erasure_request=request) == "requested"
    assert Subject.objects.get(external_id="p-1").shredded_at is None  # filing alone shreds nothing


def test_it_shreds_then_rebuilds_views_and_records_each_step(scope_a, alice, rebuilt):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    memory_append(scope=scope_a, subject="p-2", content="p-2 lives in Bruges.")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
    erasure_request_process(erasure_request=request, actor=alice)
    assert list(ErasureEvent.objects.filter(request=request).values_list("status", flat=True)) == [
        "requested",
        "keys_shredded",
        "views_rebuilt",
    ]
    assert rebuilt == [request.pk]
    assert [(m.subject, m.erased) for m in scope_memories_open(scope=scope_a)] == [("p-1", True), ("p-2", False)]


def test_it_is_safe_to_process_twice(scope_a, alice, rebuilt):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
    erasure_request_process(erasure_request=request)
    erasure_request_process(erasure_request=request)
    assert ErasureEvent.objects.filter(request=request).count() == 3
    assert rebuilt == [request.pk]


def test_it_records_a_failed_rebuild_with_its_reason_and_finishes_on_a_retry(scope_a, alice):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
    attempts = []

    def flaky(erasure_request):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("blob storage unavailable")

    registry.register_view_rebuilder(flaky)
    try:
        erasure_request_process(erasure_request=request)
        assert erasure_request_status(erasure_request=request) == "failed"
        failed = ErasureEvent.objects.get(request=request, status="failed")
        assert "RuntimeError: blob storage unavailable" in failed.detail
        assert Subject.objects.get(external_id="p-1").shredded_at is not None  # the shred happened first
        erasure_request_process(erasure_request=request)
    finally:
        registry.unregister_view_rebuilder(flaky)
    assert erasure_request_status(erasure_request=request) == "views_rebuilt"
    assert list(ErasureEvent.objects.filter(request=request).values_list("status", flat=True)) == [
        "requested",
        "keys_shredded",
        "failed",
        "views_rebuilt",
    ]


def test_the_task_takes_an_id_and_processes_the_request(scope_a, alice, rebuilt):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
    assert erasure_request_process_task.apply(args=[request.pk]).get() == "views_rebuilt"
    assert rebuilt == [request.pk]


def test_enqueueing_a_filed_request_queues_the_task_after_commit(
    scope_a, alice, django_capture_on_commit_callbacks, monkeypatch
):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    queued = []
    monkeypatch.setattr(erasure_request_process_task, "apply_async", lambda args, **options: queued.append(args[0]))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        request = erasure_request_file(subject="p-1", requested_by=alice, reason="asked")
        outcome = erasure_request_enqueue(erasure_request=request)
        assert queued == [] and outcome.status == "queued"  # nothing is sent before the filing commits
    assert len(callbacks) == 1
    assert queued == [request.pk]


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        ({"subject": "nobody", "reason": "asked"}, NotFound, "subject"),
        ({"subject": "", "reason": "asked"}, MnesioError, "subject"),
        ({"subject": "p-1", "reason": "  "}, MnesioError, "reason"),
        ({"subject": "p-1", "reason": "r" * 2001}, MnesioError, "reason"),
    ],
)
def test_it_refuses_bad_erasure_requests_without_writing(scope_a, alice, kwargs, error, field):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    with pytest.raises(error, match=f"`{field}`"):
        erasure_request_file(requested_by=alice, **kwargs)
    assert ErasureRequest.objects.count() == 0 and ErasureEvent.objects.count() == 0


def test_it_refuses_a_subject_without_memories_in_the_filing_scope(scope_a, scope_c, charlie):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    with pytest.raises(NotFound, match="`subject` 'p-1' has no memories in scope 'scope-c'"):
        erasure_request_file(subject="p-1", requested_by=charlie, reason="asked", scope=scope_c)
    assert ErasureRequest.objects.count() == 0
