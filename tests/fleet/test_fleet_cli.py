"""bin/fleet's command line: --help names every process and variable; wrong settings stop it before anything
starts, naming what is wrong (no process is left behind)."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.procs import ROOT


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")}
    return subprocess.run([str(ROOT / "bin" / "fleet"), *args], env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_its_help_names_the_processes_and_variables():
    done = _run("--help")
    assert done.returncode == 0
    for word in ("web", "default", "gpu", "beat", "--own-redis", "--local-s3", "REDIS_URL", "appendonly",
                 "MNESIO_BLOB_STORAGE=s3", "MNESIO_S3_BUCKET", "DATABASE_URL"):
        assert word in done.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {"DATABASE_URL": "sqlite:///x.sqlite3", "REDIS_URL": "redis://127.0.0.1:6379/0"},
         "DATABASE_URL has to be a postgres:// URL"),
        ((), {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/x"}, "REDIS_URL (or CELERY_BROKER_URL) has to be set"),
        (("--frobnicate",), {}, "unknown option '--frobnicate'"),
    ],
)
def test_it_refuses_to_start_without_what_a_fleet_needs(args, env, message):
    done = _run(*args, **env)
    assert done.returncode == 2 and message in done.stderr
