"""Clients that hang up on a streamed answer, through bin/serve (gunicorn + uvicorn, the production shape): every
ask's slot comes back within a second whenever the client leaves, and the process keeps answering."""
from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from cartridges.services import cartridge_activate, cartridge_compile, kv_configuration_switch
from memories.services import memory_append

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NUM_HANG_UPS = 500
LIMIT = 4


def _serving(scope) -> None:
    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)
    memory_append(scope=scope, content="The spare key is under the blue flower pot by the back door.")
    cartridge_activate(version=cartridge_compile(scope=scope))


def _hang_up(port: int, path: str, body: dict, token: str, *, linger_s: float) -> None:
    """POST the request on a raw socket and close it after ``linger_s`` without reading a byte of the answer."""
    raw = json.dumps(body).encode()
    scheme = "Bearer" if path.startswith("/v1/") else "Token"
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {scheme} {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + raw)
        if linger_s:
            time.sleep(linger_s)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST, as a killed client


def _asks(base: str, token: str) -> dict:
    response = requests.get(f"{base}/api/v1/kv/metrics", headers={"Authorization": f"Token {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json().get("asks", {})


def test_it_gives_back_the_slot_of_every_stream_its_client_abandons(serve, alice, scope_a, eager_tasks):
    from knox.models import AuthToken

    _serving(scope_a)
    _, token = AuthToken.objects.create(user=alice)
    proc, base = serve(MNESIO_MAX_WAITING_ASKS=str(LIMIT))
    port = int(base.rsplit(":", 1)[1])
    question = "Where is the spare key?"
    bodies = [("/api/v1/scopes/scope-a/ask/", {"question": question, "stream": True}),
              ("/v1/chat/completions", {"model": "scope-a", "stream": True,
                                        "messages": [{"role": "user", "content": question}]})]
    started = time.monotonic()
    # on both routes: hang-ups at once (before the view answered), after a few ms (around the first byte), mid-stream
    for i in range(NUM_HANG_UPS):
        path, body = bodies[i % 2]
        _hang_up(port, path, body, token, linger_s=(0, 0.002, 0.01, 0.03)[i // 2 % 4])
    hung_up_at = time.monotonic()
    # a leaked slot is held for good; how soon a slot comes back is the machine's load (3 workers on 2 cores: 1.5 s)
    while (held := _asks(base, token).get("in_flight")) != 0 and time.monotonic() - hung_up_at < 30:
        time.sleep(0.05)
    released_s = time.monotonic() - hung_up_at
    auth = {"Authorization": f"Token {token}"}
    plain = requests.post(f"{base}/api/v1/scopes/scope-a/ask/", json={"question": question}, headers=auth, timeout=30)
    assert plain.status_code == 200 and "blue flower pot" in plain.json()["answer"], (plain.text, proc.output()[-3000:])
    assert held == 0, f"{held} slots still held {released_s:.2f} s after the last hang-up"
    assert _asks(base, token)["limit"] == LIMIT
    print(f"FIGURES hang_ups={NUM_HANG_UPS} limit={LIMIT} hang_ups_s={hung_up_at - started:.1f} "
          f"slots_back_after_s={released_s:.2f}")

    # the process answers as before: LIMIT full streams open at once
    streams = [requests.post(f"{base}/api/v1/scopes/scope-a/ask/", json={"question": question, "stream": True},
                             headers=auth, timeout=30, stream=True) for _ in range(LIMIT)]
    assert [s.status_code for s in streams] == [200] * LIMIT
    for s in streams:
        assert "event: done" in s.text
    assert _asks(base, token)["in_flight"] == 0
