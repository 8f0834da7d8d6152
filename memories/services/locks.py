"""The log counter (LogHead): its lock, the first lock of every write that must be ordered against appends, and
the advance that gives an append its seqs.

One order of locks everywhere: the log counter (LogHead), then subject rows, then own keys (MemoryKey); a
compile's store locks subjects, then own keys (cartridges.services.compile). Taking them in another order
deadlocks with an append.
"""
from __future__ import annotations

from django.db import connection, transaction
from django.db.models import Max

from memories.models import LogHead, Memory


def log_counter_lock() -> None:
    """Hold the log counter's lock until the transaction ends: no append runs (nor wraps keys) meanwhile."""
    list(LogHead.objects.select_for_update().filter(pk=1).values_list("pk", flat=True))


def log_counter_advance(num: int) -> int:
    """Move the log head by ``num`` and return the new head; the counter row stays locked until commit.

    The UPDATE comes first so it takes the lock (PostgreSQL's row lock, SQLite's write lock) before
    anything else is read; the seqs of this transaction are ``head - num + 1 .. head``.
    """
    assert transaction.get_connection().in_atomic_block and num >= 1
    table = LogHead._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET head = head + %s WHERE id = 1 RETURNING head", [num])
        row = cursor.fetchone()
        if row is None:
            # First append (or a test database that was flushed): start the counter where the log ends.
            start = Memory.objects.aggregate(head=Max("seq"))["head"] or 0
            LogHead.objects.bulk_create([LogHead(pk=1, head=start)], ignore_conflicts=True)
            cursor.execute(f"UPDATE {table} SET head = head + %s WHERE id = 1 RETURNING head", [num])
            row = cursor.fetchone()
    return int(row[0])
