"""Answer requests that are never collected expire; erasure discards the affected scopes' pending ones; and a
master-key rotation re-wraps them, so a request filed before it is still answered and collected after it."""
from __future__ import annotations

import io
import os
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from cartridges.models import AnswerRequest
from cartridges.services import answer_request_answer, answer_request_collect, answer_request_file
from core.errors import MnesioError
from memories import crypto
from memories.services import erasure_request_file, erasure_request_process

pytestmark = pytest.mark.django_db


def _age(request: AnswerRequest, seconds: int) -> None:
    AnswerRequest.objects.filter(pk=request.pk).update(created_at=timezone.now() - timedelta(seconds=seconds))


def test_it_sweeps_requests_never_collected(scope_a, append, settings):
    from cartridges.services import answer_requests_sweep

    old = answer_request_file(scope=scope_a, question="Where is the spare key?")
    fresh = answer_request_file(scope=scope_a, question="Where is the car?")
    _age(old, 7200)
    assert answer_requests_sweep(older_than_s=3600) == 1
    assert list(AnswerRequest.objects.values_list("pk", flat=True)) == [fresh.pk]
    _age(fresh, 7200)
    settings.MNESIO_ANSWER_REQUEST_TTL_S = 3600
    out = io.StringIO()
    call_command("answer_requests_sweep", stdout=out)
    assert "1 answer request" in out.getvalue() and not AnswerRequest.objects.exists()


def test_an_expired_request_cannot_be_collected(scope_a, append, fake_engine, blob_root, settings):
    append(scope_a, "The spare key is under the blue flowerpot.")
    request = answer_request_answer(answer_request=answer_request_file(scope=scope_a, question="Where?", mode="text"))
    settings.MNESIO_ANSWER_REQUEST_TTL_S = 60
    _age(request, 120)
    with pytest.raises(MnesioError, match="expired") as info:
        answer_request_collect(answer_request=request)
    assert info.value.status_code == 404 and not AnswerRequest.objects.exists()


def test_the_sweep_runs_on_celery_beat_beside_the_erasure_reconciler():
    from mnesio_site.celery import app

    tasks = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"cartridges.tasks.answer_requests_sweep_task", "memories.tasks.erasure_requests_requeue_task"} <= tasks


def test_erasure_discards_the_pending_requests_of_the_subjects_scopes(scope_a, scope_c, append, fake_engine, blob_root):
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    append(scope_c, "Erin likes tea.", subject="erin")
    pending = answer_request_file(scope=scope_a, question="What is Dana's locker code?", mode="text")
    answered = answer_request_answer(answer_request=answer_request_file(scope=scope_a, question="Dana?", mode="text"))
    other = answer_request_file(scope=scope_c, question="What does Erin like?", mode="text")
    assert answered.sealed_answer

    request = erasure_request_file(subject="dana", requested_by=None, reason="the person asked")
    erasure_request_process(erasure_request=request)

    assert list(AnswerRequest.objects.values_list("pk", flat=True)) == [other.pk]
    with pytest.raises(MnesioError) as info:
        answer_request_collect(answer_request=pending)
    assert info.value.status_code == 404


def test_it_discards_by_scope_and_counts():
    from cartridges.services.forget import answer_requests_discard

    assert answer_requests_discard(scope_ids=[]) == 0


def test_a_request_filed_before_a_rotation_is_answered_and_collected_after_it(scope_a, append, fake_engine, blob_root, settings):
    old_key, new_key = os.urandom(32), os.urandom(32)
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = old_key, None
    append(scope_a, "The spare key is under the blue flowerpot.")
    request = answer_request_file(scope=scope_a, question="Where is the spare key?", mode="text")

    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = new_key, old_key
    call_command("rotate_master_key", stdout=io.StringIO())
    settings.MNESIO_MASTER_KEY_OLD = None  # the old key is retired

    assert AnswerRequest.objects.get(pk=request.pk).wrapped_by == crypto.master_key_id(new_key)
    answer_request_answer(answer_request=request)
    result = answer_request_collect(answer_request=request)
    assert result.mode == "text" and result.answer
    assert not AnswerRequest.objects.exists()
