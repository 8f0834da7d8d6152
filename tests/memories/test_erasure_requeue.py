"""The reconciler for lost broker messages: `manage.py erasure_requeue` and its periodic task send processing
again for erasure requests stuck in `requested`/`keys_shredded` past a grace period; a double send is harmless."""
from __future__ import annotations

import datetime as dt
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from memories import registry
from memories.models import ErasureEvent, ErasureStatus
from memories.selectors import erasure_request_status
from memories.services import erasure_request_file, erasure_request_process, erasure_requeue_grace_s, memory_append
from memories.tasks import erasure_request_process_task, erasure_requests_requeue_task

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """The broker, faked: the processing messages the reconciler sends, as (request id, expires)."""
    messages: list[tuple[int, int | None]] = []

    def apply_async(args, expires=None, **kwargs):
        messages.append((args[0], expires))

    monkeypatch.setattr(erasure_request_process_task, "apply_async", apply_async)
    return messages


@pytest.fixture
def later(monkeypatch):
    """later(seconds): move the clock forward (the reconciler compares the last step's time with now)."""
    real_now = timezone.now

    def move(seconds: float) -> None:
        monkeypatch.setattr(timezone, "now", lambda: real_now() + dt.timedelta(seconds=seconds))

    return move


def _request(scope, subject: str):
    memory_append(scope=scope, subject=subject, content=f"{subject} lives in Ghent.")
    return erasure_request_file(subject=subject, requested_by=None, reason="asked", scope=scope)  # message "lost"


def _requeue(*args: str) -> str:
    out = StringIO()
    call_command("erasure_requeue", *args, stdout=out)
    return out.getvalue()


def test_the_default_grace_outlasts_the_erasure_task(settings):
    assert erasure_requeue_grace_s() > settings.CELERY_TASK_TIME_LIMIT  # a running task is never raced


def test_it_requeues_requests_stuck_in_requested_or_keys_shredded_past_the_grace(scope_a, sent, later):
    requested = _request(scope_a, "p-1")
    shredded = _request(scope_a, "p-2")
    ErasureEvent.objects.create(request=shredded, status=ErasureStatus.KEYS_SHREDDED)  # died mid-rebuild
    done = _request(scope_a, "p-3")
    erasure_request_process(erasure_request=done)
    failed = _request(scope_a, "p-4")
    ErasureEvent.objects.create(request=failed, status=ErasureStatus.FAILED, detail="rebuilder: boom")

    assert "re-queued 0 erasure request(s)" in _requeue()  # within the grace: maybe still queued or running
    assert sent == []

    later(erasure_requeue_grace_s() + 1)
    out = _requeue()
    assert sent == [(requested.pk, None), (shredded.pk, None)]
    assert f"re-queued 2 erasure request(s) idle for >= {erasure_requeue_grace_s()} s: {requested.pk}, {shredded.pk}" in out

    sent.clear()
    _requeue("--include-failed")
    assert [pk for pk, _ in sent] == [requested.pk, shredded.pk, failed.pk]  # never the finished one


def test_the_grace_counts_from_the_last_step_not_from_the_filing(scope_a, sent, later):
    request = _request(scope_a, "p-1")
    later(10_000)
    # a step 10,000 s after the filing (created_at given: a field default keeps the real clock)
    ErasureEvent.objects.create(request=request, status=ErasureStatus.KEYS_SHREDDED, created_at=timezone.now())
    _requeue("--grace-seconds", "600")
    assert sent == []
    later(10_000 + 601)
    _requeue("--grace-seconds", "600")
    assert sent == [(request.pk, None)]


def test_a_dry_run_lists_and_sends_nothing(scope_a, sent):
    request = _request(scope_a, "p-1")
    out = _requeue("--grace-seconds", "0", "--dry-run")
    assert f"would re-queue 1 erasure request(s) idle for >= 0 s: {request.pk}" in out and sent == []


def test_a_negative_grace_is_refused_naming_the_option():
    with pytest.raises(CommandError, match="`--grace-seconds` has to be >= 0 but got -1"):
        _requeue("--grace-seconds", "-1")


def test_it_fails_loudly_when_the_broker_is_down(scope_a, monkeypatch):
    request = _request(scope_a, "p-1")

    def down(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(erasure_request_process_task, "apply_async", down)
    with pytest.raises(CommandError, match=rf"could not send 1 erasure request\(s\) \({request.pk}\); is the broker"):
        _requeue("--grace-seconds", "0")
    assert erasure_request_status(erasure_request=request) == ErasureStatus.REQUESTED  # the next run tries again


def test_a_request_sent_twice_is_processed_once(scope_a):
    seen: list[int] = []

    def rebuilder(erasure_request):
        seen.append(erasure_request.pk)

    registry.register_view_rebuilder(rebuilder)
    try:
        request = _request(scope_a, "p-1")
        erasure_request_process_task.apply(args=[request.pk])  # the message that was not lost after all
        erasure_request_process_task.apply(args=[request.pk])  # and the reconciler's copy
    finally:
        registry.unregister_view_rebuilder(rebuilder)
    statuses = list(ErasureEvent.objects.filter(request=request).values_list("status", flat=True))
    assert statuses == ["requested", "keys_shredded", "views_rebuilt"] and seen == [request.pk]


def test_celery_beat_runs_the_reconciler_every_few_minutes(scope_a, sent, later):
    from mnesio_site.celery import app

    entry = app.conf.beat_schedule["erasure-requests-requeue"]
    assert entry["task"] == erasure_requests_requeue_task.name and entry["task"] in app.tasks
    assert 60 <= entry["schedule"] <= 600 and entry["options"]["queue"] == "default"

    request = _request(scope_a, "p-1")
    assert erasure_requests_requeue_task.apply().get() == {"requeued": [], "errors": []}
    later(erasure_requeue_grace_s() + 1)
    assert erasure_requests_requeue_task.apply().get() == {"requeued": [request.pk], "errors": []}
    # a copy that waited out a whole grace period is dropped by the worker: the next run sends a fresh one
    assert sent == [(request.pk, erasure_requeue_grace_s())]
    assert settings.CELERY_TASK_TIME_LIMIT < erasure_requeue_grace_s()
