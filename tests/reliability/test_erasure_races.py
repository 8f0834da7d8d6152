"""A compile in flight during an erasure: no version holding a shredded subject survives.

The compile reads the log, runs the model for seconds to minutes, then stores a version. Before the fix an
erasure processed in that window reported `views_rebuilt`, and the compile then stored a version whose
manifest held the subject and whose blob decrypted to the erased text. Now the store locks the manifest's
subject rows (cartridges.services.compile.manifest_subjects_lock) and the shred updates them, so the two are
ordered. Each interleaving is forced deterministically with events (threads, each with its own PostgreSQL
connection), and once more with a real Celery worker and a compile that pauses mid-way.
"""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from cartridges.models import BlobKey, CartridgeVersion
from cartridges.selectors import version_state
from cartridges.services import cartridge_compile
from cartridges.services import compile as compile_module
from cartridges.storage import blob_exists, blob_read
from memories.models import ErasureStatus, Memory, Scope
from memories.selectors import erasure_request_status
from memories.services import erasure_request_file, erasure_request_process, memory_append

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SECRET = "Bob's locker code is 4417."
WAIT_S = 30


def _log(scope: Scope) -> None:
    memory_append(scope=scope, content="The office wifi password is tulip.")
    memory_append(scope=scope, subject="bob", content=SECRET)
    memory_append(scope=scope, content="The team lunch is on Friday at noon.")


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a thread with its own database connection; the dict gets "value" or "error"."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # reported to the test, never swallowed
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _assert_no_live_version_holds_the_erased_text(scope: Scope, blob_root) -> dict:
    """Every version listing bob's memory is destroyed (no blob, no key); every live blob lacks the text."""
    bob_seqs = set(Memory.objects.filter(scope=scope, subject__external_id="bob").values_list("seq", flat=True))
    live, destroyed = 0, 0
    for version in CartridgeVersion.objects.filter(scope=scope):
        holds_bob = any(entry[0] in bob_seqs for entry in version.manifest["entries"])
        if holds_bob:
            assert version_state(version=version) == "destroyed", version.pk
            assert not blob_exists(storage_name=version.storage_name)
            assert not BlobKey.objects.filter(storage_name=version.storage_name).exists()
            destroyed += 1
        elif version_state(version=version) != "destroyed":
            assert b"4417" not in blob_read(version=version)  # the fake engine stores the texts it compiled
            live += 1
    # no orphan: every stored file is a live version's blob
    names = {v.storage_name for v in CartridgeVersion.objects.filter(destruction__isnull=True)}
    assert {str(p.relative_to(blob_root)) for p in blob_root.rglob("*.kvc")} == names
    return {"live_versions": live, "destroyed_versions_holding_subject": destroyed}


def test_an_erasure_while_the_model_runs_keeps_the_subject_out_of_the_stored_version(
    scope_a, fake_engine, blob_root, monkeypatch, record_figures
):
    _log(scope_a)
    computing, go = threading.Event(), threading.Event()
    real = compile_module.compile_parts
    compiled_subjects: list[list[str]] = []

    def held_compile(*, backend, data, scope=None):
        blob = real(backend=backend, data=data, scope=scope)
        compiled_subjects.append(data.subjects)
        if len(compiled_subjects) == 1:  # the first attempt read bob's memory: hold it until the erasure is done
            computing.set()
            assert go.wait(WAIT_S)
        return blob

    monkeypatch.setattr(compile_module, "compile_parts", held_compile)
    thread, out = _in_thread(lambda: cartridge_compile(scope=scope_a))
    assert computing.wait(WAIT_S)
    request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    go.set()
    thread.join(WAIT_S)
    assert "error" not in out, out.get("error")

    version = out["value"]
    assert compiled_subjects == [["bob"], []]  # the first result was refused at store, the log read again
    assert version.manifest["left_out"] == [2] and [e[0] for e in version.manifest["entries"]] == [1, 3]
    figures = _assert_no_live_version_holds_the_erased_text(scope_a, blob_root)
    assert figures["live_versions"] == 1
    record_figures(scenario="compile in flight, erasure first", compile_attempts=len(compiled_subjects), **figures)


def test_a_version_stored_before_the_erasure_is_destroyed_by_it(scope_a, fake_engine, blob_root, record_figures):
    _log(scope_a)
    version = cartridge_compile(scope=scope_a)
    assert b"4417" in blob_read(version=version)
    request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope_a)
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert version_state(version=version) == "destroyed"
    figures = _assert_no_live_version_holds_the_erased_text(scope_a, blob_root)
    record_figures(scenario="compile stored, then erasure", **figures)


def test_an_erasure_waits_for_a_store_in_progress_and_then_destroys_it(
    scope_a, fake_engine, blob_root, monkeypatch, record_figures
):
    _log(scope_a)
    locked, go = threading.Event(), threading.Event()
    real_lock = compile_module.manifest_subjects_lock

    def held_lock(subject_ids):
        real_lock(subject_ids)  # bob's row is locked until the version row commits
        locked.set()
        assert go.wait(WAIT_S)

    monkeypatch.setattr(compile_module, "manifest_subjects_lock", held_lock)
    request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope_a)
    compile_thread, compiled = _in_thread(lambda: cartridge_compile(scope=scope_a))
    assert locked.wait(WAIT_S)
    erase_thread, erased = _in_thread(lambda: erasure_request_process(erasure_request=request))
    time.sleep(1.0)
    # the shred waits for the store's lock: the erasure cannot have reached keys_shredded, let alone views_rebuilt
    assert erase_thread.is_alive()
    assert erasure_request_status(erasure_request=request) == ErasureStatus.REQUESTED
    go.set()
    compile_thread.join(WAIT_S)
    erase_thread.join(WAIT_S)
    assert "error" not in compiled and "error" not in erased, (compiled, erased)

    version = compiled["value"]
    assert [e[0] for e in version.manifest["entries"]] == [1, 2, 3]  # it stored bob's memory before the shred...
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert version_state(version=version) == "destroyed"  # ...and the erasure found and destroyed it
    figures = _assert_no_live_version_holds_the_erased_text(scope_a, blob_root)
    record_figures(scenario="store holding the lock, erasure waits", **figures)


@pytest.mark.celery_worker
@pytest.mark.skipif(not __import__("os").environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
def test_a_real_worker_compile_in_flight_does_not_store_an_erased_subject(
    fake_row, start_worker, blob_root, real_broker, record_figures
):
    from cartridges.tasks import cartridge_compile_task

    # the compile opens the log, then pauses 4 s (the window a real model's prefill takes) before compiling
    worker = start_worker(MNESIO_CARTRIDGE_COMPILE_PAUSE_S="4")
    scope = Scope.objects.create(name="race-scope")
    _log(scope)
    result = cartridge_compile_task.delay(scope.pk)
    deadline = time.monotonic() + 60
    while not (result.state == "STARTED" and result.info):
        assert time.monotonic() < deadline, worker.output()[-4000:]
        time.sleep(0.1)
    time.sleep(1.0)  # inside the pause: the log (with bob's memory) has been read
    request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope)
    erasure_request_process(erasure_request=request)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    outcome = result.get(timeout=60)
    assert outcome["ok"], outcome
    version = CartridgeVersion.objects.get(pk=outcome["version"])
    assert version.manifest["left_out"] == [2]
    figures = _assert_no_live_version_holds_the_erased_text(scope, blob_root)
    assert "lost a race with an erasure" in worker.output()
    assert SECRET not in worker.output()
    record_figures(scenario="compile in flight on a real worker, erasure meanwhile", **figures)


def test_a_subject_erasure_and_an_append_for_it_take_their_locks_in_one_order(scope_a, fake_engine, monkeypatch):
    """The shred locks the subject row and the log counter; an append for the subject takes the counter, then the
    subject. Forced: the shred holds what it locks first until the append waits for its second lock."""
    from django.db import OperationalError

    from core.errors import MnesioError
    from memories.selectors import memory_open
    from memories.services import appends, erasure, erasure_request_shred

    _log(scope_a)
    request = erasure_request_file(subject="bob", scope=scope_a, requested_by=None, reason="asked")
    both = threading.Barrier(2)

    def meet() -> None:
        try:
            both.wait(timeout=3)  # fixed, the append waits for the shred's first lock and never meets it
        except threading.BrokenBarrierError:
            pass

    def unindex_after_meeting(**kwargs):
        meet()
        time.sleep(0.5)  # the append, holding its first lock, now waits for its second
        return search_index_erase(**kwargs)

    def subjects_after_meeting(*args, **kwargs):
        meet()
        return subjects_resolve(*args, **kwargs)

    search_index_erase, subjects_resolve = erasure.search_index_erase, appends._subjects_resolve
    monkeypatch.setattr(erasure, "search_index_erase", unindex_after_meeting)
    monkeypatch.setattr(appends, "_subjects_resolve", subjects_after_meeting)
    shred, shredded = _in_thread(lambda: erasure_request_shred(erasure_request=request))
    append, appended = _in_thread(lambda: memory_append(scope=scope_a, subject="bob", content="Bob moved desks."))
    shred.join(WAIT_S)
    append.join(WAIT_S)
    assert not shred.is_alive() and not append.is_alive()
    errors = [out.get("error") for out in (shredded, appended)]
    assert not any(isinstance(e, OperationalError) for e in errors), errors  # "deadlock detected" before
    assert shredded.get("error") is None
    if "error" in appended:  # after the shred: its subject is erased, so it is refused (409)
        assert isinstance(appended["error"], MnesioError) and appended["error"].extra["field"] == "subject"
    else:  # before it: the shred erased it too
        assert memory_open(memory=Memory.objects.get(seq=appended["value"].seq)).erased


def test_a_scope_shred_and_a_routed_chunk_store_take_their_locks_in_one_order(scope_a, fake_engine, monkeypatch):
    """A routed chunk's store locks its memory's subject, then its own key (as a compile's store does); the scope's
    shred updates both. Forced: each holds its first lock until the other waits for it."""
    from django.db import OperationalError

    from cartridges.services import routed_chunks
    from core.models import AppendOnlyQuerySet
    from memories.models import MemoryKey
    from memories.services.shred import scope_keys_shred

    _log(scope_a)
    memory_append(scope=scope_a, subject="bob", content="Bob's desk is by the window.")
    both, met = threading.Barrier(2), []

    def meet() -> None:
        try:
            both.wait(timeout=3)  # fixed, one of the two waits for the other's first lock and never meets it
        except threading.BrokenBarrierError:
            pass
        time.sleep(0.5)  # the other, holding its first lock, now waits for its second

    def keys_lock_after_meeting(seqs):
        if not met:
            met.append("store")
            meet()
        return keys_lock(seqs)

    def update_then_meet(self, **kwargs):
        num = privileged_update(self, **kwargs)
        if self.model is MemoryKey and "shred" not in met:
            met.append("shred")
            meet()
        return num

    keys_lock, privileged_update = routed_chunks.manifest_memory_keys_lock, AppendOnlyQuerySet._privileged_update
    monkeypatch.setattr(routed_chunks, "manifest_memory_keys_lock", keys_lock_after_meeting)
    monkeypatch.setattr(AppendOnlyQuerySet, "_privileged_update", update_then_meet)
    bob_first = Memory.objects.filter(scope=scope_a, subject__external_id="bob").order_by("seq").first()
    store, stored = _in_thread(lambda: routed_chunks.routed_chunks_compile(
        scope=scope_a, config=fake_engine, seqs=[bob_first.seq]))
    shred, shredded = _in_thread(lambda: scope_keys_shred(scope=scope_a))
    store.join(WAIT_S)
    shred.join(WAIT_S)
    assert not store.is_alive() and not shred.is_alive()
    errors = [out.get("error") for out in (stored, shredded)]
    assert not any(isinstance(e, OperationalError) for e in errors), errors  # "deadlock detected" before
    assert errors == [None, None], errors
