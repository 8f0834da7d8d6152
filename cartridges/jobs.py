"""Sending the cartridge lifecycle's tasks: compile and evaluate, validated here, sent through core.jobs.

Views, admin actions and commands call these and report the typed outcome (core.jobs.JobOutcome); only
this module (and the tasks themselves, for their chained steps) sends cartridge tasks.
"""
from __future__ import annotations

from typing import Any

from django.db import transaction

from core.errors import MnesioError
from core.jobs import JobOutcome, job_dispatch
from memories.models import Scope
from memories.selectors import scope_memories

from .models import CartridgeVersion, KvConfiguration
from .selectors import active_configuration
from .services import head_validate, kv_configuration_switch
from .tasks import cartridge_compile_task, cartridge_evaluate_task


def cartridge_compile_enqueue(
    *, scope: Scope, log_head: Any = None, activate: bool = False, actor_id: int | None = None
) -> tuple[int, JobOutcome]:
    """Validate ``log_head`` against the scope (default: its head) and queue a compile; return (head, outcome).

    With ``activate`` the compile queues evaluate + activate (through the gate) after it commits.
    """
    head = head_validate(log_head, scope=scope)
    if not scope_memories(scope=scope, as_of=head).exists():
        raise MnesioError(f"`scope` '{scope.name}' has no memories at log head {head}; append memories first",
                          extra={"field": "scope", "log_head": head}, code="nothing_to_compile")
    return head, job_dispatch(cartridge_compile_task, args=[scope.pk, head, activate], actor_id=actor_id)


def cartridge_evaluate_enqueue(*, version: CartridgeVersion, actor_id: int | None = None) -> JobOutcome:
    """Queue a gate evaluation of ``version`` (an evaluation already current is reused by the task)."""
    return job_dispatch(cartridge_evaluate_task, args=[version.pk], actor_id=actor_id)



def kv_configuration_switch_enqueue(*, backend: str, model: str, dtype: str, quant: str, actor: Any = None) -> KvConfiguration:
    """Switch the KV configuration and, when that made a new row, queue compile -> evaluate -> activate of every
    scope with memories after the switch commits (on the gpu queue)."""
    before = active_configuration().row
    with transaction.atomic():
        row = kv_configuration_switch(backend=backend, model=model, dtype=dtype, quant=quant, actor=actor)
        if row != before:
            scope_ids = Scope.objects.filter(memories__isnull=False).distinct().values_list("pk", flat=True)
            for scope_id in scope_ids:
                job_dispatch(cartridge_compile_task, args=[scope_id, None, True], detached=True)
    return row
