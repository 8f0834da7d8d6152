"""Appends from many OS processes racing on the same idempotency keys: each key written once (real PostgreSQL).

No gap and no duplicate for writers with their own keys, and each writer's order, are
tests/reliability/test_load.py's (the same writer process, with a follower reading the log meanwhile).
"""
from __future__ import annotations

import base64
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from memories import crypto
from memories.models import Memory
from memories.services import scope_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]


def _bench_writer() -> str:
    """The append-load bench's writer process, which this test runs at test size."""
    path = REPO / "bench" / "reliability" / "append_load.py"
    spec = importlib.util.spec_from_file_location("bench_reliability_append_load", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WRITER


WRITER = _bench_writer()


def _test_database_url() -> str:
    """The URL of the test database this process uses, for the worker processes."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "") + (":" + quote(s["PASSWORD"]) if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _run_workers(tmp_path: Path, *, scope: str, num_workers: int, count: int, key_mode: str) -> float:
    """Start ``num_workers`` OS processes, release them together, wait; return the append phase's seconds."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE=settings.SETTINGS_MODULE,
        DATABASE_URL=_test_database_url(),
        MNESIO_MASTER_KEY=base64.urlsafe_b64encode(crypto.master_key()).decode(),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    env.pop("MNESIO_MASTER_KEY_FILE", None)
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(num_workers)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, scope, str(i), str(count), key_mode, str(ready[i]), str(go),
             str(tmp_path / f"latencies-{i}.json")],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(num_workers)
    ]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in ready):
        assert time.monotonic() < deadline, "workers did not start"
        assert all(proc.poll() is None for proc in procs), [proc.communicate()[0].decode()[-2000:] for proc in procs]
        time.sleep(0.05)
    started = time.monotonic()
    go.touch()
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out.decode()[-3000:]
    return time.monotonic() - started


def test_it_writes_each_idempotency_key_once_when_processes_race_on_it(tmp_path):
    scope_create(name="racing")
    _run_workers(tmp_path, scope="racing", num_workers=4, count=25, key_mode="shared")
    assert list(Memory.objects.order_by("seq").values_list("seq", flat=True)) == list(range(1, 26))
    assert sorted(Memory.objects.values_list("idempotency_key", flat=True)) == sorted(f"shared-{i}" for i in range(25))
