"""A chunked request body (no Content-Length) over the body limit is the JSON 413 too, through the ASGI server."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from memories.models import Memory
from tests.support.servers import token_for

pytestmark = pytest.mark.django_db(transaction=True)


def _post_chunked(url: str, path: str, token: str, body: bytes) -> tuple[int, str, bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    pieces = (body[i:i + 4096] for i in range(0, len(body), 4096))  # an iterable body is sent chunked
    connection.request("POST", path, body=pieces, encode_chunked=True,
                       headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    response = connection.getresponse()
    result = response.status, response.getheader("Content-Type"), response.read()
    connection.close()
    return result


@pytest.mark.parametrize("path", ["/api/v1/scopes/scope-a/memories/", "/v1/chat/completions"])
def test_it_refuses_a_chunked_body_over_the_limit_as_json(asgi_server, alice, scope_a, settings, path):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"content": "x" * 20_000, "model": "scope-a", "messages": [{"role": "user", "content": "hi"}]})
    status, content_type, payload = _post_chunked(asgi_server.url, path, token_for(alice), body.encode())
    assert (status, content_type) == (413, "application/json"), (status, content_type, payload[:300])
    error = json.loads(payload)
    code = error["error"]["code"] if path.startswith("/v1/") else error["code"]
    assert code == "body_too_large"
    assert not Memory.objects.filter(scope=scope_a).exists()


def test_it_takes_a_chunked_body_within_the_limit(asgi_server, alice, scope_a, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps({"content": "The kettle is in the second cupboard."}).encode()
    status, _, payload = _post_chunked(asgi_server.url, "/api/v1/scopes/scope-a/memories/", token_for(alice), body)
    assert status == 201, payload[:300]
    assert Memory.objects.filter(scope=scope_a).count() == 1
