"""bin/serve, the production web server (gunicorn managing uvicorn ASGI workers), started as a real process
against the test database and spoken to over real HTTP: an authenticated ask, a refused anonymous one, the
collected static files, and a clean teardown of the whole process group."""
from __future__ import annotations

import os

import pytest
import requests

from cartridges.services import cartridge_activate, cartridge_compile, kv_configuration_switch
from memories.services import memory_append

from .procs import ROOT, Proc, database_url, free_port, group_alive, port_open, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def blob_dir(settings, tmp_path):
    """One blob directory for this process and the server's."""
    root = tmp_path / "blobs"
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(root)}}}
    return root


@pytest.fixture
def serve(tmp_path, blob_dir):
    """Factory: start bin/serve on a free port with extra environment; stopped (its process group killed) at teardown."""
    started: list[Proc] = []

    def start(**extra: str) -> tuple[Proc, str]:
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "MNESIO_BIND": f"127.0.0.1:{port}",
            "MNESIO_WEB_WORKERS": "1",
            "MNESIO_DATA_DIR": str(tmp_path / "data"),  # STATIC_ROOT is collected into it
            "MNESIO_BLOB_ROOT": str(blob_dir),
            "MNESIO_KV_BACKEND": "fake",  # never loads torch: the test is about the server, not the answers
            "MNESIO_KV_MODEL": "fake-model",
            "SECURE_SSL_REDIRECT": "false",  # plain http on loopback (production keeps the redirect)
            **extra,
        }
        proc = Proc([str(ROOT / "bin" / "serve")], env=env, log_path=tmp_path / f"serve-{port}.log")
        started.append(proc)
        wait_for(lambda: not proc.alive() or port_open(port), timeout=120, what="bin/serve to listen", log=proc.output)
        assert proc.alive(), proc.output()[-4000:]
        return proc, f"http://127.0.0.1:{port}"

    yield start
    for proc in started:
        proc.stop()


def test_it_serves_an_authenticated_ask_over_real_http(serve, alice, scope_a, eager_tasks):
    from knox.models import AuthToken

    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    _, token = AuthToken.objects.create(user=alice)

    proc, base = serve()
    auth = {"Authorization": f"Token {token}"}
    response = requests.post(f"{base}/api/scopes/scope-a/ask/", json={"question": "What is Dana's locker code?"},
                             headers=auth, timeout=30)
    assert response.status_code == 200, (response.text, proc.output()[-3000:])
    body = response.json()
    assert "4417" in body["answer"] and body["version_id"] == version.pk
    assert response.headers["server"] == "uvicorn"  # a uvicorn worker under gunicorn, not runserver

    anonymous = requests.post(f"{base}/api/scopes/scope-a/ask/", json={"question": "What is Dana's locker code?"}, timeout=30)
    assert anonymous.status_code == 401 and "4417" not in anonymous.text
    # the admin's stylesheet comes from STATIC_ROOT (collected by bin/serve, served by WhiteNoise)
    css = requests.get(f"{base}/static/admin/css/base.css", timeout=30)
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css") and "body" in css.text

    pgid = proc.proc.pid
    proc.stop()
    assert not group_alive(pgid)  # the arbiter and its workers are gone
    assert "4417" not in proc.output() and "locker" not in proc.output()  # the access log holds no memory text


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
