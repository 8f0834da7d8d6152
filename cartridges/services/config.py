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
    allow_fake = settings.MNESIO_ALLOW_FAKE_BACKEND
    return [backend for backend in BACKENDS if allow_fake or backend != "fake"]


def kv_configuration_switch(*, backend: str, model: str, dtype: str, quant: str, actor=None) -> KvConfiguration:
    """Make (backend, model, dtype, quant) the active configuration (a new row; the same one: the row in force).

    Cartridges of the previous configuration stop serving at once; recompiling the scopes is the caller's
    (cartridges.jobs.kv_configuration_switch_enqueue), since services never send tasks.
    """
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
    log.info("kv configuration switched to %s", row.config.key)
    return row
