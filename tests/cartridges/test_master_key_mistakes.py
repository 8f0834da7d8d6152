"""A process started with the wrong master key: it refuses to write, every request that meets an unknown master
key answers a JSON 503 naming the variable (never a 500), rotation with the right old key still works, and a
Celery worker with the wrong key refuses to start."""
from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from core.keys import parse_master_key
from memories import crypto
from memories.models import Memory, ScopeKey, Subject
from memories.selectors import scope_memories_open
from memories.services import memory_append, scope_create

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
MEMORIES = "/api/v1/scopes/scope-a/memories/"


def _counts() -> tuple[int, int, int]:
    return Memory.objects.count(), Subject.objects.count(), ScopeKey.objects.count()


def _assert_503(response) -> dict:
    assert response.status_code == 503, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["extra"]["kind"] == "master_key_unavailable" and body["extra"]["variable"] == "MNESIO_MASTER_KEY"
    assert body["code"] == "master_key_unavailable"
    assert "MNESIO_MASTER_KEY" in body["message"]
    return body


@pytest.fixture
def stored(scope_a, append):
    """Keys wrapped by this process's (right) master key: a subject key and a scope key."""
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    return crypto.master_key()


@pytest.fixture
def wrong_key(settings, stored):
    """Turn this process into one started with another master key."""
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = os.urandom(32), None
    return settings.MNESIO_MASTER_KEY


def test_it_refuses_an_append_under_another_master_key_naming_the_variable(scope_a, wrong_key):
    before = _counts()
    new_scope = scope_create(name="scope-new")
    for scope, subject in ((scope_a, "erin"), (new_scope, None), (scope_a, None)):
        with pytest.raises(crypto.MasterKeyUnavailable, match="MNESIO_MASTER_KEY"):
            memory_append(scope=scope, subject=subject, content="written by the wrong process")
    assert _counts() == before


def test_the_verification_names_every_unknown_key_id_and_passes_with_the_right_keys(settings, stored):
    from memories.keyring import master_key_verify

    assert master_key_verify().ok
    settings.MNESIO_MASTER_KEY = os.urandom(32)
    report = master_key_verify()
    assert not report.ok and report.unknown == {crypto.master_key_id(stored): {"memories.Subject": 1, "memories.ScopeKey": 1,
                                                                         "memories.SearchIndex": 1}}
    with pytest.raises(crypto.MasterKeyUnavailable, match="MNESIO_MASTER_KEY"):
        report.raise_if_unknown()
    settings.MNESIO_MASTER_KEY_OLD = stored  # mid-rotation: the old key is known
    assert master_key_verify().ok


def test_a_fixed_key_works_again_in_the_same_process(settings, scope_a, wrong_key, stored):
    with pytest.raises(crypto.MasterKeyUnavailable):
        memory_append(scope=scope_a, content="refused")
    settings.MNESIO_MASTER_KEY = stored  # a failure is not cached: the fix applies
    assert memory_append(scope=scope_a, content="accepted").appended


def test_a_process_left_behind_by_a_rotation_elsewhere_refuses_to_wrap_once_it_meets_the_new_key(settings, scope_a, stored):
    assert memory_append(scope=scope_a, subject="erin", content="verified and cached").appended
    new_key = os.urandom(32)
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = new_key, stored
    call_command("rotate_master_key", stdout=io.StringIO())  # another process rotated
    settings.MNESIO_MASTER_KEY, settings.MNESIO_MASTER_KEY_OLD = stored, None  # this one still has the old key
    with pytest.raises(crypto.MasterKeyUnavailable):
        scope_memories_open(scope=scope_a)
    before = _counts()
    with pytest.raises(crypto.MasterKeyUnavailable, match="MNESIO_MASTER_KEY"):
        memory_append(scope=scope_a, subject="zed", content="would be wrapped by the retired key")
    assert _counts() == before


def test_api_calls_that_meet_an_unknown_master_key_answer_json_503(
    alice, scope_a, api_client_for, fake_engine, eager_tasks, blob_root, wrong_key
):
    client = api_client_for(alice)
    before = _counts()
    _assert_503(client.get(MEMORIES))
    _assert_503(client.post(MEMORIES, {"content": "written by the wrong process", "subject": "erin"}, format="json"))
    _assert_503(client.post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json"))
    _assert_503(client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?", "mode": "text"}, format="json"))
    assert _counts() == before


def test_an_admin_page_that_meets_an_unknown_master_key_answers_json_503(admin_client, scope_a, settings, stored):
    from cartridges.services import evaluation_case_add

    evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])
    settings.MNESIO_MASTER_KEY = os.urandom(32)
    response = admin_client.get("/admin/cartridges/evaluationcase/")
    _assert_503(response)
    assert "flowerpot" not in response.content.decode()


def test_the_middleware_turns_an_unknown_master_key_into_json_503(rf):
    from core.middleware import MasterKeyUnavailableMiddleware

    middleware = MasterKeyUnavailableMiddleware(lambda request: None)
    response = middleware.process_exception(rf.get("/dashboard/"), crypto.MasterKeyUnavailable("x"))
    assert response.status_code == 503 and b"master_key_unavailable" in response.content
    assert middleware.process_exception(rf.get("/"), ValueError("other")) is None
    assert "core.middleware.MasterKeyUnavailableMiddleware" in django_settings.MIDDLEWARE


def test_rotation_with_the_right_old_key_still_works_after_a_refused_start(settings, scope_a, wrong_key, stored):
    with pytest.raises(CommandError, match="MNESIO_MASTER_KEY_OLD"):
        call_command("rotate_master_key", stdout=io.StringIO())  # refused before re-wrapping anything
    assert set(Subject.objects.values_list("wrapped_by", flat=True)) == {crypto.master_key_id(stored)}
    settings.MNESIO_MASTER_KEY_OLD = stored
    out = io.StringIO()
    call_command("rotate_master_key", stdout=out)
    assert "re-wrapped 3 key(s)" in out.getvalue()  # the subject's, the scope's and the search index's
    settings.MNESIO_MASTER_KEY_OLD = None
    assert [m.text for m in scope_memories_open(scope=scope_a)] == [
        "The spare key is under the blue flowerpot.", "Dana's locker code is 4417."]
    assert memory_append(scope=scope_a, subject="dana", content="Dana moved.").appended


def test_the_database_check_names_the_variable(settings, wrong_key):
    with pytest.raises(SystemCheckError, match="MNESIO_MASTER_KEY"):
        call_command("check", "--database", "default", stdout=io.StringIO(), stderr=io.StringIO())
    # back to this test process's own key (tests/settings.py puts one in the environment)
    raw = os.environ.get("MNESIO_MASTER_KEY")
    settings.MNESIO_MASTER_KEY = parse_master_key(raw, name="MNESIO_MASTER_KEY") if raw else None
    call_command("check", "--database", "default", stdout=io.StringIO(), stderr=io.StringIO())


# ---------------------------------------------------------------------------
# Real processes against the test database
# ---------------------------------------------------------------------------
APPEND_SCRIPT = """
from memories.models import Scope
from memories.services import memory_append
for name, subject in (("scope-a", "erin"), ("scope-a", None), ("scope-fresh", None)):
    try:
        memory_append(scope=Scope.objects.get(name=name), subject=subject, content="written by the wrong process")
    except Exception as exc:
        print(f"refused {name} {subject}: {type(exc).__name__}: {exc}")
    else:
        print(f"appended {name} {subject}")
"""


def _other_key_env() -> dict[str, str]:
    from tests.support.procs import database_url

    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MNESIO_DATA_DIR": str(django_settings.DATA_DIR),
        "MNESIO_MASTER_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
    }


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_process_started_with_another_master_key_cannot_append(scope_a, append):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    scope_create(name="scope-fresh")
    before = _counts()
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", APPEND_SCRIPT], cwd=ROOT, env=_other_key_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("refused", "appended"))]
    assert len(lines) == 3 and all(line.startswith("refused") and "MNESIO_MASTER_KEY" in line for line in lines), result.stdout
    assert _counts() == before
    check = subprocess.run([sys.executable, "manage.py", "check", "--database", "default"], cwd=ROOT,
                           env=_other_key_env(), capture_output=True, text=True, timeout=120)
    assert check.returncode != 0 and "MNESIO_MASTER_KEY" in check.stderr


@pytest.mark.celery_worker
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
def test_a_celery_worker_started_with_another_master_key_refuses_to_start(scope_a, append, blob_root, tmp_path):
    from tests.support.worker import Worker

    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    worker = Worker(blob_root=blob_root, log_path=tmp_path / "worker.log", extra_env={"MNESIO_MASTER_KEY": key})
    try:
        returncode = worker.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        returncode = None
    finally:
        worker.stop()
    output = worker.output()
    assert returncode not in (None, 0), output[-3000:]
    assert "refused to start" in output and "MNESIO_MASTER_KEY" in output
    assert key not in output


def test_a_wrap_refuses_when_no_master_key_check_is_installed(monkeypatch):
    monkeypatch.setattr(crypto, "_guard", None)
    with pytest.raises(crypto.MasterKeyUnavailable, match="no master-key check is installed"):
        crypto.wrap(crypto.new_data_key(), aad=b"mnesio:test")


def test_the_memories_app_installs_the_keyring_check_around_every_wrap(monkeypatch):
    from memories import keyring

    checked = []
    guard = crypto.WrapGuard(before_wrap=lambda key_id, known: checked.append((key_id, known)), unknown_key_met=lambda: None)
    monkeypatch.setattr(crypto, "_guard", guard)
    wrapped = crypto.wrap(crypto.new_data_key(), aad=b"mnesio:test")
    assert checked == [(wrapped.wrapped_by, frozenset(crypto.known_master_keys()))]
    monkeypatch.undo()
    assert crypto._guard is keyring.WRAP_GUARD
