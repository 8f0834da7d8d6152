"""Auto-refresh through the broker: a real Celery worker turns a burst of appends into ONE compile + gate + activation."""
from __future__ import annotations

import os

import pytest

from cartridges.models import CartridgeActivation, CartridgeEvaluation, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import scope_settings_update
from cartridges.services.refresh import refresh_marker
from memories.models import Scope
from memories.services import memories_append_batch, memory_append
from tests.support.worker import wait_for_worker

pytestmark = [
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

DEBOUNCE_S = 3  # the burst below commits within it (a few appends of a few ms each)


def test_a_burst_of_appends_is_one_refresh_on_the_gpu_queue(fake_row, start_worker, redis_clean):  # noqa: F811
    worker = start_worker()
    scope = Scope.objects.create(name="refresh-scope")
    scope_settings_update(scope=scope, auto_refresh="on_append", auto_refresh_debounce_s=DEBOUNCE_S)
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    memory_append(scope=scope, content="The car is parked on level 3.")
    memories_append_batch(scope=scope, items=[{"content": "Dana's locker code is 4417."}, {"content": "Eve likes tea."}])
    assert redis_clean.exists(refresh_marker(scope.pk))  # claimed by the first append; the others found it
    served = wait_for_worker(lambda: active_version(scope=scope), timeout=60, what="the auto-refresh activation", worker=worker)
    assert served.log_head == 4 and served.num_memories == 4
    assert CartridgeVersion.objects.filter(scope=scope).count() == 1  # the burst compiled once
    assert CartridgeEvaluation.objects.filter(version=served).count() == 1
    assert CartridgeActivation.objects.filter(scope=scope).count() == 1
    assert not redis_clean.exists(refresh_marker(scope.pk))  # the task cleared it before reading the head
    # the next append, after the refresh, schedules the next one: the new memory is served too
    memory_append(scope=scope, content="Frank parks on level 5.")
    wait_for_worker(lambda: (active_version(scope=scope) or served).log_head == 5, timeout=60, what="the second refresh", worker=worker)
    assert "cartridge_refresh_task" in worker.output()
    assert "flowerpot" not in worker.output()  # no memory text in the worker's logs
