"""Seq, log head, reading as of a head, and idempotent appends."""
from __future__ import annotations

import pytest

from core.errors import Conflict, MnesioError
from memories.models import Memory
from memories.selectors import as_of_validate, log_head, scope_memories_open
from memories.services import memory_append

pytestmark = pytest.mark.django_db


def test_it_reports_zero_for_an_empty_log(db):
    assert log_head() == 0


def test_it_reads_exactly_the_rows_up_to_a_past_head(scope_a, scope_c):
    for i in range(1, 11):
        memory_append(scope=scope_a if i % 3 else scope_c, content=f"fact number {i}")
    assert log_head() == 10
    for head in range(0, 11):
        opened = scope_memories_open(scope=scope_a, as_of=head)
        assert [m.seq for m in opened] == [s for s in range(1, head + 1) if s % 3]
        assert [m.text for m in opened] == [f"fact number {s}" for s in range(1, head + 1) if s % 3]
    # Appends after the head do not change a read as of it.
    memory_append(scope=scope_a, content="a later fact")
    assert [m.seq for m in scope_memories_open(scope=scope_a, as_of=5)] == [1, 2, 4, 5]


def test_it_gives_one_row_for_the_same_idempotency_key_appended_five_times(scope_a):
    results = [
        memory_append(scope=scope_a, subject="p-1", content="p-1 prefers window seats.", idempotency_key="req-42")
        for _ in range(5)
    ]
    assert Memory.objects.count() == 1
    assert {m.pk for m in results} == {results[0].pk}
    assert [m.appended for m in results] == [True, False, False, False, False]
    assert log_head() == 1


def test_it_scopes_idempotency_keys_per_scope(scope_a, scope_c):
    a = memory_append(scope=scope_a, content="same key, scope A", idempotency_key="k")
    c = memory_append(scope=scope_c, content="same key, scope C", idempotency_key="k")
    assert (a.seq, c.seq) == (1, 2)


def test_it_refuses_an_idempotency_key_reused_for_other_content(scope_a):
    memory_append(scope=scope_a, content="original", idempotency_key="k")
    with pytest.raises(Conflict, match="`idempotency_key`"):
        memory_append(scope=scope_a, content="something else", idempotency_key="k")
    with pytest.raises(Conflict, match="`idempotency_key`"):
        memory_append(scope=scope_a, subject="p-9", content="original", idempotency_key="k")
    assert Memory.objects.count() == 1


@pytest.mark.parametrize(
    "raw, fragment",
    [("abc", "integer"), ("1.5", "integer"), ("", "integer"), ("-1", ">= 0"), ("99", "at most the current log head 2")],
)
def test_it_refuses_a_bad_as_of(scope_a, raw, fragment):
    memory_append(scope=scope_a, content="one")
    memory_append(scope=scope_a, content="two")
    with pytest.raises(MnesioError, match="`as_of`") as info:
        as_of_validate(raw)
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"content": ""}, "content"),
        ({"content": "   \n"}, "content"),
        ({"content": "x" * 8193}, "content"),
        ({"content": "é" * 4097}, "content"),  # 8194 bytes of UTF-8
        ({"content": "nul\x00inside"}, "content"),
        ({"content": "ok", "subject": ""}, "subject"),
        ({"content": "ok", "subject": "s" * 201}, "subject"),
        ({"content": "ok", "idempotency_key": ""}, "idempotency_key"),
    ],
)
def test_it_refuses_bad_appends_without_writing(scope_a, kwargs, field):
    with pytest.raises(MnesioError, match=f"`{field}`"):
        memory_append(scope=scope_a, **kwargs)
    assert Memory.objects.count() == 0
    assert memory_append(scope=scope_a, content="fine").seq == 1


def test_it_accepts_content_exactly_at_the_size_limit(scope_a, settings):
    settings.MNESIO_MAX_MEMORY_BYTES = 16
    assert memory_append(scope=scope_a, content="x" * 16).seq == 1
    with pytest.raises(MnesioError, match="at most 16 bytes"):
        memory_append(scope=scope_a, content="x" * 17)
