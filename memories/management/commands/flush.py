"""`flush` that can empty a *test* database despite the log's TRUNCATE triggers.

Django's test runner (and pytest-django's ``transactional_db``) empties every table with ``flush``
between tests, which the append-only triggers would reject. On a database whose name starts with
Django's test prefix ``test_``, the flush runs with those triggers ignored (pgtrigger.ignore); on any
other database it is Django's own flush, and the triggers keep rejecting it: the log cannot be flushed.
"""
from __future__ import annotations

from typing import Any

import pgtrigger
from django.core.management.commands.flush import Command as FlushCommand
from django.db import DEFAULT_DB_ALIAS, connections

from memories.models import TRUNCATE_TRIGGERS


class Command(FlushCommand):
    def handle(self, **options: Any) -> None:
        database = options.get("database") or DEFAULT_DB_ALIAS
        connection = connections[database]
        name = str(connection.settings_dict.get("NAME") or "")
        if connection.vendor == "postgresql" and name.startswith("test_"):
            with pgtrigger.ignore(*TRUNCATE_TRIGGERS, databases=[database]):
                return super().handle(**options)
        return super().handle(**options)
