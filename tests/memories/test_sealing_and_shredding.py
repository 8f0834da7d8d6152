"""Content is sealed at rest, bound to its row, and a shred makes a subject's memories open as erased."""
from __future__ import annotations

import pytest
from django.db import connection

from memories import crypto
from memories.models import Memory, ScopeKey, Subject
from memories.selectors import MemoryIntegrityError, memory_open, scope_memories_open
from memories.services import memory_append, subject_shred

pytestmark = pytest.mark.django_db


def test_it_never_stores_plaintext(scope_a):
    memory_append(scope=scope_a, subject="p-1", content="Zebulon keeps a spare key under the blue flowerpot.")
    memory_append(scope=scope_a, content="The agent's launch code word is marmalade.")
    with connection.cursor() as cursor:
        cursor.execute("SELECT nonce, ciphertext FROM memories_memory")
        blobs = b"".join(bytes(nonce) + bytes(ct) for nonce, ct in cursor.fetchall())
    assert b"flowerpot" not in blobs and b"marmalade" not in blobs
    assert len(blobs) > 0


def test_it_opens_what_it_sealed_with_subject_and_scope_keys(scope_a):
    memory_append(scope=scope_a, subject="p-1", content="Alice's cat is called Miso.")
    memory_append(scope=scope_a, content="Deploys happen on Tuesdays.")
    opened = scope_memories_open(scope=scope_a)
    assert [(m.seq, m.subject, m.text, m.erased) for m in opened] == [
        (1, "p-1", "Alice's cat is called Miso.", False),
        (2, None, "Deploys happen on Tuesdays.", False),
    ]
    assert ScopeKey.objects.filter(scope=scope_a).count() == 1


def test_it_destroys_the_key_bytes_on_shred_and_opens_memories_as_erased(scope_a):
    memory_append(scope=scope_a, subject="p-1", content="p-1 was born in Lisbon.")
    memory_append(scope=scope_a, subject="p-2", content="p-2 was born in Oslo.")
    memory_append(scope=scope_a, subject="p-1", content="p-1 likes chess.")
    subject = Subject.objects.get(external_id="p-1")
    key_bytes = bytes(subject.wrapped_key)

    assert subject_shred(subject=subject) is True
    assert subject_shred(subject=subject) is False  # one way, once

    with connection.cursor() as cursor:
        cursor.execute("SELECT wrapped_key, shredded_at FROM memories_subject WHERE external_id = 'p-1'")
        wrapped, shredded_at = cursor.fetchone()
        assert wrapped is None and shredded_at is not None
        # The key bytes appear in no live row of any key table.
        for table in ["memories_subject", "memories_scopekey"]:
            cursor.execute(f"SELECT wrapped_key FROM {table} WHERE wrapped_key IS NOT NULL")
            assert all(key_bytes not in bytes(row[0]) for row in cursor.fetchall())
    opened = scope_memories_open(scope=scope_a)
    assert [(m.seq, m.subject, m.text, m.erased) for m in opened] == [
        (1, "p-1", None, True),
        (2, "p-2", "p-2 was born in Oslo.", False),
        (3, "p-1", None, True),
    ]
    assert Memory.objects.count() == 3  # the rows stay: they are the log


def test_it_refuses_a_new_memory_for_a_shredded_subject(scope_a):
    from core.errors import Conflict

    memory_append(scope=scope_a, subject="p-1", content="p-1 was born in Lisbon.")
    subject_shred(subject=Subject.objects.get(external_id="p-1"))
    with pytest.raises(Conflict, match="`subject` 'p-1' was erased"):
        memory_append(scope=scope_a, subject="p-1", content="p-1 moved to Porto.")
    assert Memory.objects.count() == 1
    assert Subject.objects.get(external_id="p-1").wrapped_key is None  # no key resurrected
    # The next append gets the next seq: the refused one left no gap.
    assert memory_append(scope=scope_a, content="Another fact.").seq == 2


def test_it_fails_to_open_a_ciphertext_copied_onto_another_row(scope_a):
    original = memory_append(scope=scope_a, subject="p-1", content="p-1's PIN is 4321.")
    other = memory_append(scope=scope_a, subject="p-1", content="p-1 likes tea.")
    # Inserting is the one write the log allows: forge row 3 with row 1's sealed bytes.
    forged = Memory.objects.create(
        seq=3, scope=scope_a, subject=original.subject, nonce=original.nonce, ciphertext=original.ciphertext
    )
    with pytest.raises(MemoryIntegrityError, match="seq=3 failed authentication"):
        memory_open(memory=Memory.objects.select_related("subject", "scope__key").get(pk=forged.pk))
    # Same subject key, another row: the associated data (seq) still tells them apart.
    assert memory_open(memory=Memory.objects.select_related("subject", "scope__key").get(pk=other.pk)).text == "p-1 likes tea."


def test_it_fails_to_open_a_ciphertext_moved_to_another_scope_or_subject(scope_a, scope_c):
    original = memory_append(scope=scope_a, content="Scope A's secret.")
    memory_append(scope=scope_c, content="Scope C's fact.")
    forged = Memory.objects.create(seq=3, scope=scope_c, nonce=original.nonce, ciphertext=original.ciphertext)
    with pytest.raises(MemoryIntegrityError):
        memory_open(memory=Memory.objects.select_related("subject", "scope__key").get(pk=forged.pk))


def test_it_binds_a_wrapped_key_to_its_owner(scope_a):
    memory_append(scope=scope_a, subject="p-1", content="one")
    memory_append(scope=scope_a, subject="p-2", content="two")
    p1 = Subject.objects.get(external_id="p-1")
    with pytest.raises(crypto.InvalidTag):
        crypto.unwrap(p1.wrapped_key, wrapped_by=p1.wrapped_by, aad=crypto.subject_key_aad("p-2"))


def test_a_wrapped_key_is_one_type_that_opens_itself_and_sealed_values_are_one_shape():
    """The envelope capability: wrap -> WrappedKey -> open; seal_box/open_box for every column."""
    from memories import crypto

    data_key = crypto.new_data_key()
    wrapped = crypto.wrap(data_key, aad=b"test", verify=False)
    assert isinstance(wrapped, crypto.WrappedKey) and wrapped.wrapped_by == crypto.master_key_id(crypto.master_key())
    assert wrapped.open(aad=b"test") == data_key
    with pytest.raises(crypto.InvalidTag):
        wrapped.open(aad=b"another row")
    box = crypto.seal_box(data_key, b"plain", aad=b"row-1")
    assert len(box) == crypto.NONCE_BYTES + len(b"plain") + 16 and crypto.open_box(data_key, box, aad=b"row-1") == b"plain"
    with pytest.raises(crypto.InvalidTag):
        crypto.open_box(data_key, box, aad=b"row-2")
