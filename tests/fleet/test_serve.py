"""bin/serve, the production web server (gunicorn managing uvicorn ASGI workers), started as a real process
against the test database and spoken to over real HTTP: an authenticated ask, a refused anonymous one, the
collected static files, and a clean teardown of the whole process group."""
from __future__ import annotations

import os

import pytest
import requests

from cartridges.services import cartridge_activate, cartridge_compile, kv_configuration_switch
from memories.services import memory_append
from tests.support.procs import ROOT, Proc, group_alive

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_it_serves_an_authenticated_ask_over_real_http(serve, alice, scope_a, eager_tasks):
    from knox.models import AuthToken

    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    _, token = AuthToken.objects.create(user=alice)

    proc, base = serve()
    auth = {"Authorization": f"Token {token}"}
    response = requests.post(f"{base}/api/v1/scopes/scope-a/ask/", json={"question": "What is Dana's locker code?"},
                             headers=auth, timeout=30)
    assert response.status_code == 200, (response.text, proc.output()[-3000:])
    body = response.json()
    assert "4417" in body["answer"] and body["version_id"] == version.pk
    assert response.headers["server"] == "uvicorn"  # a uvicorn worker under gunicorn, not runserver

    anonymous = requests.post(f"{base}/api/v1/scopes/scope-a/ask/", json={"question": "What is Dana's locker code?"}, timeout=30)
    assert anonymous.status_code == 401 and "4417" not in anonymous.text
    # the admin's stylesheet comes from STATIC_ROOT (collected by bin/serve, served by WhiteNoise)
    css = requests.get(f"{base}/static/admin/css/base.css", timeout=30)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and "body" in css.text

    pgid = proc.proc.pid
    proc.stop()
    assert not group_alive(pgid)  # the arbiter and its workers are gone
    assert "4417" not in proc.output() and "locker" not in proc.output()  # the access log holds no memory text


def test_it_streams_an_answer_as_server_sent_events_as_it_is_decoded(serve, alice, scope_a, eager_tasks):
    """The production server (gunicorn + uvicorn workers) streams an answer: a real client reads
    an event per delta, then the final event with version and timings (that deltas are sent while decoding, not
    after, is tests/serving/test_stream.py's check on uvicorn)."""
    import json

    from knox.models import AuthToken

    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    memory_append(scope=scope_a, content="The spare key is under the blue flower pot by the back door.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    _, token = AuthToken.objects.create(user=alice)

    proc, base = serve()
    response = requests.post(f"{base}/api/v1/scopes/scope-a/ask/", json={"question": "Where is the spare key?", "stream": True},
                             headers={"Authorization": f"Token {token}"}, timeout=30, stream=True)
    assert response.status_code == 200, (response.text, proc.output()[-3000:])
    assert response.headers["content-type"].startswith("text/event-stream") and response.headers["server"] == "uvicorn"
    events: list[tuple[str, dict]] = []
    event = None
    for line in response.iter_lines(decode_unicode=True):  # chunk by chunk off the socket, not the whole body
        if line.startswith("event: "):
            event = line[len("event: "):]
        elif line.startswith("data: "):
            events.append((event, json.loads(line[len("data: "):])))
    names = [name for name, _ in events]
    assert names[-1] == "done" and names.count("delta") >= 3 and set(names) == {"delta", "done"}, names
    done = events[-1][1]
    text = "".join(data["text"] for name, data in events if name == "delta").strip()
    assert text == done["answer"] and "blue flower pot" in text
    assert done["version_id"] == version.pk and done["ttft_s"] >= 0 and done["total_s"] >= done["ttft_s"]
    proc.stop()


def test_it_refuses_a_bad_worker_count_naming_the_variable(tmp_path):
    proc = Proc([str(ROOT / "bin" / "serve")], env={**os.environ, "MNESIO_WEB_WORKERS": "two"}, log_path=tmp_path / "bad.log")
    assert proc.proc.wait(timeout=30) == 2
    assert "MNESIO_WEB_WORKERS has to be a positive integer but got 'two'" in proc.output()
    proc.stop()


def test_its_help_names_the_variables(tmp_path):
    proc = Proc([str(ROOT / "bin" / "serve"), "--help"], env=dict(os.environ), log_path=tmp_path / "help.log")
    assert proc.proc.wait(timeout=30) == 0
    assert all(name in proc.output() for name in ("MNESIO_BIND", "MNESIO_WEB_WORKERS", "MNESIO_WEB_TIMEOUT"))
    proc.stop()


def test_two_compiles_at_once_in_one_worker_both_succeed_in_the_embedded_mode(serve, alice, scope_a, scope_c):
    """The embedded mode (no broker: tasks run in the request) under the ASGI server, which runs each request's
    sync code in a thread of its own: two compiles at once in one worker both succeed (Celery's process-wide
    "inside a task" flag, set by one thread's in-process task, must not fail the other's result read with a 500)."""
    import threading

    from knox.models import AuthToken

    from memories.services import scope_grant

    scope_grant(scope=scope_c, user=alice)
    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    for scope in (scope_a, scope_c):
        memory_append(scope=scope, content=f"A memory of {scope.name}.")
    _, token = AuthToken.objects.create(user=alice)
    auth = {"Authorization": f"Token {token}"}
    # no broker: tasks run in-process; each compile pauses 2 s after opening the log, so the two overlap
    proc, base = serve(REDIS_URL="", CELERY_BROKER_URL="", MNESIO_CARTRIDGE_COMPILE_PAUSE_S="2")

    results: dict[str, requests.Response] = {}

    def compile_scope(name: str) -> None:
        results[name] = requests.post(f"{base}/api/v1/scopes/{name}/cartridges/compile/", json={}, headers=auth, timeout=60)

    threads = [threading.Thread(target=compile_scope, args=(name,)) for name in ("scope-a", "scope-c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert {name: r.status_code for name, r in results.items()} == {"scope-a": 202, "scope-c": 202}, proc.output()[-3000:]
    assert all(r.json()["status"] == "done" and r.json()["version_id"] for r in results.values())
