"""Worker faults on a real Celery worker and real Redis (the harness of tests/cartridges/test_worker.py).

- kill -9 of the worker's child in the middle of an erasure: the task is delivered again and finishes,
  with one rebuilt version and the erasure's steps each recorded once.
- a task still running when another consumer's visibility timeout expires is delivered a second time
  while the first delivery runs: both finish and there is still exactly one version and one blob.
(kill -9 in the middle of a compile: tests/cartridges/test_worker.py, test_it_finishes_a_compile_whose_...)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cartridges.models import BlobKey, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_compile
from memories.models import ErasureEvent, ErasureStatus
from memories.services import erasure_request_file, memory_append
from tests.support.worker import wait_for_worker

pytestmark = [
    pytest.mark.usefixtures("real_broker"),
    pytest.mark.celery_worker,
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)"),
]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120  # generous: the 2 cores are shared with other test runs


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_erasure_whose_worker_was_killed_is_delivered_again_and_finishes(fake_row, start_worker, blob_root, record_figures):
    from memories.models import Scope
    from memories.tasks import erasure_request_process_task

    scope = Scope.objects.create(name="erasure-fault")
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    dana = memory_append(scope=scope, subject="dana", content="Dana's locker code is 4417.")
    old = cartridge_compile(scope=scope)
    cartridge_activate(version=old)
    request = erasure_request_file(subject="dana", requested_by=None, reason="asked to be forgotten")

    # the rebuild's compile pauses 4 s: the window in which the child is killed, after the key was shredded
    worker = start_worker(MNESIO_CARTRIDGE_COMPILE_PAUSE_S="4")
    started_at = time.monotonic()
    result = erasure_request_process_task.delay(request.pk)
    started = wait_for_worker(lambda: result.state == "STARTED" and result.info, timeout=TIMEOUT_S, what="the erasure to start", worker=worker)
    # mid-erasure: the key is shredded and the old cartridge destroyed; the rebuild's compile is pausing
    wait_for_worker(lambda: ErasureEvent.objects.filter(request=request, status=ErasureStatus.KEYS_SHREDDED).exists()
          and version_state(version=old) == "destroyed", timeout=TIMEOUT_S, what="the shred and destruction", worker=worker)
    child = started["pid"]
    os.kill(child, signal.SIGKILL)
    killed_at = time.monotonic()
    assert active_version(scope=scope) is None and CartridgeVersion.objects.filter(scope=scope).count() == 1

    redelivered = wait_for_worker(
        lambda: result.state == "STARTED" and result.info and result.info.get("pid") not in (None, child) and result.info,
        timeout=TIMEOUT_S, what="the erasure to be delivered again", worker=worker,
    )
    assert result.get(timeout=TIMEOUT_S) == ErasureStatus.VIEWS_REBUILT
    finished_at = time.monotonic()

    statuses = list(ErasureEvent.objects.filter(request=request).order_by("id").values_list("status", flat=True))
    assert statuses == ["requested", "keys_shredded", "views_rebuilt"]  # each step once, no failure recorded
    versions = list(CartridgeVersion.objects.filter(scope=scope).order_by("id"))
    assert len(versions) == 2 and versions[0] == old
    rebuilt = versions[1]
    assert active_version(scope=scope) == rebuilt and rebuilt.manifest["left_out"] == [dana.seq]
    assert BlobKey.objects.count() == 1 and len(_files(blob_root)) == 1
    assert "signal 9" in worker.output() or "SIGKILL" in worker.output()
    record_figures(
        scenario="kill -9 mid-erasure", killed_pid=child, redelivered_pid=redelivered["pid"],
        seconds_kill_to_finished=round(finished_at - killed_at, 2), seconds_total=round(finished_at - started_at, 2),
        num_versions=len(versions), erasure_steps=statuses,
    )


def test_a_task_delivered_twice_past_a_visibility_timeout_makes_one_version(fake_row, start_worker, blob_root, record_figures):
    from cartridges.tasks import cartridge_compile_task
    from memories.models import Scope

    scope = Scope.objects.create(name="visibility")
    memory_append(scope=scope, content="The spare key is under the blue flowerpot.")
    memory_append(scope=scope, content="The car is parked on level 3.")

    # worker A: the production settings (visibility timeout 3600 s), a compile that takes 15 s
    first = start_worker(MNESIO_CARTRIDGE_COMPILE_PAUSE_S="15")
    result = cartridge_compile_task.delay(scope.pk)
    info = wait_for_worker(lambda: result.state == "STARTED" and result.info, timeout=TIMEOUT_S, what="the compile to start", worker=first)
    first_child = info["pid"]
    time.sleep(6)  # the message has now been unacked for longer than worker B's visibility timeout

    # worker B: a 5 s visibility timeout (time limits below it, as settings require); on start it restores
    # every message unacked for longer than that, so the running compile is delivered a second time
    second = start_worker(
        CELERY_VISIBILITY_TIMEOUT="5", CELERY_TASK_TIME_LIMIT="4", CELERY_TASK_SOFT_TIME_LIMIT="3",
        MNESIO_CARTRIDGE_COMPILE_PAUSE_S="0",
    )
    outcome = wait_for_worker(lambda: result.state == "SUCCESS" and result.result, timeout=TIMEOUT_S, what="the second delivery", worker=second)
    assert outcome["ok"], outcome
    assert _alive(first_child), "the first delivery must still be running when the second one finishes"
    assert CartridgeVersion.objects.filter(scope=scope).count() == 1

    # the first delivery finishes later, loses the unique constraint, drops its blob and returns the same version
    wait_for_worker(lambda: first.output().count(f"Task cartridges.tasks.cartridge_compile_task[{result.id}] succeeded") == 1,
          timeout=TIMEOUT_S, what="the first delivery to finish", worker=first)
    assert f"Task cartridges.tasks.cartridge_compile_task[{result.id}] received" in second.output()
    version = CartridgeVersion.objects.get(scope=scope)
    assert outcome["version"] == version.pk
    result.backend.get_task_meta(result.id)  # the stored result is the first delivery's now
    assert result.backend.get_task_meta(result.id)["result"] == {"ok": True, "version": version.pk}
    assert BlobKey.objects.count() == 1 and len(_files(blob_root)) == 1
    record_figures(scenario="double delivery past the visibility timeout", num_deliveries=2, num_versions=1,
                   num_blobs=BlobKey.objects.count())


def test_settings_refuse_a_time_limit_at_or_above_the_visibility_timeout():
    env = {**os.environ, "CELERY_VISIBILITY_TIMEOUT": "60", "CELERY_TASK_TIME_LIMIT": "60", "CELERY_TASK_SOFT_TIME_LIMIT": "30"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "`CELERY_TASK_TIME_LIMIT` (60) has to be below `CELERY_VISIBILITY_TIMEOUT` (60)" in result.stderr


def _blocks_consistent() -> None:
    """No orphan block and no version missing a block: every block is live (its key row exists) or has a destruction
    record; every live version links only live blocks; every stored file has a key row."""
    from cartridges.models import CartridgeBlock, CartridgeBlockDestruction, CartridgeDestruction, CartridgeVersionBlock

    keys = set(BlobKey.objects.values_list("storage_name", flat=True))
    destroyed = set(CartridgeBlockDestruction.objects.values_list("block_id", flat=True))
    for block in CartridgeBlock.objects.all():
        assert (block.storage_name in keys) != (block.pk in destroyed), f"block {block.pk} is neither live nor recorded destroyed"
    dead_versions = set(CartridgeDestruction.objects.values_list("version_id", flat=True))
    for link in CartridgeVersionBlock.objects.exclude(version_id__in=dead_versions).select_related("block"):
        assert link.block.storage_name in keys, f"live version {link.version_id} links destroyed block {link.block_id}"


def test_a_worker_killed_between_writing_blocks_and_recording_the_version_leaves_no_orphan(fake_row, start_worker, blob_root, record_figures):
    from cartridges.models import CartridgeBlock, CartridgeVersionBlock
    from cartridges.tasks import cartridge_compile_task
    from memories.models import Scope

    scope = Scope.objects.create(name="block-store-fault")
    for i in range(9):
        memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    first = cartridge_compile(scope=scope)  # blocks 0 and 1 stored, memory 8 in the tail
    for i in range(9, 13):
        memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    blobs_before = BlobKey.objects.count()
    # the incremental compile writes its tail and one new block, then pauses before recording the version
    # grace 0: the redelivered compile's sweep (before it writes anything) removes the dead one's intents at once
    worker = start_worker(MNESIO_CARTRIDGE_STORE_PAUSE_S="4", MNESIO_ORPHAN_BLOB_GRACE_S="0")
    result = cartridge_compile_task.delay(scope.pk)
    started = wait_for_worker(lambda: result.state == "STARTED" and result.info, timeout=TIMEOUT_S, what="the compile to start", worker=worker)
    wait_for_worker(lambda: BlobKey.objects.count() == blobs_before + 2, timeout=TIMEOUT_S, what="the blobs to be written", worker=worker)
    os.kill(started["pid"], signal.SIGKILL)
    assert CartridgeVersion.objects.filter(scope=scope).count() == 1  # nothing recorded: the version never existed
    outcome = result.get(timeout=TIMEOUT_S)  # delivered again; its compile first sweeps the dead one's blobs
    assert outcome["ok"] and outcome["version"] != first.pk
    version = CartridgeVersion.objects.get(pk=outcome["version"])
    links = list(CartridgeVersionBlock.objects.filter(version=version).order_by("index"))
    first_links = list(CartridgeVersionBlock.objects.filter(version=first).order_by("index"))
    assert len(links) == 3 and [link.block_id for link in links[:2]] == [link.block_id for link in first_links]
    assert CartridgeBlock.objects.filter(scope=scope).count() == 3
    _blocks_consistent()
    claimed = set(CartridgeVersion.objects.values_list("storage_name", flat=True)) | set(CartridgeBlock.objects.values_list("storage_name", flat=True))
    assert set(BlobKey.objects.values_list("storage_name", flat=True)) == claimed  # the dead compile's intents are gone
    assert len(_files(blob_root)) == len(claimed)
    record_figures(scenario="kill -9 between block writes and the version row", num_blobs=len(claimed))


def test_a_block_level_erasure_whose_worker_was_killed_finishes_on_redelivery(fake_row, start_worker, blob_root, record_figures):
    from cartridges.models import CartridgeBlockDestruction, CartridgeVersionBlock
    from memories.models import Scope
    from memories.tasks import erasure_request_process_task

    scope = Scope.objects.create(name="block-erasure-fault")
    for i in range(8):
        memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    memory_append(scope=scope, subject="dana", content="Dana's locker code is 4417.")  # memory 8: block 2
    for i in range(9, 13):
        memory_append(scope=scope, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    old = cartridge_compile(scope=scope)
    cartridge_activate(version=old)
    old_links = list(CartridgeVersionBlock.objects.filter(version=old).select_related("block").order_by("index"))
    request = erasure_request_file(subject="dana", requested_by=None, reason="asked to be forgotten")
    worker = start_worker(MNESIO_CARTRIDGE_COMPILE_PAUSE_S="4")
    result = erasure_request_process_task.delay(request.pk)
    started = wait_for_worker(lambda: result.state == "STARTED" and result.info, timeout=TIMEOUT_S, what="the erasure to start", worker=worker)
    wait_for_worker(lambda: version_state(version=old) == "destroyed", timeout=TIMEOUT_S, what="the destruction", worker=worker)
    os.kill(started["pid"], signal.SIGKILL)
    assert result.get(timeout=TIMEOUT_S) == ErasureStatus.VIEWS_REBUILT
    rebuilt = active_version(scope=scope)
    assert rebuilt is not None and rebuilt != old
    kept = [link.block.storage_name for link in old_links[:2]]
    assert set(BlobKey.objects.filter(storage_name__in=kept).values_list("storage_name", flat=True)) == set(kept)
    assert CartridgeBlockDestruction.objects.filter(block=old_links[2].block).count() == 1
    assert [link.block_id for link in CartridgeVersionBlock.objects.filter(version=rebuilt).order_by("index")][:2] == [
        link.block_id for link in old_links[:2]
    ]
    _blocks_consistent()
    record_figures(scenario="kill -9 mid block-level erasure", blocks_kept=2, blocks_destroyed=1)
