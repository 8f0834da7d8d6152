"""Runtime switch of the KV engine configuration (backend, model, dtype, quant).

A switch is a new KvConfiguration row (the newest row is active). Cartridges compiled under another
configuration stop serving at once (selectors.active_version compares the configuration), and a
compile + gate + activate is queued for every scope that has memories, after the switch commits.
"""
from __future__ import annotations

import logging

from django.db import transaction

from kvengine import DTYPES, QUANTS
from memories.models import Scope
from mnesio_site.exceptions import MnesioError

from .. import conf
from ..models import KvConfiguration
from ..selectors import active_configuration

log = logging.getLogger("cartridges")

BACKENDS = ["fake", "transformers"]


def _choice(field: str, value: object, allowed: list[str]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise MnesioError(f"`{field}` has to be one of {allowed} but got {value!r}", extra={"field": field, "allowed": allowed})
    return value


def kv_configuration_switch(*, backend: str, model: str, dtype: str, quant: str, actor=None) -> KvConfiguration:
    """Make (backend, model, dtype, quant) the active configuration and queue recompiles of every scope."""
    backend = _choice("backend", backend, BACKENDS)
    model = _choice("model", model, conf.allowed_models())
    dtype = _choice("dtype", dtype, list(DTYPES))
    quant = _choice("quant", quant, list(QUANTS))
    current = active_configuration()
    if current.row is not None and current.as_tuple() == (backend, model, dtype, quant):
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
    log.info("kv configuration switched to %s (%d scopes to recompile)", ":".join(row_tuple(row)), len(scope_ids))
    return row


def row_tuple(row: KvConfiguration) -> tuple[str, str, str, str]:
    return (row.backend, row.model, row.dtype, row.quant)


def _queue_recompiles(scope_ids: list[int]) -> None:
    """Queue compile -> evaluate -> activate for each scope (on the gpu queue)."""
    from ..tasks import cartridge_compile_task

    for scope_id in scope_ids:
        cartridge_compile_task.delay(scope_id, None, True)
