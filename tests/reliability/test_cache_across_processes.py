"""Other processes keep an erased cartridge in memory (issue 11, item 10).

Before the fix a web process's LRU still held the destroyed version's decrypted KV after another process (a
worker) processed the erasure; serving was refused by the database check, but the decrypted state stayed in
memory. Now every request and task first drops cached versions that were destroyed or list an erased
subject (cartridges.engine.cartridges_purge_destroyed). Two real processes: this test process plays the
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
from memories.services import erasure_request_file, erasure_request_process, memory_append

from .conftest import _database_url

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
status = Client().get("/api/scopes/").status_code  # one request, any route, through the whole handler
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
        "DATABASE_URL": _database_url(),
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
