"""Secrets: no memory plaintext outside the sealed log (logs, stderr, task messages, error bodies, cartridge
metadata, any database row); the master key from the environment or a file; rotation through key files;
``manage.py check --deploy`` clean with production settings."""
from __future__ import annotations

import base64
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.core import serializers

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
MARKER = "okapi-umbrella-5521"  # unique: any occurrence outside the sealed log is a leak
LOGGERS = ("", "django", "django.request", "celery", "memories", "cartridges", "kvengine", "mnesio")


@pytest.fixture
def all_logs(caplog):
    """Capture every record at DEBUG, including the project loggers that do not propagate to the root."""
    handler = caplog.handler
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.level))
        logger.setLevel(logging.DEBUG)
        if handler not in logger.handlers:
            logger.addHandler(handler)
    yield caplog
    for logger, level in saved:
        logger.setLevel(level)
        if handler in logger.handlers and logger.name != "root":
            logger.removeHandler(handler)


def _scan(label: str, text: str, found: list[str]) -> None:
    if MARKER in text:
        at = text.index(MARKER)
        found.append(f"{label}: ...{text[max(0, at - 120):at + 40]!r}")


def test_no_plaintext_leaks_outside_the_sealed_log_after_a_full_run(
    alice, charlie, scope_a, api_client_for, fake_row, eager_tasks, all_logs, capfd, blob_root,
    django_capture_on_commit_callbacks, record_figures,
):
    from cartridges.models import CartridgeVersion
    from cartridges.storage import blob_read

    client, foreign = api_client_for(alice), api_client_for(charlie)
    errors: list[tuple[str, str]] = []

    def call(method: str, url: str, body=None, *, who=client):
        response = getattr(who, method)(url, data=body, format="json") if body is not None else getattr(who, method)(url)
        if response.status_code >= 400:
            errors.append((f"{method.upper()} {url} -> {response.status_code}", response.content.decode(errors="replace")))
        return response

    memories = "/api/v1/scopes/scope-a/memories/"
    assert call("post", memories, {"content": f"The spare key is under the blue flowerpot {MARKER}.", "idempotency_key": "k1"}).status_code == 201
    assert call("post", memories, {"content": f"Dana's locker code is 4417 {MARKER}.", "subject": "dana"}).status_code == 201
    assert call("post", memories, {"content": "The car is parked on level 3.", "subject": "erin"}).status_code == 201
    # refusals that hold the plaintext in their input: the error must not echo it
    assert call("post", memories, {"content": f"other {MARKER}", "idempotency_key": "k1"}).status_code == 409
    assert call("post", memories, {"content": f"{MARKER} " + "x" * 9000}).status_code == 400
    assert call("post", memories, {"content": f"{MARKER}\x00nul"}).status_code == 400
    assert call("post", memories, {"content": f"{MARKER}", "subject": "dana\x07"}).status_code == 400
    assert call("post", memories, {"content": f"{MARKER}", "contnet": f"{MARKER}"}).status_code == 400
    assert call("post", memories, {"content": f"{MARKER}"}, who=foreign).status_code == 404
    call("post", "/api/v1/scopes/scope-a/evaluation-cases/", {"question": "Where is the spare key?", "answers": ["flowerpot"]})

    compiled = call("post", "/api/v1/scopes/scope-a/cartridges/compile/", {"activate": True})
    assert compiled.status_code == 202, compiled.content
    version_id = compiled.json()["version_id"]
    assert call("post", f"/api/v1/scopes/scope-a/cartridges/{version_id}/activate/", {}).status_code == 200
    for mode in ("cartridge", "text"):
        assert call("post", "/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "mode": mode}).status_code == 200
    assert call("post", "/api/v1/scopes/scope-a/ask/", {"question": f"{MARKER}?", "mode": "nonsense"}).status_code == 400
    with django_capture_on_commit_callbacks(execute=True):
        filed = call("post", "/api/v1/scopes/scope-a/erasure-requests/", {"subject": "dana", "reason": "asked to be forgotten"})
    assert filed.status_code == 201
    assert call("get", f"/api/v1/scopes/scope-a/erasure-requests/{filed.json()['id']}/").json()["status"] == "views_rebuilt"
    call("get", "/api/v1/kv/metrics")
    call("get", "/api/v1/kv/metrics?format=prometheus")

    found: list[str] = []
    for label, body in errors:
        _scan(f"error body {label}", body, found)
    for record in all_logs.records:
        _scan(f"log {record.name}", record.getMessage() + str(record.args or ""), found)
    out, err = capfd.readouterr()
    _scan("stdout", out, found)
    _scan("stderr", err, found)
    # every row of every table, the sealed log included (its ciphertext is base64 here, never the text)
    num_rows = 0
    for model in apps.get_models():
        rows = model._default_manager.all()
        num_rows += rows.count()
        _scan(f"table {model._meta.db_table}", serializers.serialize("json", rows), found)
    # cartridge metadata: the header inside every blob that still exists, and the stored (encrypted) bytes
    num_headers = 0
    for version in CartridgeVersion.objects.all():
        try:
            data = blob_read(version=version)
        except Exception:  # destroyed by the erasure: nothing left to scan
            continue
        (size,) = struct.unpack("<Q", data[:8])
        _scan(f"header of version {version.pk}", data[8 : 8 + size].decode(), found)
        num_headers += 1
    num_files = 0
    for path in blob_root.rglob("*"):
        if path.is_file():
            num_files += 1
            if MARKER.encode() in path.read_bytes():
                found.append(f"stored blob {path.name}")
    record_figures(
        scenario="plaintext scan", num_error_bodies=len(errors), num_log_records=len(all_logs.records),
        num_rows=num_rows, num_headers=num_headers, num_blob_files=num_files, num_leaks=len(found),
    )
    assert len(errors) >= 6 and num_headers >= 1 and num_files >= 1 and len(all_logs.records) >= 10
    assert not found, "\n".join(found)


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
def test_task_messages_in_the_broker_carry_ids_only(
    alice, scope_a, api_client_for, fake_row, redis_clean, django_capture_on_commit_callbacks
):
    from mnesio_site.celery import app

    client = api_client_for(alice)
    client.post("/api/v1/scopes/scope-a/memories/", data={"content": f"Dana's code is 4417 {MARKER}.", "subject": "dana"}, format="json")
    before = app.conf.task_always_eager
    app.conf.task_always_eager = False  # queue for real: no worker runs, the messages stay in Redis
    try:
        with django_capture_on_commit_callbacks(execute=True):  # sent once the request's transaction commits
            assert client.post("/api/v1/scopes/scope-a/cartridges/compile/", data={}, format="json").status_code == 202
        with django_capture_on_commit_callbacks(execute=True):
            filed = client.post("/api/v1/scopes/scope-a/erasure-requests/", data={"subject": "dana", "reason": "r"}, format="json")
        assert filed.status_code == 201
    finally:
        app.conf.task_always_eager = before
    messages = []
    for key in redis_clean.keys("*"):
        if redis_clean.type(key) == b"list":
            messages += redis_clean.lrange(key, 0, -1)
    assert len(messages) == 2, messages
    for raw in messages:
        assert MARKER.encode() not in raw and b"4417" not in raw
        envelope = json.loads(raw)
        args = json.loads(base64.b64decode(envelope["body"]))[0]
        assert all(isinstance(a, (int, bool)) or a is None for a in args), args


# ---------------------------------------------------------------------------
# Master key, rotation, deploy check: as separate processes, the way they are configured in production
# ---------------------------------------------------------------------------
def _manage(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MNESIO_", "SECRET_KEY"))}
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


KEY_ID = "from memories import crypto; print(crypto.master_key_id(crypto.master_key()))"


def test_the_master_key_comes_from_the_environment_or_a_file(tmp_path):
    from memories import crypto

    key = os.urandom(32)
    encoded = base64.urlsafe_b64encode(key).decode()
    (tmp_path / "master.key").write_text(encoded + "\n")
    prod = {"MNESIO_DEBUG": "false", "SECRET_KEY": "s" * 60}
    from_env = _manage("shell", "-c", KEY_ID, env={**prod, "MNESIO_MASTER_KEY": encoded}).stdout.split()[-1]
    from_file = _manage("shell", "-c", KEY_ID, env={**prod, "MNESIO_MASTER_KEY_FILE": str(tmp_path / "master.key")}).stdout.split()[-1]
    assert from_env == from_file == crypto.master_key_id(key)
    # production without a key, a short key, garbage, or an unreadable file: refused, naming the variable
    for env, words in [
        ({}, "`MNESIO_MASTER_KEY` (or `MNESIO_MASTER_KEY_FILE`) must be set"),
        ({"MNESIO_MASTER_KEY": base64.b64encode(b"short").decode()}, "decodes to 5"),
        ({"MNESIO_MASTER_KEY": "***not base64***"}, "MNESIO_MASTER_KEY"),
        ({"MNESIO_MASTER_KEY_FILE": str(tmp_path / "missing.key")}, "MNESIO_MASTER_KEY_FILE"),
    ]:
        result = _manage("shell", "-c", KEY_ID, env={**prod, **env}, check=False)
        assert result.returncode != 0 and words in result.stderr, (env, result.stderr[-1500:])
        assert encoded not in result.stderr


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_rotation_through_key_files_keeps_every_memory_openable(settings, tmp_path, scope_a):
    """The in-process rotation is tested in tests/memories/test_master_key_rotation.py; this runs the command
    in its own process with the keys in files, as an operator would."""
    from django.db import connection

    from memories.selectors import scope_memories_open
    from memories.services import memory_append

    old, new = os.urandom(32), os.urandom(32)
    for name, key in (("old.key", old), ("new.key", new)):
        (tmp_path / name).write_text(base64.urlsafe_b64encode(key).decode())
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = old, None
    for i in range(6):
        memory_append(scope=scope_a, subject=f"person-{i % 3}" if i % 2 else None, content=f"fact {i}")
    before = scope_memories_open(scope=scope_a)
    s = connection.settings_dict
    env = {
        "DATABASE_URL": f"postgres://{s['USER'] or 'postgres'}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}",
        "MNESIO_MASTER_KEY_FILE": str(tmp_path / "new.key"),
        "MNESIO_MASTER_KEY_OLD_FILE": str(tmp_path / "old.key"),
        "SECRET_KEY": "s" * 60,  # production settings (MNESIO_DEBUG defaults to false) require one
    }
    out = _manage("rotate_master_key", env=env).stdout
    assert "re-wrapped 5 key(s)" in out, out  # three subject keys, one scope key and the scope's search index key
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = new, None
    assert scope_memories_open(scope=scope_a) == before


def test_check_deploy_is_clean_with_production_settings():
    env = {
        "MNESIO_DEBUG": "false",
        "SECRET_KEY": base64.urlsafe_b64encode(os.urandom(48)).decode(),
        "MNESIO_MASTER_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "ALLOWED_HOSTS": "mnesio.example.com",
    }
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no issues" in result.stdout
