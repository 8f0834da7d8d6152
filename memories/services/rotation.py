"""Master-key rotation: re-wrap every live wrapped key with the current master key."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

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
