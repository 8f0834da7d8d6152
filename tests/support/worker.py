"""A real ``celery worker`` process against the test database, and its fixtures (registered for every test package
by tests/conftest.py): ``redis_clean`` (this worker's Redis db emptied around the test), ``start_worker`` (a factory;
every worker killed at teardown) and ``fake_row`` (the fake engine as the active configuration's row, which both
processes read)."""
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

from .procs import ROOT, database_url


class Worker:
    """One celery worker process (prefork, one child); always killed at teardown."""

    def __init__(self, *, blob_root: Path, log_path: Path, extra_env: dict[str, str] | None = None, queues: str = "gpu,default"):
        self.log_path = log_path
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
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
    from cartridges.services import kv_configuration_switch

    return kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)


def wait_for_worker(predicate, *, timeout: float, what: str, worker: Worker):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{worker.output()[-4000:]}")
