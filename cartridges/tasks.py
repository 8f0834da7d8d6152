"""Celery tasks of the cartridge lifecycle: thin interfaces that take ids, load rows and call services.

Compile and evaluate run on the ``gpu`` queue (model work). Every task is safe to run twice: a compile
is unique per scope + key + head + manifest (a redelivered one returns the existing version), an evaluate
task reuses an evaluation already made under the same configuration and cases, and activating the
version that already serves writes nothing. Late acks and reject-on-worker-lost (mnesio_site/celery.py)
put a message back on the queue when the worker process dies mid-task.

Application errors (nothing to compile, context too long, gate failed) are outcomes, not crashes: the
task returns ``{"ok": False, "error": ...}`` (messages never hold memory text) and is not retried.
Answering: ``cartridge_answer_task`` takes the id of a sealed AnswerRequest, never the question
(services/answer.py).
"""
from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from core.errors import MnesioError
from core.jobs import job_dispatch
from memories.models import Scope

from . import conf
from .channels import DONE_MESSAGE, answer_channel, delta_message, redis_client
from .models import AnswerRequest, CartridgeVersion
from .selectors import active_configuration, evaluation_cases_digest, version_latest_evaluation
from .services import (
    answer_request_answer,
    answer_requests_sweep,
    cartridge_activate,
    cartridge_compile,
    cartridge_evaluate,
)
from .services.refresh import (
    full_gate_marker,
    refresh_debounce_s,
    refresh_marker_clear,
    refresh_marker_set,
    refresh_timer_start,
    scope_full_gate_low_priority,
    scope_refresh,
)
from .storage import blobs_sweep

log = logging.getLogger("cartridges")

_RELIABLE: dict[str, Any] = {"acks_late": True, "reject_on_worker_lost": True}
# Tasks that record who asked take ``actor_id`` and say so; core.jobs.job_dispatch passes it to them only.
_RECORDS_ACTOR: dict[str, Any] = {"records_actor": True}

# Model work on the gpu queue (merged into the Celery app's task_routes by CartridgesConfig.ready;
# Celery 5 deprecates the per-task ``queue`` attribute).
# Queue routing lives in mnesio_site/celery.py (task_routes): compile/evaluate/answer go to `gpu`.


def _actor(actor_id: int | None):
    """The user a task acts for (an id in the message, never a name), or None."""
    if actor_id is None:
        return None
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(pk=actor_id).first()


def _error(exc: MnesioError) -> dict[str, Any]:
    return {"ok": False, "error": exc.message, "kind": type(exc).__name__, "status": exc.status_code}


@shared_task(**_RELIABLE, **_RECORDS_ACTOR)
def cartridge_compile_task(
    scope_id: int, log_head: int | None = None, then_activate: bool = False, actor_id: int | None = None
) -> dict[str, Any]:
    """Compile scope ``scope_id`` at ``log_head`` (None: now); with ``then_activate`` queue evaluate + activate."""
    scope = Scope.objects.get(pk=scope_id)
    try:
        version = cartridge_compile(scope=scope, log_head=log_head, actor=_actor(actor_id))
    except MnesioError as exc:
        log.info("compile task scope=%s refused: %s", scope_id, type(exc).__name__)
        return _error(exc)
    if then_activate:  # after this compile commits, like every send
        job_dispatch(cartridge_evaluate_task, args=[version.pk, True], actor_id=actor_id, detached=True)
    return {"ok": True, "version": version.pk}


@shared_task(**_RELIABLE, **_RECORDS_ACTOR)
def cartridge_evaluate_task(
    version_id: int, then_activate: bool = False, actor_id: int | None = None, gate: str | None = None
) -> dict[str, Any]:
    """Evaluate version ``version_id`` (reusing a current evaluation); with ``then_activate`` queue activation.

    ``gate`` (services.gate): None picks "auto" for the follow-up of a compile (``then_activate``) and "full" for
    an explicit evaluation, which reuses only a current full evaluation.
    """
    gate = gate or ("auto" if then_activate else "full")
    version = CartridgeVersion.objects.select_related("scope").get(pk=version_id)
    evaluation = version_latest_evaluation(version=version, config_key=active_configuration().key())
    digest = evaluation_cases_digest(scope=version.scope)
    stale = evaluation is None or (evaluation.figures.get("accuracy") or {}).get("cases_digest") != digest
    if stale or (gate == "full" and evaluation.figures.get("gate") != "full"):
        evaluation = cartridge_evaluate(version=version, actor=_actor(actor_id), gate=gate)
    if then_activate and evaluation.passed:
        job_dispatch(cartridge_activate_task, args=[version_id], actor_id=actor_id, detached=True)
    return {"ok": True, "evaluation": evaluation.pk, "passed": evaluation.passed}


@shared_task(**_RELIABLE, **_RECORDS_ACTOR)
def cartridge_activate_task(version_id: int, actor_id: int | None = None) -> dict[str, Any]:
    """Activate version ``version_id`` through the gate."""
    version = CartridgeVersion.objects.select_related("scope").get(pk=version_id)
    try:
        activation = cartridge_activate(version=version, actor=_actor(actor_id))
    except MnesioError as exc:
        return _error(exc)
    return {"ok": True, "activation": activation.pk}


@shared_task(**_RELIABLE)
def cartridge_refresh_task(scope_id: int) -> dict[str, Any]:
    """Auto-refresh scope ``scope_id``: compile at its head, gate ("auto"), activate (services/refresh.py).

    The pending marker is deleted first, before the head is read: an append that commits after this point
    schedules the next refresh itself, and every earlier one is within the head read here.
    """
    refresh_marker_clear(scope_id)
    scope = Scope.objects.filter(pk=scope_id).first()
    if scope is None:
        return {"ok": False, "error": f"scope {scope_id} does not exist"}
    outcome = scope_refresh(scope=scope)
    if outcome.full_gate_due and refresh_marker_set(scope_id=scope_id, debounce_s=0, marker=full_gate_marker):
        cartridge_full_gate_task.apply_async(args=[scope_id])  # one at a time per scope; after this activation
    return outcome.as_dict()


@shared_task(**_RELIABLE)
def cartridge_full_gate_task(scope_id: int) -> dict[str, Any]:
    """The scheduled full gate of the version serving scope ``scope_id``, off the refresh's path; a rollback when
    it fails (services/refresh.py). The scope's full-gate marker is cleared when it ends, passed or not."""
    try:
        scope = Scope.objects.filter(pk=scope_id).first()
        if scope is None:
            return {"ok": False, "error": f"scope {scope_id} does not exist"}
        outcome = scope_full_gate_low_priority(scope=scope)
        return outcome.as_dict() if outcome is not None else {"ok": False, "error": "the scheduled full gate raised (logged)"}
    finally:
        refresh_marker_clear(scope_id, marker=full_gate_marker)


def refresh_after_append(scope_id: int) -> None:
    """The append hook (memories.registry): schedule ONE debounced refresh of an ``on_append`` scope per burst.

    With a broker, the append that claims the scope's marker sends cartridge_refresh_task (gpu queue) with the
    debounce as countdown; the others send nothing. In-process, a timer thread per scope does the same
    (services/refresh.py says why both include every append of the burst).
    """
    debounce = refresh_debounce_s(scope_id=scope_id)
    if debounce is None:
        return
    if cartridge_refresh_task.app.conf.task_always_eager:
        refresh_timer_start(scope_id=scope_id, debounce_s=debounce)
        return
    if not refresh_marker_set(scope_id=scope_id, debounce_s=debounce):
        return  # a refresh is pending: it reads the head when it runs, so it includes this append
    cartridge_refresh_task.apply_async(args=[scope_id], countdown=debounce)
    log.info("auto-refresh scheduled scope=%s debounce_s=%s", scope_id, debounce)


# After each append that commits, memories runs this hook (memories.registry): the on_append refresh policy.
# Registered here, the module every process imports at start (the admin's autodiscovery imports cartridges.jobs);
# CartridgesConfig.ready() is where it belongs once that file is edited.


@shared_task(**_RELIABLE)
def routed_chunks_compile_task(scope_id: int) -> dict[str, Any]:
    """Compile the chunks scope ``scope_id``'s memories lack under the active configuration (an append's own)."""
    from .services.routed_chunks import routed_chunks_compile

    scope = Scope.objects.filter(pk=scope_id).first()
    if scope is None:
        return {"ok": False, "error": f"scope {scope_id} does not exist"}
    if scope.deleted_at is not None:  # its keys and block secret are shredded: nothing to compile, nothing to make
        return {"ok": True, "made": 0}
    try:
        return {"ok": True, "made": routed_chunks_compile(scope=scope, config=active_configuration())}
    except MnesioError as exc:
        return _error(exc)


def routed_chunks_after_append(scope_id: int) -> None:
    """The append hook (memories.registry) of a scope whose layout is ``routed``: compile the new memories' chunks
    (only theirs; the others exist) off the request, so the next ask finds them. One query otherwise."""
    from .models import Layout, ScopeSettings

    layout = ScopeSettings.objects.filter(scope_id=scope_id).order_by("-id").values_list("layout", flat=True).first()
    if layout == Layout.ROUTED:
        job_dispatch(routed_chunks_compile_task, args=[scope_id], detached=True, robust=True)


@shared_task(**_RELIABLE)
def cartridge_blobs_sweep_task(older_than_s: int) -> dict[str, Any]:
    """Remove blobs of compiles that died before writing their version row."""
    return {"ok": True, "swept": len(blobs_sweep(older_than_s=older_than_s))}


@shared_task(**_RELIABLE)
def cartridge_answer_task(answer_request_id: int, stream: bool = False) -> dict[str, Any]:
    """Answer the sealed AnswerRequest ``answer_request_id``; the caller collects the sealed answer.

    With ``stream`` the sealed deltas are published on the request's channel as they are decoded
    (cartridges/channels.py); either way ``{"done": true}`` is published once the row holds the answer, so a
    waiting model-free web process wakes at once. A publish nobody receives (the asker left) stops decoding.
    """
    request = AnswerRequest.objects.filter(pk=answer_request_id).first()
    if request is None:  # collected (or never existed): nothing to do
        return {"ok": False, "error": f"answer request {answer_request_id} does not exist"}
    client = redis_client()
    channel = answer_channel(answer_request_id)
    publish = None
    if stream and client is not None:
        def publish(seq: int, sealed: bytes) -> bool:
            return client.publish(channel, delta_message(seq, sealed)) > 0
    try:
        request = answer_request_answer(answer_request=request, publish=publish)
    except MnesioError as exc:  # discarded by an erasure or swept while waiting
        return _error(exc)
    finally:
        if client is not None:
            try:
                client.publish(channel, DONE_MESSAGE)
            except Exception:  # a waiting web process also looks at the row every POLL_S (cartridges.asking)
                log.warning("could not publish 'done' of answer request %s", answer_request_id, exc_info=True)
            finally:
                client.close()
    return {"ok": not request.error, "answer_request": request.pk}


@shared_task(**_RELIABLE)
def answer_requests_sweep_task() -> dict[str, Any]:
    """Expire answer requests never collected within MNESIO_ANSWER_REQUEST_TTL_S (run by celery beat)."""
    return {"ok": True, "swept": answer_requests_sweep(older_than_s=conf.answer_request_ttl_s())}
