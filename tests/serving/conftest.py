"""Fixtures of the serving tests: the API fixtures (fake engine, eager tasks, ``served``), a real ASGI server
(uvicorn, in a thread of this process so it shares the test database and settings), a real HTTP client
reading an event stream incrementally, and a fake engine whose streams are slow and say when they are closed."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvengine.fake import FakeKvBackend
from tests.api.conftest import eager_tasks, fake_engine, served  # noqa: F401 (fixtures, requested by name)
from tests.cartridges.conftest import blob_root  # noqa: F401

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


@pytest.fixture
def asgi_server(transactional_db):
    """A live uvicorn (ASGI) server of the project, stopped at teardown."""
    server = LiveAsgi().start()
    yield server
    server.stop()


@pytest.fixture(params=["wsgi", "asgi"])
def server_url(request):
    """The base URL of a live server: pytest-django's WSGI live_server, then uvicorn (ASGI)."""
    if request.param == "wsgi":
        return request.getfixturevalue("live_server").url
    return request.getfixturevalue("asgi_server").url


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


class SlowStreams(FakeKvBackend):
    """The fake engine whose streams pause between deltas and record whether they ended or were closed early."""

    def __init__(self, delay_s: float = 0.2) -> None:
        super().__init__(model="fake-model")
        self.delay_s = delay_s
        self.closed_early = threading.Event()
        self.finished = threading.Event()
        self.started = threading.Event()
        self.gate = threading.Event()  # when cleared, streams wait before their first delta (holds a slot)
        self.gate.set()

    def answer_stream(self, cartridge, question, *, max_new_tokens=32):
        done = False
        try:
            self.started.set()
            self.gate.wait(30)
            for item in super().answer_stream(cartridge, question, max_new_tokens=max_new_tokens):
                if isinstance(item, str):
                    time.sleep(self.delay_s)
                yield item
            done = True
            self.finished.set()
        finally:
            if not done:
                self.closed_early.set()


@pytest.fixture
def slow_engine(fake_engine):  # noqa: F811
    """Serve the fake configuration with SlowStreams in this process (the live servers share it)."""
    from cartridges import engine

    backend = SlowStreams()
    engine.register_backend(fake_engine, backend)
    yield backend
    backend.gate.set()
    engine.cache_clear(backends=True)
