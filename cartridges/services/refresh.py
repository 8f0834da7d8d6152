"""Auto-refresh: a scope whose settings say ``on_append`` follows its log without anyone asking.

An append's hook (memories.registry) starts one debounced refresh per burst: a Redis marker and a countdown
task with a broker, a timer thread per scope in process. A refresh re-reads the settings, compiles at the
scope's head (incrementally), gates with ``gate="auto"`` and activates when it passed; a failed gate keeps the
previous version serving. A full gate that the schedule calls for runs after the activation, at the lowest
CPU priority (scope_full_gate), and rolls the scope back when it fails.

Design, and why no append is left behind: docs/design/refresh.md.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from django.db import close_old_connections, connections

from core.errors import MnesioError
from memories.models import Scope

from .. import conf
from ..channels import redis_client
from ..models import DEFAULT_DEBOUNCE_S, AutoRefresh, ScopeSettings, default_auto_refresh
from ..selectors import active_configuration, active_version, scope_settings_get, version_latest_evaluation
from .activate import cartridge_activate
from .compile import cartridge_compile
from .errors import GateFailed
from .gate import cartridge_evaluate

log = logging.getLogger("cartridges")

_timers: dict[int, threading.Timer] = {}
_full_gates: set[int] = set()  # scopes whose scheduled full gate runs in this process
_timers_lock = threading.Lock()


def refresh_marker(scope_id: int) -> str:
    """The Redis key that says a refresh of scope ``scope_id`` is pending."""
    return f"mnesio:auto-refresh:{int(scope_id)}"


@dataclass(frozen=True)
class RefreshOutcome:
    """What a refresh did: ``status`` is one of skipped | unchanged | activated | gate_failed | refused."""

    status: str
    version_id: int | None = None
    evaluation_id: int | None = None
    gate: str | None = None  # "incremental" | "full", from the evaluation's figures
    detail: str = ""
    full_gate_due: bool = False  # activated on the incremental gate; the scheduled full gate is to run now

    def as_dict(self) -> dict:
        return {"ok": self.status in ("skipped", "unchanged", "activated", "passed"), **self.__dict__}


def refresh_debounce_s(*, scope_id: int) -> int | None:
    """The debounce of scope ``scope_id`` when its settings say ``on_append``; None when it is refreshed by hand.

    One query (it runs after every append): the scope's newest settings row, none meaning the defaults (MNESIO_DEFAULT_AUTO_REFRESH).
    """
    row = ScopeSettings.objects.filter(scope_id=scope_id).order_by("-id").values("auto_refresh", "auto_refresh_debounce_s").first()
    if row is None:
        row = {"auto_refresh": default_auto_refresh(), "auto_refresh_debounce_s": DEFAULT_DEBOUNCE_S}
    if row["auto_refresh"] != AutoRefresh.ON_APPEND:
        return None
    return int(row["auto_refresh_debounce_s"])


def full_gate_marker(scope_id: int) -> str:
    """The Redis key that says a scheduled full gate of scope ``scope_id`` is pending or running."""
    return f"mnesio:full-gate:{int(scope_id)}"


def refresh_marker_set(*, scope_id: int, debounce_s: int, marker=refresh_marker) -> bool:
    """Claim the scope's pending marker (SET NX EX); False when a refresh is already pending. No Redis: True."""
    client = redis_client()
    if client is None:
        return True
    try:
        return bool(client.set(marker(scope_id), "1", nx=True, ex=debounce_s + conf.auto_refresh_marker_grace_s()))
    finally:
        client.close()


def refresh_marker_clear(scope_id: int, marker=refresh_marker) -> None:
    """Delete the scope's pending marker (the refresh task does it before reading the head)."""
    client = redis_client()
    if client is None:
        return
    try:
        client.delete(marker(scope_id))
    finally:
        client.close()


def scope_refresh(*, scope: Scope) -> RefreshOutcome:
    """Compile ``scope`` at its head, gate it (``auto``) and activate it when it passes (docs/design/refresh.md)."""
    if scope_settings_get(scope=scope).auto_refresh != AutoRefresh.ON_APPEND:
        return RefreshOutcome("skipped", detail="auto_refresh is not on_append")
    try:
        version = cartridge_compile(scope=scope)
    except MnesioError as exc:  # nothing to compile (all erased), over the context window: an outcome, logged
        log.info("auto-refresh scope=%s refused at compile: %s", scope.pk, type(exc).__name__)
        return RefreshOutcome("refused", detail=exc.message)
    if active_version(scope=scope) == version:
        return RefreshOutcome("unchanged", version_id=version.pk)
    evaluation = cartridge_evaluate(version=version, gate="auto", defer_full=True)
    gate = evaluation.figures.get("gate")
    if not evaluation.passed:
        log.warning("auto-refresh scope=%s version=%s failed the %s gate; the previous version keeps serving", scope.pk, version.pk, gate)
        return RefreshOutcome("gate_failed", version_id=version.pk, evaluation_id=evaluation.pk, gate=gate, detail="; ".join(evaluation.reasons))
    try:
        cartridge_activate(version=version)
    except GateFailed as exc:  # the cheap checks at activation (the blob or the log changed meanwhile)
        return RefreshOutcome("gate_failed", version_id=version.pk, evaluation_id=exc.extra.get("evaluation_id"), gate=gate, detail=exc.message)
    log.info("auto-refresh scope=%s activated version=%s gate=%s", scope.pk, version.pk, gate)
    due = bool((evaluation.figures.get("incremental") or {}).get("full_due"))
    return RefreshOutcome("activated", version_id=version.pk, evaluation_id=evaluation.pk, gate=gate, full_gate_due=due)


def scope_full_gate(*, scope: Scope) -> RefreshOutcome:
    """The scheduled full gate of the version serving ``scope`` (docs/design/refresh.md); a rollback when it fails.

    ``status``: skipped (nothing serves), unchanged (a passing full gate under the active configuration is already
    its newest evaluation), passed, or rolled_back / gate_failed (failed; rolled back, or nothing to roll back to).
    """
    from .activate import cartridge_rollback

    version = active_version(scope=scope)
    if version is None:
        return RefreshOutcome("skipped", detail="no version serves")
    newest = version_latest_evaluation(version=version, config_key=active_configuration().key())
    if newest is not None and newest.passed and newest.figures.get("gate") == "full":
        return RefreshOutcome("unchanged", version_id=version.pk, evaluation_id=newest.pk, gate="full")
    evaluation = cartridge_evaluate(version=version, stage="scheduled_full_gate")
    if evaluation.passed:
        log.info("scheduled full gate scope=%s version=%s passed", scope.pk, version.pk)
        return RefreshOutcome("passed", version_id=version.pk, evaluation_id=evaluation.pk, gate="full")
    detail = "; ".join(evaluation.reasons)
    if active_version(scope=scope) != version:
        log.error("scheduled full gate scope=%s version=%s failed; it no longer serves", scope.pk, version.pk)
        return RefreshOutcome("gate_failed", version_id=version.pk, evaluation_id=evaluation.pk, gate="full", detail=detail)
    try:
        activation = cartridge_rollback(scope=scope)
    except MnesioError as exc:
        log.error("scheduled full gate scope=%s version=%s failed and the scope could not be rolled back: %s", scope.pk, version.pk, type(exc).__name__)
        return RefreshOutcome("gate_failed", version_id=version.pk, evaluation_id=evaluation.pk, gate="full", detail=f"{detail}; rollback refused: {exc.message}")
    log.error("scheduled full gate scope=%s version=%s failed; rolled back to version %s", scope.pk, version.pk, activation.version_id)
    return RefreshOutcome("rolled_back", version_id=version.pk, evaluation_id=evaluation.pk, gate="full", detail=detail)


def refresh_timer_start(*, scope_id: int, debounce_s: int) -> None:
    """In-process debounce: one pending timer per scope (docs/design/refresh.md)."""
    with _timers_lock:
        if scope_id in _timers:
            return
        timer = threading.Timer(debounce_s, _timer_fire, args=[scope_id])
        timer.daemon = True  # a process that exits does not wait for a refresh; the next append schedules one
        _timers[scope_id] = timer
    timer.start()


def _timer_fire(scope_id: int, *, own_thread: bool = True) -> None:
    with _timers_lock:
        _timers.pop(scope_id, None)  # before reading the head: a later append starts the next timer
    if own_thread:
        close_old_connections()
    try:
        scope = Scope.objects.filter(pk=scope_id).first()
        if scope is not None and scope_refresh(scope=scope).full_gate_due:
            _full_gate_in_process(scope)
    except Exception:  # a thread has nobody to raise to: log it (no memory text in messages)
        log.exception("auto-refresh scope=%s failed", scope_id)
    finally:
        if own_thread:
            connections.close_all()  # this thread's connections only (they are per thread)


def _full_gate_in_process(scope: Scope) -> None:
    """The timer thread's scheduled full gate, after its activation; one at a time per scope (the marker's role)."""
    with _timers_lock:
        if scope.pk in _full_gates:
            return
        _full_gates.add(scope.pk)
    try:
        scope_full_gate_low_priority(scope=scope)
    finally:
        with _timers_lock:
            _full_gates.discard(scope.pk)


def scope_full_gate_low_priority(*, scope: Scope) -> RefreshOutcome | None:
    """scope_full_gate in a thread of its own at the lowest CPU priority (Linux: nice 19 for that thread and the
    threads it starts; a thread's priority cannot be raised back without privileges, so it ends with the thread),
    waited for; None when it raised (logged, no memory text). The caller's own priority is left as it is."""
    outcome: list[RefreshOutcome] = []

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        close_old_connections()
        try:
            outcome.append(scope_full_gate(scope=scope))
        except Exception:  # a thread has nobody to raise to: log it (no memory text in messages)
            log.exception("scheduled full gate scope=%s failed", scope.pk)
        finally:
            connections.close_all()  # this thread's connections only

    thread = threading.Thread(target=run, name=f"mnesio-full-gate-{scope.pk}", daemon=True)
    thread.start()
    thread.join()
    return outcome[0] if outcome else None


def refresh_timers_pending() -> list[int]:
    """The scopes whose in-process refresh timer is waiting."""
    with _timers_lock:
        return sorted(_timers)


def refresh_timers_flush() -> list[int]:
    """Fire every waiting timer now, in the calling thread (a shutdown that should not drop refreshes; tests)."""
    with _timers_lock:
        pending = dict(_timers)
    for scope_id, timer in pending.items():
        timer.cancel()
        _timer_fire(scope_id, own_thread=False)
    return sorted(pending)


def refresh_timers_cancel() -> list[int]:
    """Drop every waiting timer without refreshing (a test's scope must not be compiled in the next test's database;
    a process that stops without refreshing). A timer already firing runs on: refresh_timers_join waits for it."""
    with _timers_lock:
        pending = dict(_timers)
        _timers.clear()
    for timer in pending.values():
        timer.cancel()
    return sorted(pending)


def refresh_timers_join(timeout_s: float = 60.0) -> bool:
    """Wait for the pending in-process refresh timers (and their refreshes) to finish; False on timeout."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        with _timers_lock:
            pending = list(_timers.values())
        running = [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t.function is _timer_fire]
        if not pending and not running:
            return True
        for timer in pending or running:
            timer.join(max(0.0, deadline - time.monotonic()))
        if time.monotonic() >= deadline:
            return False
