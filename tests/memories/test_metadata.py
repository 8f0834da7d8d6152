"""Optional metadata per memory: a small JSON object, sealed with the memory, validated, returned on reads."""
from __future__ import annotations

import logging

import pytest
from django.db import connection

from core.errors import MnesioError
from memories.selectors import OpenedMemory, memory_open, scope_memories_open
from memories.services import memory_append, memory_forget_file

pytestmark = pytest.mark.django_db

MARKER = "zq-metadata-marker-7781"


def test_metadata_round_trips_and_defaults_to_an_empty_object(scope_a):
    memory_append(scope=scope_a, content="with", metadata={"topic": "work", "tags": ["a", "b"], "n": 3, "ok": True})
    memory_append(scope=scope_a, content="without")
    opened = scope_memories_open(scope=scope_a)
    assert opened[0].metadata == {"topic": "work", "tags": ["a", "b"], "n": 3, "ok": True}
    assert opened[1].metadata == {}
    assert OpenedMemory(1, None, "t", False, opened[0].created_at).metadata == {}


@pytest.mark.parametrize(
    ("metadata", "field", "words"),
    [
        ([1, 2], "metadata", "JSON object"),
        ("text", "metadata", "JSON object"),
        ({"a": {"b": {"c": {"d": {"e": 1}}}}}, "metadata.a.b.c.d", "deeper than 4"),
        ({"tags": [[[[["x"]]]]]}, "metadata.tags[0][0][0]", "deeper than 4"),
        ({"x" * 101: 1}, "metadata", "keys"),
        ({"big": "x" * 5000}, "metadata", "MNESIO_MAX_METADATA_BYTES"),
        ({"n": float("nan")}, "metadata.n", "finite"),
        ({"o": object()}, "metadata.o", "JSON value"),
    ],
)
def test_bad_metadata_is_refused_naming_the_field(scope_a, metadata, field, words):
    with pytest.raises(MnesioError, match=words) as info:
        memory_append(scope=scope_a, content="x", metadata=metadata)
    assert info.value.extra["field"] == field and info.value.status_code == 400


def test_the_size_limit_is_a_setting(scope_a, settings):
    settings.MNESIO_MAX_METADATA_BYTES = 20
    with pytest.raises(MnesioError, match="at most 20 bytes"):
        memory_append(scope=scope_a, content="x", metadata={"k": "0123456789abcdef"})
    assert memory_append(scope=scope_a, content="x", metadata={"k": "short"}).seq == 1


def test_metadata_is_never_stored_or_logged_in_plaintext(alice, api_client_for, caplog):
    client = api_client_for(alice)
    with caplog.at_level(logging.DEBUG):
        r = client.post("/api/v1/scopes/scope-a/memories/", {"content": "c", "metadata": {"secret": MARKER}}, format="json")
        assert r.status_code == 201 and r.json()["metadata"] == {"secret": MARKER}
        batch = client.post("/api/v1/scopes/scope-a/memories/batch/",
                            {"items": [{"content": "d", "metadata": {MARKER: 1}}]}, format="json")
        assert batch.status_code == 201
        assert client.get("/api/v1/scopes/scope-a/memories/").json()["results"][1]["metadata"] == {MARKER: 1}
    assert MARKER not in caplog.text
    with connection.cursor() as cursor:
        for table in ("memories_memory", "memories_memorykey"):
            cursor.execute(f"SELECT * FROM {table}")
            for row in cursor.fetchall():
                for value in row:
                    raw = bytes(value) if isinstance(value, (bytes, memoryview)) else str(value).encode()
                    assert MARKER.encode() not in raw


def test_a_forgotten_memory_keeps_no_readable_metadata(scope_a):
    memory = memory_append(scope=scope_a, content="c", metadata={"who": "dana"})
    memory_forget_file(scope=scope_a, seq=memory.seq, requested_by=None)
    opened = scope_memories_open(scope=scope_a)[0]
    assert opened.erased and opened.text is None and opened.metadata == {}
    assert memory_open(memory=memory.__class__.objects.get(seq=memory.seq)).metadata == {}
