"""A gpu worker's processes load the model as they start (mnesio_site/celery.py), so a first refresh does not."""
from __future__ import annotations

import os
import time

import pytest

from tests.support.worker import wait_for_worker

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

WARMED = "gpu worker process warmed: model loaded for configuration fake:fake-model:f32:none"


def test_a_gpu_worker_process_loads_the_active_model_as_it_starts(fake_row, start_worker, redis_clean):  # noqa: F811
    worker = start_worker()
    wait_for_worker(lambda: WARMED in worker.output(), timeout=60, what="the warm-up line", worker=worker)


@pytest.mark.parametrize("queues, env", [("default", {}), ("gpu", {"MNESIO_WORKER_WARMUP": "false"})])
def test_a_default_worker_or_a_warmup_turned_off_loads_nothing(fake_row, start_worker, redis_clean, queues, env):  # noqa: F811
    worker = start_worker(queues=queues, **env)
    wait_for_worker(lambda: " ready." in worker.output(), timeout=60, what="the worker to be ready", worker=worker)
    time.sleep(2)  # the pool's process starts around the main process's "ready": give its init the time it takes
    assert "gpu worker process warmed" not in worker.output() and "not warmed" not in worker.output()
