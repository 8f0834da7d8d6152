"""A web process of the project in a subprocess: uvicorn serving Django's ASGI application, which writes at
exit whether it ever imported torch (sys.modules), and whose RSS and mapped libraries can be read from /proc."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# uvicorn re-raises a captured SIGTERM after its graceful shutdown, to the handler it found: this one reports
LAUNCHER = """
import json, os, signal, sys
import uvicorn
def report(*_):
    with open(sys.argv[1], "w") as f:
        json.dump({name: name in sys.modules for name in ("torch", "transformers")}, f)
    os._exit(0)
signal.signal(signal.SIGTERM, report)
uvicorn.run("django.core.asgi:get_asgi_application", factory=True, host="127.0.0.1", port=int(sys.argv[2]),
            log_level="warning", lifespan="off")
report()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebProcess:
    """uvicorn + Django in a subprocess on a free port; ``stop()`` ends it gracefully and reads its report."""

    def __init__(self, *, env: dict[str, str], workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.report_path = workdir / f"web-{self.port}.json"
        self.log_path = workdir / f"web-{self.port}.log"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(self.report_path), str(self.port)],
                                     cwd=ROOT, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the web process did not start: {self.output()}") from None
                time.sleep(0.1)

    def rss_kb(self) -> int:
        """Resident memory now (VmRSS, kB)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def maps_torch(self) -> bool:
        """Whether libtorch is mapped into the process (it is from the moment torch is imported)."""
        return "libtorch" in Path(f"/proc/{self.proc.pid}/maps").read_text()

    def stop(self) -> dict[str, bool]:
        """End the process gracefully (SIGTERM: uvicorn shuts down, atexit reports) and return its report."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        return json.loads(self.report_path.read_text()) if self.report_path.exists() else {}

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
