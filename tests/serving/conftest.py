"""Fixtures of the serving tests: the API fixtures (fake engine, eager tasks, ``served``), a real ASGI server
(uvicorn, in a thread of this process so it shares the test database and settings: tests/support/servers.py),
a fake engine whose streams are slow and say when they are closed, and a scope served by the real model."""
from __future__ import annotations

import threading
import time

import pytest

from kvengine.fake import FakeKvBackend
from tests.api.conftest import eager_tasks, fake_engine, served  # noqa: F401 (fixtures, requested by name)
from tests.cartridges.conftest import blob_root  # noqa: F401
from tests.support.servers import LiveAsgi, token_for

REAL_CONFIG = ("transformers", "smollm2-135m-instruct", "f32", "none")


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
            self.gate.wait(120)  # a loaded machine (parallel workers) can take over 30 s between a clear and a set
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


@pytest.fixture
def served_real(settings, real_backend, small_gate):
    """A scope of two memories (Lena in Porto, Marco in Lyon) compiled and activated with the real model, through the
    one-probe gate; returns (scope name, token). The OpenAI real-model and LangChain tests ask it."""
    from django.contrib.auth import get_user_model

    from cartridges import engine
    from cartridges.services import cartridge_activate, cartridge_compile, kv_configuration_switch
    from memories.services import memory_append, scope_create, scope_grant

    settings.MNESIO_KV_BACKEND, settings.MNESIO_KV_MODEL, settings.MNESIO_KV_DTYPE, settings.MNESIO_KV_QUANT = REAL_CONFIG
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 16  # short answers keep the test in seconds on 2 cores
    engine.register_backend(REAL_CONFIG, real_backend)
    backend, model, dtype, quant = REAL_CONFIG
    kv_configuration_switch(backend=backend, model=model, dtype=dtype, quant=quant, actor=None)
    scope = scope_create(name="lockers")
    for text in ["Lena is a nurse who lives in Porto.", "Marco works as a baker in Lyon."]:
        memory_append(scope=scope, content=text)
    cartridge_activate(version=cartridge_compile(scope=scope))
    user = get_user_model().objects.create_user(username="agent")
    scope_grant(scope=scope, user=user)
    return scope.name, token_for(user)
