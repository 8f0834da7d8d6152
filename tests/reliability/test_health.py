"""/healthz and /readyz (mnesio_site/health.py): liveness without the database, readiness per dependency, tested by
stopping a private Redis (MNESIO_TEST_PRIVATE_REDIS_PORT; the shared server is never touched) and by breaking blob
storage; answered over plain http to any Host, without a token or CSRF, and never leaking a path or a URL."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.support.redis_server import URL, PrivateRedis

BROKEN_MARKER = "not-a-directory-marker"


def _wait_ready(client, *, timeout: float = 60.0):
    """Poll /readyz until 200 (the first probe starts loading the model in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/readyz")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


@pytest.fixture
def probe_client(settings):
    """A client that speaks plain http with a Host no ALLOWED_HOSTS lists (a probe to the pod's IP), production
    redirects on, and CSRF checks enforced."""
    from django.test import Client

    settings.SECURE_SSL_REDIRECT = True
    return Client(enforce_csrf_checks=True, HTTP_HOST="10.11.12.13")


@pytest.fixture(autouse=True)
def fresh_readiness_cache():
    """Each test starts with no cached storage check (mnesio_site.health caches it per process)."""
    from mnesio_site import health

    health.readiness_cache_clear()
    yield
    health.readiness_cache_clear()


@pytest.fixture
def operator_probe(probe_client, operator, settings):
    """The probe client with a staff user's API token: /readyz shows it each check (storage checks not cached)."""
    from knox.models import AuthToken

    settings.MNESIO_READYZ_STORAGE_CACHE_S = 0
    probe_client.defaults["HTTP_AUTHORIZATION"] = f"Token {AuthToken.objects.create(user=operator)[1]}"
    return probe_client


def test_healthz_answers_without_touching_the_database(probe_client):
    # no django_db mark: any query would raise "Database access not allowed"
    response = probe_client.get("/healthz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"
    assert probe_client.head("/healthz").status_code == 200


def test_healthz_touches_no_database_while_the_process_holds_cached_cartridges(probe_client, monkeypatch):
    # every other request first checks the process's cached blobs against the database (cartridges_purge_destroyed)
    from cartridges import engine

    monkeypatch.setattr(engine, "block_cache_names", lambda: ["a-cached-block"])
    response = probe_client.get("/healthz")  # no django_db mark: a query would raise
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_health_endpoints_refuse_writes_as_json(probe_client):
    response = probe_client.post("/readyz", {})
    assert response.status_code == 405 and response.json()["code"] == "method_not_allowed"
    assert response["Allow"] == "GET, HEAD"


@pytest.mark.django_db
def test_readyz_is_ready_when_every_dependency_answers(operator_probe, fake_row, real_broker):
    response = _wait_ready(operator_probe)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ok"
    assert set(body["checks"]) == {"database", "broker", "blob_storage", "model"}
    assert body["checks"]["model"] == {"status": "ok", "model": "fake:fake-model:f32:none",
                                       "duration_ms": body["checks"]["model"]["duration_ms"]}
    for name in ("database", "blob_storage"):
        assert body["checks"][name]["status"] == "ok", body
    expected_broker = "ok" if os.environ.get("REDIS_URL") else "skipped"
    assert body["checks"]["broker"]["status"] == expected_broker, body


@pytest.mark.django_db
def test_readyz_reports_the_model_loading_until_it_is_loaded(operator_probe, fake_row, monkeypatch):
    from cartridges import engine

    engine.cache_clear(backends=True)
    loaded = engine.backend_for
    gate = __import__("threading").Event()

    def slow_load(config):
        gate.wait(10)
        return loaded(config)

    monkeypatch.setattr(engine, "backend_for", slow_load)
    first = operator_probe.get("/readyz")
    assert first.status_code == 503
    assert first.json()["checks"]["model"]["status"] == "loading"
    assert first.json()["status"] == "unavailable"
    gate.set()
    assert _wait_ready(operator_probe).status_code == 200


@pytest.mark.django_db
def test_readyz_skips_the_model_where_the_process_does_not_answer(operator_probe, fake_row, settings):
    settings.MNESIO_READYZ_MODEL = False
    body = operator_probe.get("/readyz").json()
    assert body["checks"]["model"]["status"] == "skipped"


@pytest.mark.django_db
def test_readyz_is_503_while_blob_storage_is_broken_and_recovers(operator_probe, fake_row, settings, tmp_path):
    _wait_ready(operator_probe)
    a_file = tmp_path / BROKEN_MARKER
    a_file.write_text("a file where the blob root's parent directory should be")
    good = settings.STORAGES["cartridges"]
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(a_file / "blobs")}}}
    response = operator_probe.get("/readyz")
    assert response.status_code == 503, response.content
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["blob_storage"]["status"] == "unavailable"
    assert body["checks"]["blob_storage"]["errno"] in ("ENOTDIR", "EEXIST"), body
    assert body["checks"]["database"]["status"] == "ok"
    assert BROKEN_MARKER not in response.content.decode()  # no path in the body
    settings.STORAGES = {**settings.STORAGES, "cartridges": good}
    assert operator_probe.get("/readyz").status_code == 200
    assert not any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))  # the probe object is deleted


@pytest.mark.postgres
@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")
@pytest.mark.django_db
def test_readyz_is_503_while_redis_is_down_and_recovers(operator_probe, fake_row, real_broker, tmp_path):
    from mnesio_site.celery import app

    server = PrivateRedis(tmp_path, appendonly=False)
    server.start()
    before = app.conf.broker_url
    app.conf.broker_url = URL
    try:
        assert _wait_ready(operator_probe).status_code == 200
        server.crash()
        response = operator_probe.get("/readyz")
        assert response.status_code == 503, response.content
        body = response.json()
        assert body["checks"]["broker"]["status"] == "unavailable", body
        assert {name: c["status"] for name, c in body["checks"].items() if name != "broker"} == {
            "database": "ok", "blob_storage": "ok", "model": "ok"}
        assert "redis://" not in response.content.decode() and str(URL.split(":")[-1].split("/")[0]) not in (
            body["checks"]["broker"].get("error", ""))
        server.start()
        assert operator_probe.get("/readyz").status_code == 200
    finally:
        app.conf.broker_url = before
        server.crash()


@pytest.fixture
def s3_bucket(settings, tmp_path):
    """A bucket on a local S3-compatible server (moto in server mode) as STORAGES["cartridges"], through
    django-storages' S3 backend; skipped where those packages are not installed."""
    import socket
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    pytest.importorskip("storages.backends.s3")
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    moto_server = Path(sys.executable).parent / "moto_server"
    if not moto_server.exists():
        pytest.skip("needs moto_server (moto[server,s3])")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen([str(moto_server), "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
    deadline = time.monotonic() + 30
    name = f"readyz-{uuid.uuid4().hex[:12]}"
    while True:
        try:
            client.create_bucket(Bucket=name)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {"bucket_name": name, "endpoint_url": endpoint, "region_name": "us-east-1", "access_key": "test",
                    "secret_key": "test", "addressing_style": "path", "signature_version": "s3v4",
                    "file_overwrite": False,
                    # a probe must not wait out botocore's default retries against a dead endpoint
                    "client_config": Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})},
    }}
    yield {"proc": proc, "client": client, "bucket": name, "endpoint": endpoint}
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


@pytest.mark.django_db
def test_readyz_checks_s3_blob_storage_through_django_storages(operator_probe, fake_row, s3_bucket):
    response = _wait_ready(operator_probe)
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["blob_storage"]["status"] == "ok"
    listed = s3_bucket["client"].list_objects_v2(Bucket=s3_bucket["bucket"])
    assert listed.get("KeyCount", 0) == 0  # the probe object was deleted
    s3_bucket["proc"].kill()
    s3_bucket["proc"].wait(timeout=10)
    down = operator_probe.get("/readyz")
    assert down.status_code == 503, down.content
    check = down.json()["checks"]["blob_storage"]
    assert check["status"] == "unavailable" and check["error"], check
    assert s3_bucket["endpoint"] not in down.content.decode() and s3_bucket["bucket"] not in down.content.decode()


@pytest.mark.django_db
def test_an_anonymous_readyz_says_ready_or_not_and_nothing_else(probe_client, fake_row, settings):
    ready = _wait_ready(probe_client)
    assert ready.status_code == 200 and ready.json() == {"status": "ok"}, ready.content
    settings.MNESIO_READYZ_STORAGE_CACHE_S = 0
    settings.STORAGES = {**settings.STORAGES, "cartridges": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": "/proc/no-such/blobs"}}}
    down = probe_client.get("/readyz")
    assert down.status_code == 503 and down.json() == {"status": "unavailable"}, down.content


@pytest.mark.django_db
def test_readyz_details_need_a_staff_token(probe_client, fake_row, alice):
    from knox.models import AuthToken

    _wait_ready(probe_client)
    for header in (f"Token {AuthToken.objects.create(user=alice)[1]}", "Token not-a-token", "Bearer x"):
        body = probe_client.get("/readyz", HTTP_AUTHORIZATION=header).json()
        assert body == {"status": "ok"}, (header, body)  # a client's token, or a wrong one: status only


@pytest.mark.django_db
def test_a_probe_never_loads_a_model_where_the_process_does_not_answer(operator_probe, fake_row, settings):
    from cartridges import engine

    engine.cache_clear(backends=True)
    settings.MNESIO_WEB_LOADS_MODEL = False  # a model-free web tier: gpu workers answer its asks
    settings.MNESIO_READYZ_MODEL = True
    anonymous = operator_probe.get("/readyz", HTTP_AUTHORIZATION="")
    detailed = operator_probe.get("/readyz")
    assert anonymous.status_code == detailed.status_code == 200, (anonymous.content, detailed.content)
    assert detailed.json()["checks"]["model"]["status"] == "skipped"
    time.sleep(0.2)  # a load would have started in a thread by now
    assert engine.cache_info()["backends_loaded"] == [] and not health_loading()


def health_loading() -> list[str]:
    from mnesio_site import health

    return list(health._model_loading)


@pytest.mark.django_db
def test_storage_checks_are_cached_for_a_few_seconds(probe_client, fake_row, settings, monkeypatch):
    from django.core.files.storage import FileSystemStorage

    saves: list[str] = []
    original = FileSystemStorage.save

    def counting_save(self, name, *args, **kwargs):
        saves.append(name)
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(FileSystemStorage, "save", counting_save)
    settings.MNESIO_READYZ_STORAGE_CACHE_S = 60
    _wait_ready(probe_client)
    num_saves = len(saves)
    for _ in range(20):
        assert probe_client.get("/readyz").status_code == 200
    assert len(saves) == num_saves == 1, saves
