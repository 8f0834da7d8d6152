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
    assert set(Subject.objects.filter(shredded_at__isnull=True).values_list("master_key_id", flat=True)) == {new_id}
    assert set(ScopeKey.objects.values_list("master_key_id", flat=True)) == {new_id}
    assert set(SearchIndex.objects.values_list("master_key_id", flat=True)) == {new_id}
    after = {s.name: scope_memories_open(scope=s) for s in (scope_a, scope_c)}
    assert after == before
    assert sum(not m.erased for ms in after.values() for m in ms) == 12
    assert _snapshot() == rows_before  # memory rows untouched
    assert Subject.objects.get(external_id="gone").wrapped_key is None  # a shred stays a shred

    out = io.StringIO()
    call_command("rotate_master_key", stdout=out)  # re-running is a no-op
    assert "re-wrapped 0 key(s)" in out.getvalue()
