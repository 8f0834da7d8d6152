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


def _six_appends_refreshed_in_process(scope, append):
    """Five memories (a fake block) appended with debounce 0, the timers waited for, then a sixth: what serves."""
    _on_append(scope, 0)
    for i in range(5):
        append(scope, f"Crate {i} holds {i} apples.")
    assert refresh_timers_join(60)
    append(scope, "Crate 5 holds the spare key.")
    assert refresh_timers_join(60)
    return active_version(scope=scope)


@pytest.mark.postgres  # a refresh thread writes while the test writes: SQLite's in-memory test database (shared cache)
# fails the second writer at once ("table is locked"); the embedded default's file database waits out its busy timeout
@pytest.mark.django_db(transaction=True)
def test_in_process_debounce_zero_refreshes_right_after_the_append_in_a_thread(scope_a, append, fake_engine, eager_tasks):
    served = _six_appends_refreshed_in_process(scope_a, append)
    assert served is not None and served.log_head == 6  # the last append is served, whatever the timers coalesced
    newest = CartridgeEvaluation.objects.filter(version=served).get()
    assert newest.passed and newest.figures["gate"] == "incremental"  # five memories made a fake block, verified before


@pytest.mark.django_db(transaction=True)
def test_a_new_scope_refreshes_on_append_and_a_manual_one_is_not_refreshed(scope_a, append, fake_engine, eager_tasks, settings):
    settings.MNESIO_DEFAULT_AUTO_REFRESH = "on_append"  # the production default (tests/settings.py makes it manual)
    append(scope_a, "Crate 0 holds apples.")
    assert refresh_timers_pending() == [scope_a.pk]  # the default: on append, after DEFAULT_DEBOUNCE_S
    assert refresh_timers_flush() == [scope_a.pk] and active_version(scope=scope_a).log_head == 1
    scope_settings_update(scope=scope_a, auto_refresh="manual")
    append(scope_a, "Crate 1 holds pears.")
    assert refresh_timers_pending() == [] and CartridgeVersion.objects.count() == 1


@pytest.mark.skipif(not __import__("os").environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
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
    from tests.support.fakes import ForgetfulBackend

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


def _served_after_full_gate_due(scope, append, settings):
    """Five memories (one fake block) refreshed through the full gate, then a sixth whose refresh is gated
    incrementally while the schedule (every version) calls for a full gate."""
    settings.MNESIO_GATE_FULL_EVERY = 1
    _on_append(scope, 0)
    for i in range(5):
        append(scope, f"Crate {i} holds {i} apples.")
    assert scope_refresh(scope=scope).gate == "full"  # the first: no parent
    append(scope, "Crate 5 holds the spare key.")


@pytest.mark.postgres  # a refresh thread writes while the test writes: SQLite's in-memory test database (shared cache)
# fails the second writer at once ("table is locked"); the embedded default's file database waits out its busy timeout
@pytest.mark.django_db(transaction=True)
def test_in_process_a_scheduled_full_gate_runs_after_the_activation_not_before_it(scope_a, append, fake_engine, eager_tasks, settings):
    from cartridges.models import CartridgeActivation

    settings.MNESIO_GATE_FULL_EVERY = 1
    served = _six_appends_refreshed_in_process(scope_a, append)
    assert served.log_head == 6
    incremental, full = CartridgeEvaluation.objects.filter(version=served).order_by("id")
    assert incremental.passed and incremental.figures["gate"] == "incremental" and incremental.figures["incremental"]["full_due"]
    assert full.passed and full.figures["gate"] == "full" and full.figures["stage"] == "scheduled_full_gate"
    activation = CartridgeActivation.objects.get(version=served)
    assert activation.evaluation_id == incremental.pk  # served on the incremental gate ...
    assert activation.created_at <= full.created_at  # ... before the full gate ran


@pytest.mark.django_db
def test_a_scheduled_full_gate_that_fails_rolls_the_scope_back(scope_a, append, fake_engine, settings, monkeypatch):
    from cartridges.services.gate import committable
    from cartridges.services.refresh import scope_full_gate

    _served_after_full_gate_due(scope_a, append, settings)
    before = active_version(scope=scope_a)
    outcome = scope_refresh(scope=scope_a)
    assert outcome.status == "activated" and outcome.full_gate_due
    assert active_version(scope=scope_a).pk == outcome.version_id != before.pk

    def failing(*, result, **kwargs):
        result.fail("fidelity 0.000 (planted)")

    monkeypatch.setattr(committable, "full_checks", failing)
    audit = scope_full_gate(scope=scope_a)
    assert audit.status == "rolled_back" and not audit.as_dict()["ok"] and "planted" in audit.detail
    assert active_version(scope=scope_a) == before  # the version that served before serves again
    failed = CartridgeEvaluation.objects.get(pk=audit.evaluation_id)
    assert not failed.passed and failed.version_id == outcome.version_id and failed.figures["stage"] == "scheduled_full_gate"
    # the failed version's earlier incremental pass no longer vouches for its blocks: the next refresh's parent is
    # the version before it
    append(scope_a, "Crate 6 holds a torch.")
    after = CartridgeEvaluation.objects.get(pk=scope_refresh(scope=scope_a).evaluation_id)
    assert after.figures["incremental"]["parent_version_id"] == before.pk


@pytest.mark.django_db
def test_a_passing_full_gate_is_not_run_twice(scope_a, append, fake_engine, settings):
    from cartridges.services.refresh import scope_full_gate

    _served_after_full_gate_due(scope_a, append, settings)
    scope_refresh(scope=scope_a)
    assert scope_full_gate(scope=scope_a).status == "passed"
    again = scope_full_gate(scope=scope_a)
    assert again.status == "unchanged" and again.as_dict()["ok"]
    assert CartridgeEvaluation.objects.filter(version_id=again.version_id, figures__gate="full").count() == 1


@pytest.mark.skipif(not __import__("os").environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
@pytest.mark.django_db(transaction=True)  # the full gate runs in a thread of its own, with its own connection
def test_with_a_broker_a_due_full_gate_is_sent_once_per_scope_until_it_ends(scope_a, append, fake_engine, settings, monkeypatch):
    import os

    import redis

    from cartridges import tasks
    from cartridges.services.refresh import full_gate_marker

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.delete(full_gate_marker(scope_a.pk), refresh_marker(scope_a.pk))
    sent = []
    monkeypatch.setattr(tasks.cartridge_full_gate_task, "apply_async", lambda args: sent.append(args))
    _served_after_full_gate_due(scope_a, append, settings)
    try:
        assert tasks.cartridge_refresh_task.run(scope_a.pk)["full_gate_due"]
        assert sent == [[scope_a.pk]] and client.exists(full_gate_marker(scope_a.pk))
        append(scope_a, "Crate 6 holds a torch.")
        assert tasks.cartridge_refresh_task.run(scope_a.pk)["status"] == "activated"
        assert sent == [[scope_a.pk]]  # one pending already: not sent again
        assert tasks.cartridge_full_gate_task.run(scope_a.pk)["status"] == "passed"  # the version serving now
        assert not client.exists(full_gate_marker(scope_a.pk))
        assert CartridgeEvaluation.objects.filter(version=active_version(scope=scope_a), figures__gate="full").exists()
    finally:
        client.delete(full_gate_marker(scope_a.pk), refresh_marker(scope_a.pk))
        client.close()


def test_the_scheduled_full_gate_runs_at_the_lowest_cpu_priority_and_leaves_the_callers(monkeypatch):
    import os
    import threading

    from cartridges.services import refresh

    seen = {}

    def spy(*, scope):
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["thread"] = threading.current_thread().name
        return refresh.RefreshOutcome("passed")

    monkeypatch.setattr(refresh, "scope_full_gate", spy)
    monkeypatch.setattr(refresh, "close_old_connections", lambda: None)
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    scope = type("S", (), {"pk": 7})()
    assert refresh.scope_full_gate_low_priority(scope=scope).status == "passed"
    assert seen == {"nice": 19, "thread": "mnesio-full-gate-7"}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
