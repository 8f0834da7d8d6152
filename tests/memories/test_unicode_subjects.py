"""One normal form for subject ids: "josé" composed (NFC) and decomposed (NFD) are one person.

Before the fix, erasing "josé" (NFC) left memories filed under the NFD spelling readable.
"""
from __future__ import annotations

import unicodedata

import pytest

from memories.models import Subject
from memories.selectors import scope_memories_open

pytestmark = pytest.mark.django_db

NFC = unicodedata.normalize("NFC", "josé")
NFD = unicodedata.normalize("NFD", "josé")


def test_the_two_spellings_differ_as_strings():
    assert NFC != NFD and len(NFD) == len(NFC) + 1  # or every test below would be vacuous


def test_an_erasure_in_one_spelling_erases_memories_filed_in_the_other(
    scope_a, alice, api_client_for, eager_tasks, django_capture_on_commit_callbacks
):
    client = api_client_for(alice)
    for spelling, text in ((NFD, "José likes tea."), (NFC, "José lives in Porto.")):
        r = client.post("/api/v1/scopes/scope-a/memories/", {"content": text, "subject": spelling}, format="json")
        assert r.status_code == 201 and r.json()["subject"] == NFC
    assert list(Subject.objects.values_list("external_id", flat=True)) == [NFC]  # one subject, stored in NFC
    with django_capture_on_commit_callbacks(execute=True):
        filed = client.post("/api/v1/scopes/scope-a/erasure-requests/", {"subject": NFC, "reason": "asked"}, format="json")
    assert filed.status_code == 201, filed.content
    assert [m.erased for m in scope_memories_open(scope=scope_a)] == [True, True]


def test_a_repeated_idempotency_key_matches_across_spellings(scope_a, alice, api_client_for):
    client = api_client_for(alice)
    first = client.post("/api/v1/scopes/scope-a/memories/", {"content": "x", "subject": NFD, "idempotency_key": "k"}, format="json")
    again = client.post("/api/v1/scopes/scope-a/memories/", {"content": "x", "subject": NFC, "idempotency_key": "k"}, format="json")
    assert (first.status_code, again.status_code) == (201, 200) and again.json()["seq"] == first.json()["seq"]


def test_rows_stored_before_normalization_are_found_in_either_spelling(scope_a):
    """A subject row stored with the NFD id (not normalized) is erased by a request in NFC."""
    from memories import crypto
    from memories.services import erasure_request_file, erasure_request_process

    key = crypto.new_data_key()
    wrapped, kid = crypto.wrap(key, aad=crypto.subject_key_aad(NFD, scope_a.pk))
    old = Subject.objects.create(scope=scope_a, external_id=NFD, wrapped_key=wrapped, wrapped_by=kid)
    from memories.models import Memory
    from memories.services import memory_append

    seq = memory_append(scope=scope_a, content="placeholder").seq + 100
    nonce, ciphertext = crypto.seal(key, b"Jose's old memory", aad=crypto.memory_aad(seq=seq, scope_id=scope_a.pk, subject_id=old.pk))
    Memory.objects.create(seq=seq, scope=scope_a, subject=old, nonce=nonce, ciphertext=ciphertext)

    request = erasure_request_file(subject=NFC, requested_by=None, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)
    assert Subject.objects.get(pk=old.pk).is_shredded
    assert [m.erased for m in scope_memories_open(scope=scope_a) if m.subject] == [True]


def test_scope_names_resolve_the_same_in_either_spelling(alice, api_client_for):
    client = api_client_for(alice)
    composed = client.get(f"/api/v1/scopes/caf{unicodedata.normalize('NFC', 'é')}/head/")
    decomposed = client.get(f"/api/v1/scopes/caf{unicodedata.normalize('NFD', 'é')}/head/")
    assert composed.status_code == decomposed.status_code == 404
    assert composed.json() == decomposed.json()
