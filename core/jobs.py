"""The one job dispatcher: send a Celery task after the surrounding transaction commits and say what happened.

Both apps send their tasks through ``job_dispatch`` (cartridges.jobs, memories.jobs); services never import
tasks. A task's refusal (an application error it returns as ``{"ok": False, "error", "kind", "status"}``,
see cartridges.tasks) becomes the application error here, once, with one status mapping.

Two modes, from the Celery app's ``task_always_eager``:
- with a broker, nothing is sent before the surrounding transaction commits (a worker in another process
  would not see the rows yet); the outcome is "queued" with the task id the message will carry;
- in-process (no broker, the embedded default), an attached job runs now, inside the caller's transaction
  (it sees the caller's rows), and the outcome is "done" with the task's result or its refusal. A
  ``detached`` job (the caller does not report on it: erasure processing, chained steps) runs after commit
  in both modes. A ``background`` job is detached and, in-process, runs after commit in a thread of its own
  with its own database connection, so the caller answers first (forgetting a memory answers 202 before its
  rebuild, as it does with a broker); ``background_jobs_join`` waits for those threads (tests, a clean shutdown).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from celery.app.task import Task
from celery.result import EagerResult
from django.db import close_old_connections, connections, transaction

from core.errors import MnesioError

log = logging.getLogger("mnesio")

# The HTTP status of a task's refusal when its returned dict carries none (older messages): the one mapping.
REFUSAL_STATUS = {"ContextTooLong": 422, "GateFailed": 409, "NoActiveCartridge": 409}
# The attribute a task sets (``@shared_task(records_actor=True)``) when it takes ``actor_id`` for attribution.
RECORDS_ACTOR = "records_actor"


@dataclass(frozen=True)
class JobOutcome:
    """What became of a dispatched task: queued (with its id), or done in-process with its result or refusal."""

    task_id: str
    status: Literal["queued", "done"]
    result: Mapping[str, Any] | None = None  # the task's returned dict when done and not refused
    refusal: MnesioError | None = field(default=None, compare=False)  # the task's application error when refused

    @property
    def done(self) -> bool:
        return self.status == "done"

    def raise_for_refusal(self) -> JobOutcome:
        """Raise the task's refusal as the application error (the API answers with it); else return self."""
        if self.refusal is not None:
            raise self.refusal
        return self


def refusal_error(returned: Mapping[str, Any]) -> MnesioError:
    """The application error a task's ``{"ok": False, ...}`` stands for (its status, else REFUSAL_STATUS)."""
    kind = returned.get("kind")
    return MnesioError(
        returned.get("error", "the task refused"),
        extra={"kind": kind},
        status_code=returned.get("status") or REFUSAL_STATUS.get(kind, 400),
    )


def _outcome(task_id: str, result: Any) -> JobOutcome:
    """Read an in-process run's result (raising what the task raised); anything else is still queued."""
    if not isinstance(result, EagerResult):
        return JobOutcome(task_id=task_id, status="queued")
    # an EagerResult is already computed, so get() cannot block; Celery's guard against joining inside a task is a
    # process-wide flag that another thread's in-process task sets (concurrent requests of one web process)
    returned = result.get(propagate=True, disable_sync_subtasks=False)
    if isinstance(returned, Mapping) and returned.get("ok") is False:
        return JobOutcome(task_id=task_id, status="done", refusal=refusal_error(returned))
    return JobOutcome(task_id=task_id, status="done", result=returned if isinstance(returned, Mapping) else {"value": returned})


def job_dispatch(
    task: Task,
    *,
    args: Sequence[Any] = (),
    actor_id: int | None = None,
    detached: bool = False,
    robust: bool = False,
    expires: int | None = None,
    background: bool = False,
) -> JobOutcome:
    """Send ``task(*args)`` once the surrounding transaction commits (see the module docstring for the modes).

    ``actor_id`` is passed only to tasks that declare ``records_actor``. ``robust``: an error while sending
    (or running in-process) after commit is logged, not raised, so the caller's committed work stands.
    ``background`` (implies ``detached``): in-process, the job runs in a thread after commit; an error there is logged.
    """
    task_id = str(uuid.uuid4())

    def send() -> Any:
        return _send(task, args=args, actor_id=actor_id, expires=expires, task_id=task_id)

    if background and task.app.conf.task_always_eager:
        transaction.on_commit(lambda: _background_start(task.name, send), robust=robust)
        return JobOutcome(task_id=task_id, status="queued")
    detached = detached or background
    if task.app.conf.task_always_eager and not detached:
        return _outcome(task_id, send())
    sent: list[Any] = []
    transaction.on_commit(lambda: sent.append(send()), robust=robust)
    # no transaction open: it ran at once (a detached in-process run is reported as queued: nobody waits on it)
    return JobOutcome(task_id=task_id, status="queued") if detached or not sent else _outcome(task_id, sent[0])


_background: set[threading.Thread] = set()
_background_lock = threading.Lock()


def _background_start(name: str, send: Any) -> None:
    """Run ``send`` in a daemon thread with its own database connection (closed after), tracked for the join."""

    def run() -> None:
        close_old_connections()
        try:
            send()
        except Exception:  # a thread has nobody to raise to: log it (tasks take ids, never memory text)
            log.exception("background job failed task=%s", name)
        finally:
            connections.close_all()  # this thread's connections only (they are per thread)
            with _background_lock:
                _background.discard(threading.current_thread())

    thread = threading.Thread(target=run, name=f"mnesio-job-{name}", daemon=True)
    with _background_lock:
        _background.add(thread)
    thread.start()


def background_jobs_join(timeout_s: float = 60.0) -> bool:
    """Wait for the in-process background jobs started so far (and any they start) to finish; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _background_lock:
            running = list(_background)
        if not running:
            return True
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))
        if time.monotonic() >= deadline:
            with _background_lock:
                return not _background


def _send(task: Task, *, args: Sequence[Any], actor_id: int | None, expires: int | None, task_id: str) -> Any:
    kwargs = {"actor_id": actor_id} if getattr(task, RECORDS_ACTOR, False) else {}
    options: dict[str, Any] = {"task_id": task_id}
    if expires is not None:
        options["expires"] = expires
    return task.apply_async(args=list(args), kwargs=kwargs, **options)


@dataclass(frozen=True)
class DispatchReport:
    """What ``job_dispatch_each`` sent and which sends raised (logged; the next run tries again)."""

    sent: list[int]
    errors: list[int]


def job_dispatch_each(task: Task, ids: Iterable[int], *, expires: int | None = None) -> DispatchReport:
    """Send ``task(id)`` for each id now, collecting the sends that raised.

    For reconcilers: the rows they name were committed long ago, so there is no transaction to wait for.
    """
    sent: list[int] = []
    errors: list[int] = []
    for pk in ids:
        try:
            _send(task, args=[pk], actor_id=None, expires=expires, task_id=str(uuid.uuid4()))
        except Exception:  # a broker still down (or an in-process run that raised): the next run tries again
            log.exception("job send failed task=%s id=%s", task.name, pk)
            errors.append(pk)
            continue
        sent.append(pk)
    return DispatchReport(sent=sent, errors=errors)
