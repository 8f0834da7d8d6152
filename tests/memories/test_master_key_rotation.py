"""Master-key rotation re-wraps every live key; memory rows are not touched and all still open."""
from __future__ import annotations

import io
import os

import pytest
from django.core.management import call_command

from memories import crypto
from memories.models import Memory, ScopeKey, SearchIndex, Subject
from memories.selectors import scope_memories_open
from memories.services import memory_append, subject_shred

pytestmark = pytest.mark.django_db

OLD_KEY = os.urandom(32)
NEW_KEY = os.urandom(32)


def _snapshot() -> dict[int, tuple[bytes, bytes]]:
    return {m.seq: (bytes(m.nonce), bytes(m.ciphertext)) for m in Memory.objects.all()}


def test_it_keeps_every_memory_openable_across_a_master_key_rotation(settings, scope_a, scope_c):
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = OLD_KEY, None
    for i in range(12):
        memory_append(scope=scope_a if i % 2 else scope_c, subject=f"person-{i % 4}" if i % 3 else None, content=f"fact {i}")
    memory_append(scope=scope_a, subject="gone", content="to be erased")
    subject_shred(subject=Subject.objects.get(external_id="gone"))
    before = {s.name: scope_memories_open(scope=s) for s in (scope_a, scope_c)}
    rows_before = _snapshot()

    # A new master key alone cannot open the old wrapped keys, and says what to do.
    settings.MNESIO_MASTER_KEY = NEW_KEY
    with pytest.raises(crypto.MasterKeyUnavailable, match="MNESIO_MASTER_KEY_OLD"):
        scope_memories_open(scope=scope_a)

    settings.MNESIO_MASTER_KEY_OLD = OLD_KEY
    out = io.StringIO()
    call_command("rotate_master_key", stdout=out)
    num_live = (Subject.objects.filter(shredded_at__isnull=True).count() + ScopeKey.objects.count()
                + SearchIndex.objects.count())
    assert f"re-wrapped {num_live} key(s)" in out.getvalue()

    # The old key is retired: everything opens with the new one alone.
    settings.MNESIO_MASTER_KEY_OLD = None
    new_id = crypto.master_key_id(NEW_KEY)
    assert set(Subject.objects.filter(shredded_at__isnull=True).values_list("wrapped_by", flat=True)) == {new_id}
    assert set(ScopeKey.objects.values_list("wrapped_by", flat=True)) == {new_id}
    assert set(SearchIndex.objects.values_list("wrapped_by", flat=True)) == {new_id}
    after = {s.name: scope_memories_open(scope=s) for s in (scope_a, scope_c)}
    assert after == before
    assert sum(not m.erased for ms in after.values() for m in ms) == 12
    assert _snapshot() == rows_before  # memory rows untouched
    assert Subject.objects.get(external_id="gone").wrapped_key is None  # a shred stays a shred

    out = io.StringIO()
    call_command("rotate_master_key", stdout=out)  # re-running is a no-op
    assert "re-wrapped 0 key(s)" in out.getvalue()


LEFT_BEHIND = """
import sys
from memories.models import Scope
from memories.services import memory_append
scope = Scope.objects.get(name="scope-a")
memory_append(scope=scope, subject="erin", content="written before the rotation")  # verifies the old key here
print("ready", flush=True)
sys.stdin.readline()  # another process rotates meanwhile
try:
    memory_append(scope=scope, subject="zed", content="written after the rotation finished")
except Exception as exc:
    print(f"refused: {type(exc).__name__}: {exc}", flush=True)
else:
    print("appended", flush=True)
"""


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_wrap_with_the_retired_key_in_a_process_left_behind_by_a_rotation(settings, scope_a, tmp_path):
    """Two processes: one verified the old key before another rotated; after the rotation it wraps nothing more
    with the retired key, so a process holding only the new key opens every stored key."""
    import base64
    import subprocess
    import sys
    from pathlib import Path

    from django.conf import settings as django_settings

    from tests.support.procs import database_url

    old = crypto.master_key()
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    env = {**os.environ, "DATABASE_URL": database_url(), "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
           "MNESIO_MASTER_KEY": base64.urlsafe_b64encode(old).decode()}
    env.pop("MNESIO_MASTER_KEY_OLD", None)
    log = tmp_path / "behind.log"  # a file, not a pipe: its log lines never fill a buffer and block it
    behind = subprocess.Popen([sys.executable, "manage.py", "shell", "--no-imports", "-c", LEFT_BEHIND], cwd=Path(__file__).resolve().parents[2],
                              env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"))
    try:
        assert behind.stdout.readline().strip() == "ready", log.read_text()[-3000:]
        settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = NEW_KEY, old
        call_command("rotate_master_key", stdout=io.StringIO())  # this process rotates, and finishes
        behind.stdin.write("go\n")
        behind.stdin.flush()
        outcome = behind.stdout.readline().strip()
        assert behind.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if behind.poll() is None:
            behind.kill()
    assert outcome.startswith("refused: MasterKeyUnavailable") and "MNESIO_MASTER_KEY" in outcome, outcome
    assert not Memory.objects.filter(subject__external_id="zed").exists()
    # the old key is retired everywhere: a process with only the new key opens every stored key
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = NEW_KEY, None
    from memories import keyring

    assert keyring.master_key_verify().ok
    assert [m.text for m in scope_memories_open(scope=scope_a)] == [
        "Dana's locker code is 4417.", "written before the rotation",
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_rewraps_a_key_whose_transaction_commits_after_the_rotation_wait(settings, scope_a):
    """A transaction that wrapped with the old key before the rotation was recorded (its check passed) and commits
    only after the rotation's wait: the rotation waits for it, so the re-wrap passes see its key."""
    import threading
    import time

    from django.db import connection, transaction

    from memories.keyring import RETIRED_CHECK_TTL_S

    old = crypto.master_key()
    held, done = threading.Event(), threading.Event()
    hold_s = RETIRED_CHECK_TTL_S + 2.0  # past the rotation's wait and both passes, which take well under a second here

    def late_wrap() -> None:  # what a process that verified the old key does inside a longer transaction
        try:
            with transaction.atomic():
                aad = crypto.subject_key_aad("late", scope_a.pk)
                Subject.objects.create(scope=scope_a, external_id="late", wrapped_by=crypto.master_key_id(old),
                                       wrapped_key=crypto.seal_box(old, os.urandom(32), aad=aad))
                held.set()
                time.sleep(hold_s)
        finally:
            connection.close()
            done.set()

    thread = threading.Thread(target=late_wrap)
    thread.start()
    assert held.wait(timeout=30)
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = NEW_KEY, old
    started = time.monotonic()
    call_command("rotate_master_key", stdout=io.StringIO())
    took = time.monotonic() - started
    thread.join(timeout=30)
    assert done.is_set()
    assert Subject.objects.get(external_id="late").wrapped_by == crypto.master_key_id(NEW_KEY)
    assert took >= hold_s - 0.5  # it waited for the transaction, not for a fixed time
    settings.MNESIO_MASTER_KEY_OLD = None
    from memories import keyring

    assert keyring.master_key_verify().ok  # the new key alone opens every stored key
