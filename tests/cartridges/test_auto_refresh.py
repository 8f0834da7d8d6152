"""Auto-refresh on append: a burst of appends becomes ONE compile + gate + activation, after the debounce."""
from __future__ import annotations

import pytest
from django.db import transaction

from cartridges.models import CartridgeEvaluation, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import scope_settings_update
from cartridges.services.refresh import (
    refresh_marker,
    refresh_timers_flush,
    refresh_timers_join,
    refresh_timers_pending,
    scope_refresh,
)
from memories.registry import append_hooks
from memories.services import memories_append_batch


def _on_append(scope, debounce_s: int) -> None:
    scope_settings_update(scope=scope, auto_refresh="on_append", auto_refresh_debounce_s=debounce_s)


def test_the_refresh_hook_is_registered_with_memories():
    from cartridges.tasks import refresh_after_append

    assert refresh_after_append in append_hooks()


@pytest.mark.django_db(transaction=True)
def test_in_process_a_burst_of_appends_is_one_refresh(scope_a, append, fake_engine, eager_tasks):
    _on_append(scope_a, 60)
    for i in range(3):
        append(scope_a, f"Crate {i} holds {i} apples.")
    memories_append_batch(scope=scope_a, items=[{"content": "Crate 3 holds pears."}, {"content": "Crate 4 holds figs."}])
    assert refresh_timers_pending() == [scope_a.pk]  # one timer for the whole burst, single and batch appends alike
    assert not CartridgeVersion.objects.exists()  # nothing before the debounce
    assert refresh_timers_flush() == [scope_a.pk]
    version = CartridgeVersion.objects.get()
    assert version.log_head == 5 and active_version(scope=scope_a) == version
    assert CartridgeEvaluation.objects.get(version=version).figures["gate"] == "full"  # the first: no parent


@pytest.mark.django_db(transaction=True)
def test_in_process_debounce_zero_refreshes_right_after_the_append_in_a_thread(scope_a, append, fake_engine, eager_tasks):
    _on_append(scope_a, 0)
    for i in range(5):
        append(scope_a, f"Crate {i} holds {i} apples.")
    assert refresh_timers_join(60)
    append(scope_a, "Crate 5 holds the spare key.")
    assert refresh_timers_join(60)
    served = active_version(scope=scope_a)
    assert served is not None and served.log_head == 6  # the last append is served, whatever the timers coalesced
    newest = CartridgeEvaluation.objects.filter(version=served).get()
    assert newest.passed and newest.figures["gate"] == "incremental"  # five memories made a fake block, verified before


@pytest.mark.django_db(transaction=True)
def test_a_manual_scope_is_not_refreshed(scope_a, append, fake_engine, eager_tasks):
    append(scope_a, "Crate 0 holds apples.")
    assert refresh_timers_pending() == [] and not CartridgeVersion.objects.exists()
    _on_append(scope_a, 0)
    scope_settings_update(scope=scope_a, auto_refresh="manual")
    append(scope_a, "Crate 1 holds pears.")
    assert refresh_timers_pending() == [] and not CartridgeVersion.objects.exists()


@pytest.mark.django_db
def test_with_a_broker_the_first_append_claims_the_marker_and_sends_one_task(scope_a, append, fake_engine, monkeypatch,
                                                                          django_capture_on_commit_callbacks):
    import redis

    from cartridges import tasks

    client = redis.Redis.from_url(__import__("os").environ["REDIS_URL"])
    client.delete(refresh_marker(scope_a.pk))
    sent = []
    monkeypatch.setattr(tasks.cartridge_refresh_task, "apply_async", lambda args, countdown: sent.append((args, countdown)))
    _on_append(scope_a, 7)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            with transaction.atomic():
                append(scope_a, "Crate 0 holds apples.")
                assert sent == []  # not before the append commits
        with django_capture_on_commit_callbacks(execute=True):
            append(scope_a, "Crate 1 holds pears.")
            memories_append_batch(scope=scope_a, items=[{"content": "Crate 2 holds figs."}])
        assert sent == [([scope_a.pk], 7)]
        assert 7 < client.ttl(refresh_marker(scope_a.pk)) <= 7 + 600
        # the task deletes the marker before reading the head: the next append sends the next refresh
        assert tasks.cartridge_refresh_task.run(scope_a.pk)["status"] == "activated"
        assert client.get(refresh_marker(scope_a.pk)) is None
        assert active_version(scope=scope_a).log_head == 3
        with django_capture_on_commit_callbacks(execute=True):
            append(scope_a, "Crate 3 holds plums.")
        assert sent == [([scope_a.pk], 7), ([scope_a.pk], 7)]
    finally:
        client.delete(refresh_marker(scope_a.pk))
        client.close()


@pytest.mark.django_db
def test_a_refresh_that_fails_the_gate_keeps_the_previous_version_serving(scope_a, append, fake_engine):
    from cartridges import engine

    from .test_gate import ForgetfulBackend

    _on_append(scope_a, 0)
    append(scope_a, "Crate 0 holds apples.")
    first = scope_refresh(scope=scope_a)
    assert first.status == "activated"
    append(scope_a, "Crate 1 holds pears.")
    engine.register_backend(fake_engine, ForgetfulBackend(model="fake-model"))
    try:
        outcome = scope_refresh(scope=scope_a)
    finally:
        from kvengine.fake import FakeKvBackend

        engine.register_backend(fake_engine, FakeKvBackend(model="fake-model"))
    assert outcome.status == "gate_failed" and not outcome.as_dict()["ok"]
    assert active_version(scope=scope_a).pk == first.version_id
    assert scope_refresh(scope=scope_a).status == "activated"  # the next try, with a sound engine, serves the new memory
    assert scope_refresh(scope=scope_a).status == "unchanged"
