"""The one job dispatcher (core.jobs): sent after commit with a broker, run now in-process, refusals typed."""
from __future__ import annotations

import pytest

from cartridges.tasks import cartridge_blobs_sweep_task, cartridge_compile_task
from core.errors import MnesioError
from core.jobs import JobOutcome, job_dispatch, refusal_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def broker(monkeypatch):
    """A broker, faked: tasks are queued (not eager) and each send is recorded as (task name, args, kwargs)."""
    from mnesio_site.celery import app

    sent: list[tuple[str, list, dict]] = []
    for task in (cartridge_compile_task, cartridge_blobs_sweep_task):
        monkeypatch.setattr(task, "apply_async", lambda args, kwargs, task=task, **options: sent.append((task.name, args, kwargs)))
    before = app.conf.task_always_eager
    app.conf.task_always_eager = False
    yield sent
    app.conf.task_always_eager = before


def test_with_a_broker_nothing_is_sent_before_the_transaction_commits(broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        outcome = job_dispatch(cartridge_compile_task, args=[7, None, False], actor_id=3)
        assert broker == [] and outcome.status == "queued" and outcome.task_id
    assert broker == [("cartridges.tasks.cartridge_compile_task", [7, None, False], {"actor_id": 3})]


def test_the_actor_goes_only_to_tasks_that_record_one(broker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_dispatch(cartridge_blobs_sweep_task, args=[60], actor_id=3)
    assert broker == [("cartridges.tasks.cartridge_blobs_sweep_task", [60], {})]


def test_a_refusal_becomes_the_application_error_with_its_status():
    error = refusal_error({"ok": False, "error": "too long", "kind": "ContextTooLong"})
    assert isinstance(error, MnesioError) and error.status_code == 422 and error.extra == {"kind": "ContextTooLong"}
    assert refusal_error({"ok": False, "error": "gone", "kind": "BlobStorageUnavailable", "status": 503}).status_code == 503
    with pytest.raises(MnesioError, match="too long"):
        JobOutcome(task_id="t", status="done", refusal=error).raise_for_refusal()
