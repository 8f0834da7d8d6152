"""A fleet whose supervisor dies (honcho SIGKILLed: it cannot stop its children, each in a session of its own)
still leaves no process behind once the test's teardown ran. The fake engine: this is about processes only."""
from __future__ import annotations

import os
import shutil
import signal

import pytest

from tests.support.procs import FleetRun, fleet_stop, tagged_pids, wait_for

pytestmark = [
    pytest.mark.fleet,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH"),
]


def test_no_process_outlives_a_fleet_whose_supervisor_was_killed(tmp_path):
    run = FleetRun(tmp_path, extra_env={"MNESIO_KV_BACKEND": "fake", "MNESIO_KV_MODEL": "fake-model"})
    try:
        # honcho + web (arbiter, worker) + 2 workers (main, child) + beat + redis + s3 (script, moto) and their shells
        wait_for(lambda: len(tagged_pids(run.tag)) >= 10 and "ready." in run.proc.output(), timeout=120,
                 what="the fleet's processes", log=run.proc.output)
        started = tagged_pids(run.tag)
        os.kill(run.proc.proc.pid, signal.SIGKILL)  # the supervisor dies without stopping anything
        run.proc.proc.wait(timeout=10)
        orphans = [pid for pid in tagged_pids(run.tag) if pid != run.proc.proc.pid]
        assert orphans, "killing honcho should orphan its children (the case this teardown exists for)"
    finally:
        left = fleet_stop(run.proc, run.tag)
    assert left == [] and set(started) - {run.proc.proc.pid}
