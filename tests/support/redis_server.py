"""A redis-server of one test only, on this worker's private port (MNESIO_TEST_PRIVATE_REDIS_PORT, set per xdist
worker by tests/settings.py), for the broker-fault and health tests; the shared 6379 server is never touched."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import redis

PORT = int(os.environ.get("MNESIO_TEST_PRIVATE_REDIS_PORT", "6390"))
URL = f"redis://127.0.0.1:{PORT}/0"


class PrivateRedis:
    """A redis-server of this test only, killed with SIGKILL on restart and at teardown."""

    def __init__(self, directory: Path, *, appendonly: bool):
        self.directory, self.appendonly, self.proc = directory, appendonly, None

    def start(self) -> None:
        args = ["redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(URL)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError(f"redis-server on port {PORT} did not start (port taken?)") from None
                time.sleep(0.1)

    def crash(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(URL)
