"""Redis restarted (kill -9, then started again) while tasks wait in the queue, on a private redis-server
(port 6390, started and stopped here; the shared 6379 server is never touched).

With the append-only file on (appendfsync always) no waiting task is lost: the worker started afterwards
runs every one. Without persistence every waiting task is lost; for erasures the loss is visible in the
database (requests left `requested`) and the reconciler (`manage.py erasure_requeue`, and its celery beat
task) sends them again, so every erasure finishes. A lost compile has no durable record to reconcile: the
client re-sends it (compiles are idempotent), or the broker runs with AOF.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cartridges.models import CartridgeVersion
from tests.support.redis_server import URL, PrivateRedis
from tests.support.worker import wait_for_worker

pytestmark = [
    pytest.mark.usefixtures("real_broker"),
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server"),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

ROOT = Path(__file__).resolve().parents[2]
NUM_TASKS = 5


@pytest.fixture
def private_redis(tmp_path):
    """Factory: private_redis(appendonly=...) -> a started PrivateRedis; always killed at teardown."""
    servers: list[PrivateRedis] = []

    def make(*, appendonly: bool) -> PrivateRedis:
        server = PrivateRedis(tmp_path / f"redis-{len(servers)}", appendonly=appendonly)
        server.directory.mkdir()
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.crash()


def _queue_compiles(scopes) -> None:
    """Send one compile per scope to the private broker (no worker is running yet)."""
    from cartridges.tasks import cartridge_compile_task
    from mnesio_site.celery import app

    with app.connection_for_write(URL) as conn:
        for scope in scopes:
            cartridge_compile_task.apply_async(args=[scope.pk], connection=conn)


def _scopes():
    from memories.models import Scope
    from memories.services import memory_append

    scopes = []
    for i in range(NUM_TASKS):
        scope = Scope.objects.create(name=f"broker-{i}")
        memory_append(scope=scope, content=f"Fact number {i} about the garden shed.")
        scopes.append(scope)
    return scopes


def test_waiting_tasks_survive_a_redis_crash_with_the_append_only_file(fake_row, private_redis, start_worker, record_figures):
    server = private_redis(appendonly=True)
    scopes = _scopes()
    _queue_compiles(scopes)
    assert server.client().llen("gpu") == NUM_TASKS
    server.crash()
    server.start()
    assert server.client().llen("gpu") == NUM_TASKS  # still there after the crash

    worker = start_worker(REDIS_URL=URL, CELERY_BROKER_URL=URL, CELERY_RESULT_BACKEND=URL)
    wait_for_worker(lambda: CartridgeVersion.objects.filter(scope__in=scopes).count() == NUM_TASKS, timeout=120,
          what="every waiting compile to run", worker=worker)
    # and a crash with a worker connected: it reconnects and keeps consuming
    server.crash()
    server.start()
    more = []
    from memories.models import Scope
    from memories.services import memory_append

    for i in range(2):
        scope = Scope.objects.create(name=f"broker-after-{i}")
        memory_append(scope=scope, content=f"Later fact {i}.")
        more.append(scope)
    _queue_compiles(more)
    wait_for_worker(lambda: CartridgeVersion.objects.filter(scope__in=more).count() == 2, timeout=120,
          what="compiles sent after the second crash", worker=worker)
    for scope in scopes + more:
        assert CartridgeVersion.objects.filter(scope=scope).count() == 1
    record_figures(scenario="redis crash with AOF", tasks_waiting=NUM_TASKS, tasks_lost=0,
                   tasks_after_reconnect=2, worker_reconnected=True)


def _erasure_requests():
    """One scope per request with an active cartridge holding the subject's memory and one other memory."""
    from cartridges.services import cartridge_activate, cartridge_compile
    from memories.models import Scope
    from memories.services import erasure_request_file, memory_append

    requests = []
    for i in range(NUM_TASKS):
        scope = Scope.objects.create(name=f"erase-{i}")
        memory_append(scope=scope, subject=f"person-{i}", content=f"Person {i} keeps bees behind the shed.")
        memory_append(scope=scope, content=f"Shed {i} is painted green.")
        cartridge_activate(version=cartridge_compile(scope=scope))
        requests.append(erasure_request_file(subject=f"person-{i}", requested_by=None, reason="asked", scope=scope))
    return requests


def _queue_erasures(requests) -> None:
    """Send each request's processing to the private broker, as erasure_request_enqueue does after commit."""
    from memories.tasks import erasure_request_process_task
    from mnesio_site.celery import app

    with app.connection_for_write(URL) as conn:
        for request in requests:
            erasure_request_process_task.apply_async(args=[request.pk], connection=conn)


def _erasure_requeue(*args: str) -> str:
    """Run `manage.py erasure_requeue` as an operator (or celery beat) would: its own process, the private broker."""
    from django.conf import settings as django_settings

    from tests.support.procs import database_url

    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": URL, "CELERY_BROKER_URL": URL,
           "CELERY_RESULT_BACKEND": URL, "MNESIO_DATA_DIR": str(django_settings.DATA_DIR)}
    done = subprocess.run([sys.executable, "manage.py", "erasure_requeue", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_erasures_lost_by_a_redis_without_persistence_are_requeued_by_the_reconciler(
    fake_row, private_redis, start_worker, record_figures
):
    from cartridges.models import CartridgeDestruction
    from cartridges.selectors import active_version
    from memories.models import ErasureEvent
    from memories.selectors import erasure_request_status

    server = private_redis(appendonly=False)
    requests = _erasure_requests()
    compile_scopes = _scopes()
    _queue_erasures(requests)
    _queue_compiles(compile_scopes)
    assert server.client().llen("gpu") == 2 * NUM_TASKS
    server.crash()
    server.start()
    lost = 2 * NUM_TASKS - server.client().llen("gpu")
    assert lost == 2 * NUM_TASKS  # every waiting message is gone

    # detected: the database still says `requested` for every one of them
    assert [erasure_request_status(erasure_request=r) for r in requests] == ["requested"] * NUM_TASKS
    ids = ", ".join(str(r.pk) for r in requests)
    assert f"would re-queue {NUM_TASKS} erasure request(s) idle for >= 0 s: {ids}" in _erasure_requeue(
        "--grace-seconds", "0", "--dry-run"
    )
    assert server.client().llen("gpu") == 0
    # re-queued, twice (an operator's run and beat's run racing): processing is idempotent
    for _ in range(2):
        assert f"re-queued {NUM_TASKS} erasure request(s)" in _erasure_requeue("--grace-seconds", "0")
    assert server.client().llen("gpu") == 2 * NUM_TASKS

    worker = start_worker(REDIS_URL=URL, CELERY_BROKER_URL=URL, CELERY_RESULT_BACKEND=URL)
    wait_for_worker(lambda: all(erasure_request_status(erasure_request=r) == "views_rebuilt" for r in requests), timeout=180,
          what="every re-queued erasure to finish", worker=worker)
    wait_for_worker(lambda: server.client().llen("gpu") == 0, timeout=60, what="the duplicate messages to drain", worker=worker)
    for i, request in enumerate(requests):
        steps = list(ErasureEvent.objects.filter(request=request).values_list("status", flat=True))
        assert steps == ["requested", "keys_shredded", "views_rebuilt"], steps  # each step once, no failure
        serving = active_version(scope=request.scope)
        assert serving is not None and serving.manifest["left_out"] == [2 * i + 1]  # the subject's seq, left out
    assert CartridgeDestruction.objects.filter(erasure_request__in=requests).count() == NUM_TASKS
    # nothing is left to re-queue
    assert "re-queued 0 erasure request(s)" in _erasure_requeue("--grace-seconds", "0")
    # a lost compile has nothing durable to reconcile from: it stays lost until the client sends it again
    assert CartridgeVersion.objects.filter(scope__in=compile_scopes).count() == 0
    record_figures(scenario="redis crash without persistence", tasks_waiting=2 * NUM_TASKS, tasks_lost=lost,
                   reconciler="manage.py erasure_requeue", erasures_requeued=NUM_TASKS, erasures_finished=NUM_TASKS,
                   duplicate_deliveries=NUM_TASKS, compiles_still_lost=NUM_TASKS)
