"""A real Celery worker process and real Redis against the test database: the whole lifecycle, and kill -9.

The worker runs ``celery -A mnesio_site worker -Q gpu,default -c 1 --pool prefork`` with DATABASE_URL
pointing at pytest-django's test database (tests are transactional so it sees committed rows), the same
blob directory and master key, and the fake engine (these tests are about delivery, not answers).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection

from cartridges.models import AnswerRequest, BlobKey, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import (
    answer_request_collect,
    answer_request_file,
    cartridge_answer,
    kv_configuration_switch,
)
from cartridges.storage import blob_exists
from memories.models import ErasureStatus
from memories.selectors import erasure_request_status
from memories.services import erasure_request_file, memory_append

from .conftest import stored_files

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

ROOT = Path(__file__).resolve().parents[2]
TASK_TIMEOUT_S = 60


def _database_url() -> str:
    from urllib.parse import quote

    s = connection.settings_dict
    user = quote(s["USER"] or "postgres") + (f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else "")
    return f"postgres://{user}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    """One celery worker process (prefork, one child); always killed at teardown."""

    def __init__(self, *, blob_root: Path, log_path: Path, extra_env: dict[str, str] | None = None, queues: str = "gpu,default"):
        self.log_path = log_path
        env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "REDIS_URL": os.environ["REDIS_URL"],
            "MNESIO_KV_BACKEND": "fake",
            "MNESIO_KV_MODEL": "fake-model",
            "MNESIO_BLOB_ROOT": str(blob_root),
            "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),  # same dev master key file as this process
            "MNESIO_LOG_LEVEL": "INFO",
            **(extra_env or {}),
        }
        self.name = f"cartridges-test-{uuid.uuid4().hex[:8]}@%h"
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "mnesio_site", "worker", "-Q", queues, "-c", "1",
             "--pool", "prefork", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-n", self.name, "--loglevel", "INFO"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker's own process group: parent and pool children
            self.proc.wait(timeout=10)
        self.log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def redis_clean():
    """Empty this helper's Redis database (queues and results) before and after."""
    import redis

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def start_worker(blob_root, redis_clean, tmp_path):
    """Factory: start a worker (killed at teardown, whatever happens)."""
    workers: list[Worker] = []

    def start(queues: str = "gpu,default", **extra_env: str) -> Worker:
        worker = Worker(blob_root=blob_root, log_path=tmp_path / f"worker-{len(workers)}.log", extra_env=extra_env, queues=queues)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def fake_row(fake_engine):
    """Make the fake engine the active configuration for both processes (a row both read)."""
    return kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)


def _wait(predicate, *, timeout: float, what: str, worker: Worker):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{worker.output()[-4000:]}")


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

    started = _wait(lambda: result.state == "STARTED" and result.info, timeout=TASK_TIMEOUT_S, what="the compile to start", worker=worker)
    child = started["pid"]
    assert child != worker.proc.pid
    os.kill(child, signal.SIGKILL)

    # the message returns to the queue (acks late + reject on worker lost) and a fresh child runs it again
    _wait(
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
