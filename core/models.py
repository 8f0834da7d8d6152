"""The append-only model base both apps' immutable rows share: the ORM half everywhere, triggers on PostgreSQL.

What only PostgreSQL guarantees: the ``pgtrigger`` triggers of ``append_only_triggers`` reject UPDATE,
DELETE and TRUNCATE from *any* client (raw SQL included). On SQLite the same rules hold only through the
ORM: ``save()`` of an existing row, ``delete()`` and queryset ``update()``/``delete()`` raise
``ImmutableRowError`` (a 409 if it ever reaches a request), but raw SQL can still change rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pgtrigger
from django.db import models

from core.errors import Conflict


class ImmutableRowError(Conflict):
    """Raised by the ORM when code tries to change or remove an append-only row."""


def reject_truncate(name: str) -> pgtrigger.Trigger:
    """A statement-level trigger that rejects TRUNCATE (pgtrigger's Protect only covers row operations)."""
    return pgtrigger.Trigger(
        name=name,
        level=pgtrigger.Statement,
        when=pgtrigger.Before,
        operation=pgtrigger.Truncate,
        func="RAISE EXCEPTION 'mnesio: % is append-only; TRUNCATE is not allowed', TG_TABLE_NAME; RETURN NULL;",
    )


def append_only_triggers(prefix: str = "") -> list[pgtrigger.Trigger]:
    """Triggers that make a table insert-only: UPDATE, DELETE and TRUNCATE all raise (names start with ``prefix``)."""
    return [
        pgtrigger.Protect(name=f"{prefix}protect_update", operation=pgtrigger.Update),
        pgtrigger.Protect(name=f"{prefix}protect_delete", operation=pgtrigger.Delete),
        reject_truncate(f"{prefix}protect_truncate"),
    ]


def rewrap_only_trigger(name: str, *, rewrapped: str, kept: Sequence[str]) -> pgtrigger.Protect:
    """A trigger that refuses every UPDATE but a key's re-wrap: one that changes the ``rewrapped`` column (the id
    of the master key that wrapped it) and leaves every ``kept`` column as it was."""
    unchanged = "".join(f" AND NEW.{column} = OLD.{column}" for column in kept)
    return pgtrigger.Protect(
        name=name,
        operation=pgtrigger.Update,
        condition=pgtrigger.Condition(f"NOT (NEW.{rewrapped} IS DISTINCT FROM OLD.{rewrapped}{unchanged})"),
    )


def blank_only_trigger(name: str, *, blanked: Sequence[str]) -> pgtrigger.Protect:
    """A trigger that refuses every UPDATE but one setting each ``blanked`` column to '' and changing nothing else.

    For digests that must not outlive what they digest (a destroyed block's id): the one change such a row
    allows is forgetting them, one way."""
    names = ", ".join(f"'{column}'" for column in blanked)
    empty = " AND ".join(f"NEW.{column} = ''" for column in blanked)
    return pgtrigger.Protect(
        name=name,
        operation=pgtrigger.Update,
        condition=pgtrigger.Condition(f"NOT ({empty} AND (to_jsonb(NEW) - ARRAY[{names}]) = (to_jsonb(OLD) - ARRAY[{names}]))"),
    )


class AppendOnlyQuerySet(models.QuerySet):
    """A queryset that refuses bulk changes (the ORM half of append-only, the only half on SQLite)."""

    def update(self, **kwargs: Any) -> int:
        raise ImmutableRowError(f"{self.model._meta.label} rows are append-only: update() is not allowed")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise ImmutableRowError(f"{self.model._meta.label} rows are append-only: delete() is not allowed")

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise ImmutableRowError(f"{self.model._meta.label} rows are append-only: bulk_update() is not allowed")

    def _privileged_update(self, **kwargs: Any) -> int:
        """The one door for the changes a model's trigger allows (shred, re-wrap); callers in services only."""
        return super().update(**kwargs)


class AppendOnlyModel(models.Model):
    """A row that is written once: saving an existing row or deleting one raises."""

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRowError(f"{self._meta.label} rows are append-only: an existing row cannot be saved")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ImmutableRowError(f"{self._meta.label} rows are append-only: delete() is not allowed")
