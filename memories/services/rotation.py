"""Master-key rotation: re-wrap every live wrapped key with the current master key."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import connection

from memories import crypto, keyring
from memories.models import MasterKeyRotation

logger = logging.getLogger("memories")


@dataclass(frozen=True)
class RotationReport:
    """What ``master_key_rotate`` did: keys re-wrapped in all, by table, and keys that were already current."""

    master_key_id: str
    num_rewrapped: int
    num_already_current: int
    by_table: dict[str, int] = field(default_factory=dict)


# How long a rotation waits for transactions that were open when its wait ended (they may hold a wrap checked
# before the rotation was recorded) before it re-wraps anyway and says to run it again.
OLDER_TRANSACTIONS_TIMEOUT_S = 30.0


def older_transactions_wait(*, timeout_s: float = OLDER_TRANSACTIONS_TIMEOUT_S) -> list[int]:
    """Wait until no other session of this database is in a transaction that began before now (PostgreSQL; a no-op
    elsewhere); return the backend pids still in one after ``timeout_s`` (empty when all ended).

    A wrap is checked against the rotation record when it is made, not when its transaction commits: a transaction
    that wrapped with the old key just before the record counted could commit after the re-wrap passes. Every such
    transaction began before the TTL wait ended, so once they have all ended their keys are visible to the passes.
    The check sees the sessions of the application's role (pg_stat_activity shows other roles' only to members of
    pg_read_all_stats).
    """
    if connection.vendor != "postgresql":
        return []
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (since,) = cursor.fetchone()
        while True:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # pg_stat_activity is a snapshot per transaction
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND xact_start < %s ORDER BY pid", [since],
            )
            pids = [pid for (pid,) in cursor.fetchall()]
            if not pids or time.monotonic() >= deadline:
                return pids
            time.sleep(0.05)


def master_key_rotate() -> RotationReport:
    """Re-wrap every live wrapped key of every registered table (memories.keyring) with the current master key.

    Keys wrapped by ``MNESIO_MASTER_KEY_OLD`` are unwrapped with it; memory rows, blobs and sealed bytes are
    not touched. Refused before anything changes when a live key was wrapped by a master key this process
    does not know. The rotation is recorded first (MasterKeyRotation): from then on no process wraps with a
    retired key. Each key is re-wrapped in its own transaction under a row lock (a concurrent shred wins
    or waits), so the command can be re-run after an interruption.
    """
    current_id = crypto.master_key_id(crypto.master_key())
    keyring.master_key_verify().raise_if_unknown()
    num_current = keyring.keys_already_current()
    retired = sorted(set(crypto.known_master_keys()) - {current_id})
    if retired:  # from now on no process wraps with them (crypto.wrap checks), before anything is re-wrapped
        MasterKeyRotation.objects.create(master_key_id=current_id, retired_key_ids=retired)
        # a process's passed check holds RETIRED_CHECK_TTL_S: after this wait every process checks again before a wrap
        time.sleep(keyring.RETIRED_CHECK_TTL_S + 0.1)
        # and every wrap checked before it is in a transaction open now: once those have ended, the passes see its key
        unsettled = older_transactions_wait()
        if unsettled:
            logger.warning(
                "master key rotation: sessions %s stayed in a transaction begun before the rotation for %.0f s; "
                "a key one of them wrapped with a retired key may commit after the re-wrap: run rotate_master_key "
                "again once they have ended", unsettled, OLDER_TRANSACTIONS_TIMEOUT_S,
            )
    by_table = keyring.keys_rewrap()
    # a wrap that checked just before the wait ended may store its key after the first pass listed its table: a
    # second pass re-wraps it (each pass re-wraps only keys not already current)
    for title, num in keyring.keys_rewrap().items():
        by_table[title] = by_table.get(title, 0) + num
    num_rewrapped = sum(by_table.values())
    logger.info("master key rotated id=%s rewrapped=%s", current_id, num_rewrapped)
    return RotationReport(
        master_key_id=current_id, num_rewrapped=num_rewrapped, num_already_current=num_current, by_table=by_table
    )
