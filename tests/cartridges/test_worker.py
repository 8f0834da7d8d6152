"""A real Celery worker process and real Redis against the test database: the whole lifecycle, and kill -9.

The worker runs ``celery -A mnesio_site worker -Q gpu,default -c 1 --pool prefork`` with DATABASE_URL
pointing at pytest-django's test database (tests are transactional so it sees committed rows), the same
blob directory and master key, and the fake engine (these tests are about delivery, not answers).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from cartridges.models import AnswerRequest, BlobKey, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import (
    answer_request_collect,
    answer_request_file,
    cartridge_answer,
)
from cartridges.storage import blob_exists
from memories.models import ErasureStatus
from memories.selectors import erasure_request_status
from memories.services import erasure_request_file, memory_append
from tests.support.blobs import stored_files
from tests.support.worker import wait_for_worker

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

ROOT = Path(__file__).resolve().parents[2]
TASK_TIMEOUT_S = 60


def test_it_runs_the_lifecycle_on_a_real_worker(fake_row, start_worker, blob_root):
    from cartridges.tasks import (
        cartridge_activate_task,
        cartridge_answer_task,
        cartridge_compile_task,
        cartridge_evaluate_task,
    )
    from memories.models import Scope
    from memories.tasks import erasure_request_process_task

    worker = start_worker()
    scope = Scope.objects.create(name="worker-scope")
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    memory_append(scope=scope, subject="dana", content="Dana's locker code is 4417.")
    memory_append(scope=scope, content="The car is parked on level 3.")

    compiled = cartridge_compile_task.delay(scope.pk).get(timeout=TASK_TIMEOUT_S)
    assert compiled["ok"], worker.output()[-4000:]
    version = CartridgeVersion.objects.get(pk=compiled["version"])
    # a redelivered compile finds the same version
    assert cartridge_compile_task.delay(scope.pk).get(timeout=TASK_TIMEOUT_S)["version"] == version.pk
    evaluated = cartridge_evaluate_task.delay(version.pk).get(timeout=TASK_TIMEOUT_S)
    assert evaluated["passed"]
    assert cartridge_evaluate_task.delay(version.pk).get(timeout=TASK_TIMEOUT_S)["evaluation"] == evaluated["evaluation"]
    assert cartridge_activate_task.delay(version.pk).get(timeout=TASK_TIMEOUT_S)["ok"]
    assert active_version(scope=scope) == version

    answer = cartridge_answer(scope=scope, question="What is Dana's locker code?")
    assert answer.version_id == version.pk and "4417" in answer.answer
    # answered by the worker: the task gets the id of a sealed request, the caller collects once
    request = answer_request_file(scope=scope, question="What is Dana's locker code?")
    assert cartridge_answer_task.delay(request.pk).get(timeout=TASK_TIMEOUT_S)["ok"]
    answer = answer_request_collect(answer_request=request)
    assert answer.version_id == version.pk and "4417" in answer.answer
    assert not AnswerRequest.objects.exists()

    request = erasure_request_file(subject="dana", requested_by=None, reason="asked to be forgotten")
    status = erasure_request_process_task.delay(request.pk).get(timeout=TASK_TIMEOUT_S)
    assert status == ErasureStatus.VIEWS_REBUILT == erasure_request_status(erasure_request=request)
    assert version_state(version=version) == "destroyed" and not blob_exists(storage_name=version.storage_name)
    rebuilt = active_version(scope=scope)
    assert rebuilt is not None and rebuilt.pk != version.pk and rebuilt.manifest["left_out"] == [2]
    answer = cartridge_answer(scope=scope, question="What is Dana's locker code?")
    assert answer.version_id == rebuilt.pk and "4417" not in answer.answer
    assert "Dana's locker code" not in worker.output() and "flowerpot" not in worker.output()  # no plaintext in logs


def test_it_finishes_a_compile_whose_worker_was_killed_with_exactly_one_version(fake_row, start_worker, blob_root):
    from cartridges.tasks import cartridge_compile_task
    from memories.models import Scope

    # the compile pauses 3 s after opening the log: the window in which the child is killed
    worker = start_worker(MNESIO_CARTRIDGE_COMPILE_PAUSE_S="3")
    scope = Scope.objects.create(name="fault-scope")
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    result = cartridge_compile_task.delay(scope.pk)

    started = wait_for_worker(lambda: result.state == "STARTED" and result.info, timeout=TASK_TIMEOUT_S, what="the compile to start", worker=worker)
    child = started["pid"]
    assert child != worker.proc.pid
    os.kill(child, signal.SIGKILL)

    # the message returns to the queue (acks late + reject on worker lost) and a fresh child runs it again
    wait_for_worker(
        lambda: result.state == "STARTED" and result.info and result.info.get("pid") not in (None, child),
        timeout=TASK_TIMEOUT_S, what="the compile to be delivered again", worker=worker,
    )
    outcome = result.get(timeout=TASK_TIMEOUT_S)
    assert outcome["ok"]
    assert CartridgeVersion.objects.filter(scope=scope).count() == 1
    version = CartridgeVersion.objects.get(scope=scope)
    assert outcome["version"] == version.pk
    assert BlobKey.objects.count() == 1 and len(stored_files(blob_root)) == 1
    assert "exited prematurely: signal 9" in worker.output() or "SIGKILL" in worker.output()
