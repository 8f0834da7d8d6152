"""Live servers in tests: uvicorn running the project's ASGI application in a thread, an API token, and a real
HTTP client reading an event stream incrementally."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

LONG = ("The spare key is under the blue flowerpot beside the green door of the old stone house at the end of "
        "the lane where the river bends twice before the mill.")


class LiveAsgi:
    """A uvicorn server running the project's ASGI application (bin/serve's) on a free port, in a thread."""

    def __init__(self) -> None:
        import uvicorn

        from mnesio_site.asgi import application

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(application, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> LiveAsgi:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def token_for(user) -> str:
    from knox.models import AuthToken

    return AuthToken.objects.create(user=user)[1]


class EventStream:
    """A real HTTP client (http.client) POSTing JSON and reading the response's server-sent events one by one."""

    def __init__(self, base_url: str, path: str, body: dict, *, auth: str, timeout: float = 60, accept: str | None = None):
        host, port = base_url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        headers = {"Authorization": auth, "Content-Type": "application/json", **({"Accept": accept} if accept else {})}
        self.conn.request("POST", path, body=json.dumps(body), headers=headers)
        self.started = time.perf_counter()
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = dict(self.response.getheaders())

    def events(self) -> Iterator[tuple[str | None, str, float]]:
        """(event, data, seconds since the request) for each event, as it arrives."""
        event, data = None, []
        while True:
            line = self.response.readline()
            if not line:
                return
            line = line.decode().rstrip("\r\n")
            if not line:
                if data:
                    yield event, "\n".join(data), time.perf_counter() - self.started
                event, data = None, []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())

    def body(self) -> bytes:
        return self.response.read()

    def close(self) -> None:
        """Drop the connection (a client going away mid-stream)."""
        self.response.close()
        self.conn.sock and self.conn.sock.close()
        self.conn.close()
