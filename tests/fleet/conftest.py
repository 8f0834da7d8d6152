"""Fixtures of the server and fleet tests: ``serve`` starts bin/serve as a real process against the test database
(any test about the production server, e.g. streaming through it, can use it)."""
from __future__ import annotations

import os

import pytest

from tests.support.procs import ROOT, Proc, database_url, free_port, port_open, wait_for


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
