"""Other processes keep no erased cartridge, block or routed chunk in memory.

A web process's LRU of loaded versions and its cache of decrypted block parts would otherwise keep a destroyed
version's or block's KV after another process (a worker) processed the erasure: serving is refused by the
database check, but the decrypted state would stay in memory; so would its LRU of opened routed chunks. Every request
and task first drops cached versions, blocks and chunks that were destroyed (cartridges.engine.cartridges_purge_destroyed). Two real processes: this test process plays the
worker, a second Python process plays the web process and handles one real request through Django's
handler after the erasure.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_compile
from memories.services import (
    erasure_request_file,
    erasure_request_process,
    memory_append,
    memory_forget_file,
    scope_delete_file,
)
from tests.support.procs import database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]

WEB_PROCESS = r"""
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
django.setup()
from django.test import Client
from cartridges import engine
from cartridges.services import cartridge_answer
from memories.models import Scope

def cached():
    return sorted({key[0] for key in engine._cartridges})

scope = Scope.objects.get(name=sys.argv[1])
answer = cartridge_answer(scope=scope, question="What is Bob's locker code?")
print(json.dumps({"step": "loaded", "version": answer.version_id, "cached": cached(), "knows": "4417" in answer.answer}), flush=True)
sys.stdin.readline()  # the other process erases meanwhile
status = Client().get("/api/v1/scopes/").status_code  # one request, any route, through the whole handler
print(json.dumps({"step": "after_one_request", "status": status, "cached": cached()}), flush=True)
answer = cartridge_answer(scope=scope, question="What is Bob's locker code?")
print(json.dumps({"step": "answered", "version": answer.version_id, "cached": cached(), "knows": "4417" in answer.answer}), flush=True)
"""


def test_a_web_process_drops_a_version_destroyed_by_another_process_within_one_request(
    fake_row, scope_a, blob_root, record_figures
):
    memory_append(scope=scope_a, content="The car is parked on level 3.")
    memory_append(scope=scope_a, subject="bob", content="Bob's locker code is 4417.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MNESIO_KV_BACKEND": "fake",
        "MNESIO_KV_MODEL": "fake-model",
        "MNESIO_BLOB_ROOT": str(blob_root),
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),  # the same dev master key file as this process
    }
    web = subprocess.Popen(
        [sys.executable, "-c", WEB_PROCESS, scope_a.name], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        loaded = json.loads(web.stdout.readline() or "{}")
        assert loaded.get("step") == "loaded", web.stderr.read()[-3000:]
        assert loaded["version"] == version.pk and loaded["cached"] == [version.pk] and loaded["knows"]

        request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope_a)
        erasure_request_process(erasure_request=request)  # this process is the worker
        assert version_state(version=version) == "destroyed"
        rebuilt = active_version(scope=scope_a)

        web.stdin.write("go\n")
        web.stdin.flush()
        after = json.loads(web.stdout.readline() or "{}")
        assert after.get("step") == "after_one_request", web.stderr.read()[-3000:]
        assert version.pk not in after["cached"]
        answered = json.loads(web.stdout.readline())
        assert answered["version"] == rebuilt.pk and not answered["knows"] and version.pk not in answered["cached"]
        assert web.wait(timeout=30) == 0
    finally:
        if web.poll() is None:
            web.kill()
    record_figures(
        scenario="destroyed cartridge in another process's LRU",
        requests_until_dropped=1, cached_before=loaded["cached"], cached_after=after["cached"],
    )


BLOCK_WEB_PROCESS = r"""
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
django.setup()
from django.test import Client
from cartridges import engine, storage
from cartridges.services import cartridge_answer
from memories.models import Scope

def cached():
    return {"versions": sorted({key[0] for key in engine._cartridges}), "blocks": sorted(storage._block_cache)}

scope = Scope.objects.get(name=sys.argv[1])
answer = cartridge_answer(scope=scope, question="What is Bob's locker code?")
print(json.dumps({"step": "loaded", "version": answer.version_id, **cached()}), flush=True)
sys.stdin.readline()  # the other process erases meanwhile
status = Client().get("/api/v1/scopes/").status_code  # one request, any route, through the whole handler
print(json.dumps({"step": "after_one_request", "status": status, **cached()}), flush=True)
"""


@pytest.mark.parametrize(("kind", "lru_size"), [("subject", 8), ("subject", 0), ("memory", 8), ("scope", 8)],
                         ids=["subject-lru-on", "subject-lru-off", "memory", "scope"])
def test_a_web_process_drops_blocks_destroyed_by_another_process_within_one_request(
    fake_row, scope_a, blob_root, record_figures, kind, lru_size
):
    from cartridges.models import CartridgeVersionBlock

    for i in range(4):  # the fake backend cuts blocks of 4 memories: bob's memory starts the second block
        memory_append(scope=scope_a, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    bobs = memory_append(scope=scope_a, subject="bob", content="Bob's locker code is 4417.")
    for i in range(4, 8):
        memory_append(scope=scope_a, content=f"Fact {i}: locker {i} holds item {i * 7}.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    first, second = (link.block.storage_name for link in CartridgeVersionBlock.objects.filter(version=version).order_by("index"))

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MNESIO_KV_BACKEND": "fake",
        "MNESIO_KV_MODEL": "fake-model",
        "MNESIO_BLOB_ROOT": str(blob_root),
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
        "MNESIO_CARTRIDGE_CACHE_SIZE": str(lru_size),
    }
    web = subprocess.Popen(
        [sys.executable, "-c", BLOCK_WEB_PROCESS, scope_a.name], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        loaded = json.loads(web.stdout.readline() or "{}")
        assert loaded.get("step") == "loaded", web.stderr.read()[-3000:]
        assert loaded["version"] == version.pk and {first, second} <= set(loaded["blocks"])

        if kind == "subject":
            request = erasure_request_file(subject="bob", requested_by=None, reason="asked", scope=scope_a)
        elif kind == "memory":
            request = memory_forget_file(scope=scope_a, seq=bobs.seq, requested_by=None, reason="asked")
        else:
            request = scope_delete_file(scope=scope_a, requested_by=None, reason="retired")
        erasure_request_process(erasure_request=request)  # this process is the worker
        assert version_state(version=version) == "destroyed"

        web.stdin.write("go\n")
        web.stdin.flush()
        after = json.loads(web.stdout.readline() or "{}")
        assert after.get("step") == "after_one_request", web.stderr.read()[-3000:]
        assert second not in after["blocks"]  # the destroyed block's decrypted part is gone from memory
        # the block before it holds none of bob's tokens and stays live, unless the whole scope went
        assert (first in after["blocks"]) == (kind != "scope")
        assert version.pk not in after["versions"]
        assert web.wait(timeout=30) == 0
    finally:
        if web.poll() is None:
            web.kill()
    record_figures(
        scenario=f"destroyed block in another process's block cache ({kind} erasure, LRU size {lru_size})",
        requests_until_dropped=1, blocks_before=len(loaded["blocks"]), blocks_after=len(after["blocks"]),
    )


ROUTED_WEB_PROCESS = r"""
import json, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
django.setup()
from django.test import Client
from cartridges.services import cartridge_answer
from cartridges.chunk_cache import chunk_cache_held
from memories.models import Scope

def cached():
    return sorted(chunk_cache_held())

scope = Scope.objects.get(name=sys.argv[1])
answer = cartridge_answer(scope=scope, question="What is the vault code?")
print(json.dumps({"step": "loaded", "layout": answer.layout, "cached": cached(), "knows": "5521" in answer.answer}), flush=True)
sys.stdin.readline()  # the other process erases meanwhile
status = Client().get("/api/v1/scopes/").status_code  # one request, any route, through the whole handler
print(json.dumps({"step": "after_one_request", "status": status, "cached": cached()}), flush=True)
"""


@pytest.mark.parametrize("kind", ["subject", "memory", "scope"])
def test_a_web_process_drops_routed_chunks_destroyed_by_another_process_within_one_request(
    fake_row, scope_a, blob_root, record_figures, kind
):
    from cartridges.models import RoutedChunk
    from cartridges.services.routed_chunks import routed_chunks_compile
    from cartridges.services.scope_settings import scope_settings_update

    scope_settings_update(scope=scope_a, layout="routed")
    for i in range(3):
        memory_append(scope=scope_a, content=f"Locker {i} holds the spare item number {i * 7} today.")
    secret = memory_append(scope=scope_a, subject="dana", content="The vault code is quokka-5521.")
    routed_chunks_compile(scope=scope_a, config=("fake", "fake-model", "f32", "none"))
    chunks = dict(RoutedChunk.objects.filter(scope=scope_a).values_list("memory__seq", "pk"))
    erased = chunks[secret.seq]

    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MNESIO_KV_BACKEND": "fake",
        "MNESIO_KV_MODEL": "fake-model",
        "MNESIO_BLOB_ROOT": str(blob_root),
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
    }
    web = subprocess.Popen(
        [sys.executable, "-c", ROUTED_WEB_PROCESS, scope_a.name], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        loaded = json.loads(web.stdout.readline() or "{}")
        assert loaded.get("step") == "loaded", web.stderr.read()[-3000:]
        assert loaded["layout"] == "routed" and loaded["knows"] and erased in loaded["cached"]

        if kind == "subject":
            request = erasure_request_file(subject="dana", requested_by=None, reason="asked", scope=scope_a)
        elif kind == "memory":
            request = memory_forget_file(scope=scope_a, seq=secret.seq, requested_by=None, reason="asked")
        else:
            request = scope_delete_file(scope=scope_a, requested_by=None, reason="retired")
        erasure_request_process(erasure_request=request)  # this process is the worker
        assert not RoutedChunk.objects.filter(pk=erased).exists()

        web.stdin.write("go\n")
        web.stdin.flush()
        after = json.loads(web.stdout.readline() or "{}")
        assert after.get("step") == "after_one_request", web.stderr.read()[-3000:]
        assert erased not in after["cached"]  # the erased memory's decrypted chunk is gone from memory
        # the other memories' chunks stay opened, unless the whole scope went
        others = set(loaded["cached"]) - {erased}
        assert others and (others <= set(after["cached"])) == (kind != "scope")
        assert kind != "scope" or after["cached"] == []
        assert web.wait(timeout=30) == 0
    finally:
        if web.poll() is None:
            web.kill()
    record_figures(
        scenario=f"destroyed routed chunk in another process's chunk LRU ({kind} erasure)",
        requests_until_dropped=1, chunks_before=len(loaded["cached"]), chunks_after=len(after["cached"]),
    )
