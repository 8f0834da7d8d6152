"""Every erasure kind (a subject, one memory, a whole scope) makes every derived copy of what it erased unreadable.

One test per derived copy, each run for the three kinds: evaluation cases, answer requests, answer records,
cartridge blocks and version blobs, and this process's caches (other processes' caches:
tests/reliability/test_cache_across_processes.py). docs/guarantees.md's table (Derived copies and erasure kinds) maps each cell to its test.

The fake backend cuts blocks of 4 memories, so the erased memory (the 5th) starts the second block: the first
block holds none of its tokens and survives a subject's or a memory's erasure, never a scope's deletion.
"""
from __future__ import annotations

import pytest
from django.db import connection

from cartridges import engine, storage
from cartridges.models import AnswerRecord, AnswerRequest, BlobKey, CartridgeVersionBlock, EvaluationCase
from cartridges.selectors import evaluation_case_open
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, evaluation_case_add
from cartridges.services.answer_requests import answer_request_file
from memories.models import ErasureStatus
from memories.selectors import erasure_request_status
from memories.services import (
    erasure_request_file,
    erasure_request_process,
    memory_append,
    memory_forget_file,
    scope_delete_file,
)

pytestmark = pytest.mark.django_db

MARKER = "quokka-vault-5521"
SECRET = f"The vault code is {MARKER}."
KINDS = ["subject", "memory", "scope"]


def _raw_text(model) -> str:
    """Every column of every row of ``model``'s table, bytes decoded leniently."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {connection.ops.quote_name(model._meta.db_table)}")
        rows = cursor.fetchall()
    return "\n".join(
        bytes(v).decode("latin-1") if isinstance(v, (bytes, memoryview)) else str(v) for row in rows for v in row
    )


class World:
    """A served scope holding SECRET (the kind's target) and every derived copy of it, before the erasure."""

    def __init__(self, scope, kind: str) -> None:
        self.scope, self.kind = scope, kind
        for i in range(4):
            memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
        # a subject's erasure needs a subject; a memory's and a scope's are tried on a memory without one
        self.secret = memory_append(scope=scope, content=SECRET, subject="dana" if kind == "subject" else None)
        for i in range(4, 8):
            memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
        self.version = cartridge_compile(scope=scope)
        cartridge_activate(version=self.version)
        # one case whose answer the memory holds, one whose question quotes the memory's whole text
        self.cases = [
            evaluation_case_add(scope=scope, question="What is the vault code?", answers=[MARKER]),
            evaluation_case_add(scope=scope, question=f"Someone wrote: {SECRET} Who wrote it?", answers=["nobody"]),
        ]
        self.answer = cartridge_answer(scope=scope, question="What is the vault code?")  # an answer record
        self.request = answer_request_file(scope=scope, question=f"Is the vault code {MARKER}?")
        self.links = list(CartridgeVersionBlock.objects.filter(version=self.version).select_related("block").order_by("index"))

    def erase(self) -> None:
        if self.kind == "subject":
            request = erasure_request_file(subject="dana", scope=self.scope, requested_by=None, reason="asked")
        elif self.kind == "memory":
            request = memory_forget_file(scope=self.scope, seq=self.secret.seq, requested_by=None, reason="asked")
        else:
            request = scope_delete_file(scope=self.scope, requested_by=None, reason="retired")
        erasure_request_process(erasure_request=request)
        assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT


@pytest.fixture(params=KINDS)
def world(request, scope_a, fake_engine):
    return World(scope_a, request.param)


def test_it_erases_every_evaluation_case_quoting_the_erased_memory(world, alice, api_client_for):
    assert [case.memories_recorded for case in world.cases] == [True, True]
    assert all(evaluation_case_open(case=case).question for case in world.cases)

    world.erase()

    for case in world.cases:
        row = EvaluationCase.objects.get(pk=case.pk)
        assert row.erased_at is not None and row.wrapped_key is None and row.sealed is None
        assert evaluation_case_open(case=row).question is None
    assert MARKER not in _raw_text(EvaluationCase)
    if world.kind != "scope":  # a deleted scope is no longer listed to its clients at all
        listed = api_client_for(alice).get("/api/v1/scopes/scope-a/evaluation-cases/")
        assert listed.status_code == 200 and MARKER not in listed.content.decode()


def test_it_keeps_cases_about_other_memories_when_one_memory_is_forgotten(scope_a, fake_engine):
    world = World(scope_a, "memory")
    other = evaluation_case_add(scope=scope_a, question="What does locker 2 hold?", answers=["item 14"])
    world.erase()
    assert evaluation_case_open(case=EvaluationCase.objects.get(pk=other.pk)).answers == ["item 14"]


def test_it_erases_a_case_made_before_quotes_were_recorded_when_any_memory_of_its_scope_is_forgotten(scope_a, fake_engine):
    world = World(scope_a, "memory")
    EvaluationCase.objects.filter(pk=world.cases[0].pk).update(memories_recorded=False)
    world.cases[0].memories.clear()
    world.erase()
    assert EvaluationCase.objects.get(pk=world.cases[0].pk).erased_at is not None


def test_it_refuses_a_case_quoting_a_memory_forgotten_meanwhile(scope_a, fake_engine, monkeypatch):
    from cartridges.services import cases

    world = World(scope_a, "memory")
    read = cases._memories_quoted

    def read_then_forget(**kwargs):
        found = read(**kwargs)  # the memory is read while live, then forgotten before the case is linked
        memory_forget_file(scope=scope_a, seq=world.secret.seq, requested_by=None, reason="asked")
        return found

    monkeypatch.setattr(cases, "_memories_quoted", read_then_forget)
    from core.errors import Conflict

    with pytest.raises(Conflict):
        evaluation_case_add(scope=scope_a, question="And the vault code?", answers=[MARKER])


def test_it_discards_every_answer_request_of_the_scope(world):
    assert AnswerRequest.objects.filter(pk=world.request.pk).exists()
    world.erase()
    assert not AnswerRequest.objects.filter(pk=world.request.pk).exists()
    assert MARKER not in _raw_text(AnswerRequest)


def test_it_leaves_no_text_in_answer_records(world):
    """Answer records hold timings and ids, never a question or an answer: nothing to erase, and nothing to read."""
    assert MARKER in world.answer.answer  # the fake engine quotes what it holds: the answer did contain it
    world.erase()
    assert AnswerRecord.objects.filter(scope=world.scope).exists()
    assert MARKER not in _raw_text(AnswerRecord) and "vault" not in _raw_text(AnswerRecord)


def test_it_destroys_every_block_and_blob_holding_the_erased_memory(world, blob_root):
    assert len(world.links) == 2
    first, second = (link.block for link in world.links)
    world.erase()
    live = set(BlobKey.objects.values_list("storage_name", flat=True))
    assert world.version.storage_name not in live and not storage.blob_exists(storage_name=world.version.storage_name)
    assert second.storage_name not in live and not storage.blob_exists(storage_name=second.storage_name)
    # the first block holds none of the erased tokens: kept for the rebuild, unless the whole scope went
    assert (first.storage_name in live) == (world.kind != "scope")
    if world.kind == "scope":
        assert not BlobKey.objects.filter(scope=world.scope).exists()
        assert [p for p in blob_root.rglob("*") if p.is_file()] == []


def test_it_leaves_no_erased_copy_in_this_processes_caches(world, settings):
    engine.cartridge_load(version=world.version, config=world.version.config)  # both caches hold it now
    assert world.version.pk in {key[0] for key in engine._cartridges}
    assert {link.block.storage_name for link in world.links} <= set(storage._block_cache)
    world.erase()
    assert world.version.pk not in {key[0] for key in engine._cartridges}
    assert world.links[1].block.storage_name not in storage._block_cache


def test_it_destroys_blobs_no_version_names_when_a_scope_is_deleted(scope_a, fake_engine, blob_root):
    world = World(scope_a, "scope")
    # the key row of an unfinished compile: written before its blob, no version row names it
    row, key = storage.blob_reserve(scope=scope_a)
    orphan = storage.blob_write(blob=row, key=key, data=b"half a compile").name
    world.erase()
    assert not BlobKey.objects.filter(storage_name=orphan).exists()
    assert not storage.blob_exists(storage_name=orphan)


def test_it_refuses_a_case_in_a_scope_deleted_meanwhile(scope_a, fake_engine):
    from core.errors import Conflict

    World(scope_a, "scope").erase()
    with pytest.raises(Conflict, match="deleted"):
        evaluation_case_add(scope=scope_a, question="What is in locker 2?", answers=["item 14"])
