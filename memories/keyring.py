"""One registry of every table that holds data keys wrapped by the master key, and what runs over all of them.

Each holder (memories' Subject and ScopeKey here; cartridges' BlobKey, AnswerRequest and EvaluationCase
from ``CartridgesConfig.ready``, so memories never imports cartridges) names its model, the field with the
wrapped bytes, the field with the wrapping master key's id, and how to compute the row's associated data.
Two things run over the registry, so a new holder cannot be forgotten by either:

- ``keys_rewrap()``: the one re-wrap loop ``manage.py rotate_master_key`` runs after a rotation;
- ``master_key_verify()``: every master-key id among live wrapped keys has to be one this process knows
  (MNESIO_MASTER_KEY or MNESIO_MASTER_KEY_OLD). A process started with a wrong key sees an unknown id on
  every stored row; ``crypto.wrap`` runs ``master_key_wrap_check()`` (installed as its guard by
  MemoriesConfig.ready) before each wrap, so such a process refuses to write instead of wrapping new keys that
  the right process could never open.

A live row is one whose wrapped bytes are not NULL and whose key id is not empty (a shredded subject or an
erased evaluation case has no key bytes left; an answer request is wrapped right after its insert).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import models, transaction

from memories import crypto

log = logging.getLogger("memories")

MASTER_KEY_VARIABLE = "MNESIO_MASTER_KEY"


@dataclass(frozen=True)
class KeyHolder:
    """A table holding wrapped data keys: where the bytes and the key id are, and each row's associated data."""

    label: str  # "app_label.ModelName"
    wrapped_field: str
    key_id_field: str
    aad: Callable[[Any], bytes]  # row -> associated data of its wrapped key (ids never change)
    name: str = ""  # what rotate_master_key prints ("cartridge blob keys"); the label when empty

    @property
    def title(self) -> str:
        return self.name or self.label

    @property
    def model(self) -> type[models.Model]:
        return apps.get_model(self.label)

    def live(self) -> models.QuerySet:
        """Rows that still hold a wrapped key."""
        return self.model._default_manager.filter(**{f"{self.wrapped_field}__isnull": False}).exclude(
            **{self.key_id_field: ""}
        )

    def update(self, queryset: models.QuerySet, **values: Any) -> int:
        # append-only tables (memories) allow a re-wrap only through their privileged door
        door = getattr(queryset, "_privileged_update", None) or queryset.update
        return door(**values)


_holders: dict[str, KeyHolder] = {}


def register_key_holder(holder: KeyHolder) -> KeyHolder:
    """Register a table of wrapped keys for rotation and verification (idempotent by label)."""
    _holders[holder.label] = holder
    return holder


def key_holders() -> list[KeyHolder]:
    """The registered holders in registration order."""
    return list(_holders.values())


# ---------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyReport:
    """Which master-key ids live wrapped keys use that this process does not know, with row counts per table."""

    known: frozenset[str]
    unknown: dict[str, dict[str, int]] = field(default_factory=dict)  # key id -> {table label: rows}

    @property
    def ok(self) -> bool:
        return not self.unknown

    def message(self) -> str:
        where = "; ".join(
            f"id {kid!r}: " + ", ".join(f"{n} row(s) of {label}" for label, n in sorted(tables.items()))
            for kid, tables in sorted(self.unknown.items())
        )
        return (
            f"`{MASTER_KEY_VARIABLE}` does not open the keys already stored: they were wrapped by master key id(s) "
            f"this process does not know ({where}); this process knows {sorted(self.known)}. Start it with the "
            f"master key the data was written with (`{MASTER_KEY_VARIABLE}`), or, during a rotation, set "
            f"`MNESIO_MASTER_KEY_OLD` to the previous key and run `manage.py rotate_master_key`. Nothing was written."
        )

    def raise_if_unknown(self) -> None:
        if not self.ok:
            raise crypto.MasterKeyUnavailable(self.message())


def master_key_verify(*, known: frozenset[str] | None = None) -> VerifyReport:
    """Check that every master-key id in use among live wrapped keys is known to this process (no caching).

    ``known``: the configured master-key ids when the caller has them (``crypto.wrap`` hands them to its guard).
    """
    if known is None:
        known = frozenset(crypto.known_master_keys())
    unknown: dict[str, dict[str, int]] = {}
    for holder in key_holders():
        rows = holder.live().exclude(**{f"{holder.key_id_field}__in": known})
        if not rows.exists():  # stops at the first stranger: a wrong key fails on the first row
            continue
        counts = rows.values(holder.key_id_field).annotate(n=models.Count("pk")).values_list(holder.key_id_field, "n")
        for kid, n in counts:
            unknown.setdefault(kid, {})[holder.label] = n
    return VerifyReport(known=known, unknown=unknown)


_verified: set[frozenset[str]] = set()  # key-id sets this process verified (success only: a fix-by-restart works)
_verified_lock = threading.Lock()


def master_key_verify_once(known: frozenset[str]) -> None:
    """Verify once per process and set of configured key ids (``known``); raise MasterKeyUnavailable naming the
    variable."""
    if known in _verified:
        return
    report = master_key_verify(known=known)
    if not report.ok:
        log.error("master key verification failed: unknown master key ids %s", sorted(report.unknown))
        report.raise_if_unknown()
    with _verified_lock:
        _verified.add(known)


# How long a passed check of the current key holds in one process: a batch wrapping 1,000 new subject keys checks
# once, not 1,000 times. master_key_rotate waits longer than this after recording a rotation and before it
# re-wraps, so once a rotation has finished every process has checked again and met it.
RETIRED_CHECK_TTL_S = 1.0
_retired_checked: dict[str, float] = {}  # key id -> time.monotonic() of the last check that passed


def master_key_retired_check(key_id: str) -> None:
    """Raise MasterKeyUnavailable when a rotation retired ``key_id`` after the last rotation back to it.

    Runs before every wrap (one query on a table of a few rows, at most once per RETIRED_CHECK_TTL_S per
    process): a process that verified its key before another process rotated it away wraps nothing more with it
    once that rotation has finished (master_key_rotate records it, waits out the TTL, then re-wraps twice).
    """
    from memories.models import MasterKeyRotation  # keyring is imported before the app registry is ready

    checked = _retired_checked.get(key_id)
    if checked is not None and time.monotonic() - checked < RETIRED_CHECK_TTL_S:
        return
    retired_by = None
    for target, retired in MasterKeyRotation.objects.order_by("id").values_list("master_key_id", "retired_key_ids"):
        if target == key_id:
            retired_by = None
        elif key_id in retired:
            retired_by = target
    if retired_by is not None:
        _retired_checked.pop(key_id, None)
        master_key_verify_forget()
        raise crypto.MasterKeyUnavailable(
            f"`{MASTER_KEY_VARIABLE}` (master key id {key_id!r}) was retired by a rotation to master key id "
            f"{retired_by!r}; start this process with the new key in `{MASTER_KEY_VARIABLE}`. Nothing was written."
        )
    _retired_checked[key_id] = time.monotonic()


def master_key_wrap_check(key_id: str, known: frozenset[str]) -> None:
    """What ``crypto.wrap`` runs before wrapping with ``key_id`` (``known``: the configured key ids): verify once,
    then the retirement check."""
    master_key_verify_once(known)
    master_key_retired_check(key_id)


def master_key_verify_forget() -> None:
    """Drop this process's verified key sets (``crypto.unwrap`` calls it when it meets an unknown key id).

    A process verified at start keeps wrapping with its key; if another process rotated the master key
    meanwhile, the first unknown id it meets makes its next wrap verify again, and refuse.
    """
    with _verified_lock:
        _verified.clear()


WRAP_GUARD = crypto.WrapGuard(before_wrap=master_key_wrap_check, unknown_key_met=master_key_verify_forget)


# ---------------------------------------------------------------------------
# The one re-wrap loop
# ---------------------------------------------------------------------------
def holder_rewrap(holder: KeyHolder) -> int:
    """Re-wrap every live key of one holder with the current master key; return how many were re-wrapped.

    Each key is re-wrapped in its own transaction under a row lock (a concurrent shred, erasure or delete
    wins or waits), so an interrupted run can simply be repeated.
    """
    current_id = crypto.master_key_id(crypto.master_key())
    num = 0
    stale = holder.live().exclude(**{holder.key_id_field: current_id})
    for pk in list(stale.values_list("pk", flat=True)):
        with transaction.atomic():
            row = stale.select_for_update().filter(pk=pk).first()
            if row is None:  # shredded, erased, deleted or re-wrapped meanwhile
                continue
            aad = holder.aad(row)
            data_key = crypto.unwrap(
                bytes(getattr(row, holder.wrapped_field)), wrapped_by=getattr(row, holder.key_id_field), aad=aad
            )
            wrapped, kid = crypto.wrap(data_key, aad=aad)
            holder.update(holder.model._default_manager.filter(pk=pk), **{holder.wrapped_field: wrapped, holder.key_id_field: kid})
            num += 1
    return num


def keys_rewrap() -> dict[str, int]:
    """Re-wrap every registered table's live keys with the current master key; return counts by holder title.

    Refuses before touching anything when some live key was wrapped by a master key this process does not
    know (MasterKeyUnavailable naming the variable): a partial rotation would leave a mix nobody can finish.
    """
    master_key_verify().raise_if_unknown()
    return {holder.title: holder_rewrap(holder) for holder in key_holders()}


def keys_already_current() -> int:
    """How many live keys are already wrapped by the current master key."""
    current_id = crypto.master_key_id(crypto.master_key())
    return sum(holder.live().filter(**{holder.key_id_field: current_id}).count() for holder in key_holders())
