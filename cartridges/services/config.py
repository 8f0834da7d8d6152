"""Runtime switch of the KV engine configuration (backend, model, dtype, quant).

A switch is a new KvConfiguration row (the newest row is active). Cartridges compiled under another
configuration stop serving at once (selectors.active_version compares the configuration), and a
compile + gate + activate is queued for every scope that has memories, after the switch commits.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from core.errors import MnesioError
from kvengine import BACKENDS, DTYPES, QUANTS, KvConfig
from memories.models import Scope

from .. import conf
from ..models import KvConfiguration
from ..selectors import active_configuration

log = logging.getLogger("cartridges")

def _choice(field: str, value: object, allowed: list[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        why = ""
        if field == "backend" and value == "fake":
            why = " ('fake' answers with whole memory texts: it is for tests only, set MNESIO_ALLOW_FAKE_BACKEND=true)"
        raise MnesioError(f"`{field}` has to be one of {allowed} but got {value!r}{why}", extra={"field": field, "allowed": allowed})
    return value


def backends_allowed() -> list[str]:
    """The backends an operator may switch to: the fake one only where settings allow it (tests)."""
    allow_fake = getattr(settings, "MNESIO_ALLOW_FAKE_BACKEND", False)
    return [backend for backend in BACKENDS if allow_fake or backend != "fake"]


def kv_configuration_switch(*, backend: str, model: str, dtype: str, quant: str, actor=None) -> KvConfiguration:
    """Make (backend, model, dtype, quant) the active configuration and queue recompiles of every scope."""
    backend = _choice("backend", backend, backends_allowed())
    model = _choice("model", model, conf.allowed_models())
    dtype = _choice("dtype", dtype, list(DTYPES))
    quant = _choice("quant", quant, list(QUANTS))
    config = KvConfig(backend, model, dtype, quant)
    current = active_configuration()
    if current.row is not None and current.config == config:
        return current.row  # already active: no new row, nothing to recompile
    with transaction.atomic():
        row = KvConfiguration.objects.create(
            backend=backend,
            model=model,
            dtype=dtype,
            quant=quant,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        scope_ids = list(Scope.objects.filter(memories__isnull=False).distinct().values_list("pk", flat=True))
        transaction.on_commit(lambda: _queue_recompiles(scope_ids))
    log.info("kv configuration switched to %s (%d scopes to recompile)", row.config.key, len(scope_ids))
    return row


def _queue_recompiles(scope_ids: list[int]) -> None:
    """Queue compile -> evaluate -> activate for each scope (on the gpu queue)."""
    from ..tasks import cartridge_compile_task

    for scope_id in scope_ids:
        cartridge_compile_task.delay(scope_id, None, True)
