"""`flush` that refuses to empty the log, except on a *test* database.

Django's test runner (and pytest-django's ``transactional_db``) empties every table with ``flush``
between tests, which the append-only triggers would reject. On a test database (name starting with
Django's ``test_`` prefix, or SQLite in memory) the flush runs with the TRUNCATE triggers ignored
(pgtrigger.ignore). On any other database a flush is refused while the log has rows: on PostgreSQL the
triggers would reject it anyway, and on SQLite (no triggers) this check is what keeps the log.
"""
from __future__ import annotations

from typing import Any

import pgtrigger
from django.core.management.base import CommandError
from django.core.management.commands.flush import Command as FlushCommand
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from memories.models import Memory


def is_test_database(database: str) -> bool:
    """True for a database Django's test runner created."""
    name = str(connections[database].settings_dict.get("NAME") or "")
    return name.startswith("test_") or name == ":memory:" or "mode=memory" in name


def truncate_triggers() -> list[str]:
    """Every registered trigger that rejects TRUNCATE (both apps'), as pgtrigger.ignore() names them."""
    return [
        f"{model._meta.label}:{trigger.name}"
        for model, trigger in pgtrigger.registered()
        if "TRUNCATE" in str(trigger.operation)
    ]


class Command(FlushCommand):
    def handle(self, **options: Any) -> None:
        database = options.get("database") or DEFAULT_DB_ALIAS
        connection = connections[database]
        if is_test_database(database):
            if connection.vendor == "postgresql":
                with pgtrigger.ignore(*truncate_triggers(), databases=[database]):
                    return super().handle(**options)
            return super().handle(**options)
        try:
            num_memories = Memory.objects.using(database).count()
        except DatabaseError:  # not migrated yet: nothing to protect
            num_memories = 0
        if num_memories:
            raise CommandError(
                f"the memory log is append-only: flushing would erase its {num_memories} memories, so it is refused"
            )
        return super().handle(**options)
