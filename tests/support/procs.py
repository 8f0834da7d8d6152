"""Real processes for the server and fleet tests: a free port, the test database's URL, a moto S3 server.

Every process is started in its own session (process group) and killed as a group at teardown, so a test
that fails halfway leaves nothing running (workers fork pool children; gunicorn forks its workers).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin/: moto_server, gunicorn, honcho


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url(settings_dict: dict | None = None, name: str | None = None) -> str:
    """The URL of database ``name`` on ``settings_dict``'s server; by default the database this test process uses
    (pytest-django's test database)."""
    from urllib.parse import quote

    from django.db import connection

    s = settings_dict or connection.settings_dict
    user = quote(s.get("USER") or "postgres") + (f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else "")
    return f"postgres://{user}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{name or s['NAME']}"


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, log: Callable[[], str] = lambda: "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` with the log's tail."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError:
            raise  # the predicate saw a definite failure: no point waiting
        except Exception as exc:  # noqa: BLE001 - a server that is not up yet refuses connections
            last_error = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_error!r})\n{log()[-6000:]}")


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    """A process in its own process group, with its output in a log file; ``stop()`` kills the whole group."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log_path: Path, cwd: Path = ROOT):
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, *, grace_s: float = 10.0) -> None:
        """SIGTERM the group (a clean shutdown), then SIGKILL whatever is left of it."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # children that outlived their parent share its group
        except ProcessLookupError:
            pass
        if self.proc.returncode is None:
            self.proc.wait(timeout=10)
        self._log.close()


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is still running."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


TAG_VARIABLE = "MNESIO_FLEET_TEST_TAG"


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries ``TAG_VARIABLE=tag`` (every process a fleet run started).

    honcho starts each process in a session of its own, so killing the fleet's process group does not reach
    them once honcho is gone; their inherited environment still names the run. Zombies have an empty environ.
    """
    needle = f"{TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or not readable
            continue
    return found


def fleet_stop(proc: Proc, tag: str) -> list[int]:
    """Stop a fleet whatever state it is in; return the tagged processes still alive afterwards (should be none).

    SIGTERM to honcho first (it stops each process group, SIGKILL after 5 s), then SIGKILL to the fleet's own
    process group, then to every process still tagged with this run, and their groups.
    """
    if proc.alive():
        os.kill(proc.proc.pid, signal.SIGTERM)
        try:
            proc.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    proc.stop(grace_s=1)
    for pid in tagged_pids(tag):
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return tagged_pids(tag)


class FleetRun:
    """``bin/fleet --own-redis --local-s3 --no-migrate`` on free ports against the test database, tagged for teardown.

    The caller stops it with ``fleet_stop(run.proc, run.tag)`` in a ``finally``.
    """

    def __init__(self, tmp_path: Path, *, extra_env: dict[str, str]):
        self.tag = uuid.uuid4().hex
        web_port, self.redis_port, s3_port = free_port(), free_port(), free_port()
        self.base_url, self.s3_endpoint = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{s3_port}"
        self.bucket = f"fleet-{self.tag[:12]}"
        dropped = ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "MNESIO_BLOB_ROOT",
                   "MNESIO_BLOB_STORAGE_BACKEND", "PROMETHEUS_MULTIPROC_DIR")
        env = {key: value for key, value in os.environ.items() if key not in dropped}
        env.update({
            TAG_VARIABLE: self.tag,
            "DATABASE_URL": database_url(),
            "MNESIO_BIND": f"127.0.0.1:{web_port}",
            "MNESIO_WEB_WORKERS": "1",
            "MNESIO_FLEET_REDIS_PORT": str(self.redis_port),  # its own Redis: no other test's queues or keys
            "MNESIO_LOCAL_S3_PORT": str(s3_port),
            "MNESIO_S3_BUCKET": self.bucket,
            "MNESIO_FLEET_NAME": f"test-{self.tag[:8]}",
            "MNESIO_FLEET_DIR": str(tmp_path / "fleet"),
            "MNESIO_DATA_DIR": str(tmp_path / "data"),
            "MNESIO_FLEET_DEFAULT_CONCURRENCY": "1",
            "SECURE_SSL_REDIRECT": "false",  # plain http on loopback
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or "1",
            **extra_env,
        })
        self.proc = Proc([str(ROOT / "bin" / "fleet"), "--own-redis", "--local-s3", "--no-migrate"], env=env,
                         log_path=tmp_path / "fleet.log")


class MotoS3:
    """``moto_server`` on a free loopback port (objects in memory), with a fresh bucket per ``bucket()`` call."""

    def __init__(self, log_path: Path):
        if shutil.which("moto_server", path=str(BIN)) is None:
            raise RuntimeError("moto_server is missing: install the pinned `moto[server,s3]` (requirements.txt)")
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
        self.proc = Proc([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)], env=env, log_path=log_path)
        wait_for(lambda: port_open(self.port), timeout=30, what="moto_server to listen", log=self.proc.output)
        self.client = self.make_client()

    def make_client(self):
        import boto3

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id="test", aws_secret_access_key="test",
        )

    def bucket(self, *, versioned: bool = False) -> str:
        name = f"mnesio-test-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        if versioned:
            self.client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def keys(self, bucket: str) -> list[str]:
        """Every key in the bucket (current objects)."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def all_versions(self, bucket: str) -> list[tuple[str, str]]:
        """Every (key, version id) the bucket still stores, delete markers included."""
        found = []
        for page in self.client.get_paginator("list_object_versions").paginate(Bucket=bucket):
            for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                found.append((entry["Key"], entry["VersionId"]))
        return sorted(found)

    def env(self, bucket: str) -> dict[str, str]:
        """The environment that points a mnesio process's blob storage at this bucket."""
        return {
            "MNESIO_BLOB_STORAGE": "s3",
            "MNESIO_S3_BUCKET": bucket,
            "MNESIO_S3_ENDPOINT_URL": self.endpoint_url,
            "MNESIO_S3_REGION": "us-east-1",
            "MNESIO_S3_ACCESS_KEY_ID": "test",
            "MNESIO_S3_SECRET_ACCESS_KEY": "test",
            "MNESIO_S3_ADDRESSING_STYLE": "path",
        }

    def storage_setting(self, bucket: str) -> dict[str, Any]:
        """STORAGES["cartridges"] for this bucket (what mnesio_site/settings.py builds from ``env()``)."""
        return {
            "BACKEND": "cartridges.s3.CartridgeS3Storage",
            "OPTIONS": {
                "bucket_name": bucket, "location": "", "endpoint_url": self.endpoint_url, "region_name": "us-east-1",
                "access_key": "test", "secret_key": "test", "addressing_style": "path", "signature_version": "s3v4",
                "file_overwrite": False, "default_acl": None, "querystring_auth": True,
            },
        }

    def stop(self) -> None:
        self.proc.stop(grace_s=5)
