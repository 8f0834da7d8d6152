"""The request body limit agrees with the documented item limits: a batch at every limit at once is taken, and a
body over the limit is the JSON error shape with a stable code (413 ``body_too_large``) on /api/ and /v1/."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.django_db


def _item(i: int) -> dict:
    return {
        "content": "y" * 8192,  # MNESIO_MAX_MEMORY_BYTES
        "metadata": {"note": "m" * 4081},  # canonical {"note":"..."}: 4,092 of MNESIO_MAX_METADATA_BYTES' 4,096
        "subject": "s" * 200,
        "idempotency_key": f"{i:04d}" + "k" * 196,
    }


def test_it_takes_a_batch_of_1000_items_at_the_documented_limits(alice, scope_a, api_client_for, settings):
    body = json.dumps({"items": [_item(i) for i in range(1000)]})
    assert len(body) > 12_000_000  # over Django's default 2.5 MB several times
    response = api_client_for(alice).generic(
        "POST", "/api/v1/scopes/scope-a/memories/batch/", body, content_type="application/json"
    )
    assert response.status_code == 201, (response.status_code, response["Content-Type"], response.content[:300])
    assert response.json()["num_created"] == 1000


def test_the_body_limit_covers_a_batch_at_its_limits_in_the_worst_json_encoding(settings):
    from memories.services import MAX_BATCH_ITEMS, MAX_IDEMPOTENCY_KEY_CHARS, MAX_SUBJECT_CHARS

    # a control character is 1 byte of UTF-8 and 6 of JSON (\u0001); an astral character 4 and 12 (two escapes)
    worst_item = {
        "content": "\x01" * settings.MNESIO_MAX_MEMORY_BYTES,
        "metadata": {"n": "\x01" * (settings.MNESIO_MAX_METADATA_BYTES - len('{"n":""}'))},
        "subject": "\U0001f600" * MAX_SUBJECT_CHARS,
        "idempotency_key": "\U0001f600" * MAX_IDEMPOTENCY_KEY_CHARS,
    }
    worst = len(json.dumps({"items": [worst_item] * MAX_BATCH_ITEMS}, indent=1).encode())
    assert worst <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE, (worst, settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


@pytest.mark.parametrize("path", ["/api/v1/scopes/scope-a/memories/batch/", "/api/v1/scopes/scope-a/memories/",
                                  "/v1/chat/completions"])
def test_a_body_over_the_limit_is_a_json_413_with_a_stable_code(alice, scope_a, api_client_for, settings, path):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    client = APIClient()
    scheme = "Bearer" if path.startswith("/v1/") else "Token"
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {AuthToken.objects.create(user=alice)[1]}")
    body = json.dumps({"content": "x" * 10_001, "model": "scope-a", "messages": []})
    response = client.generic("POST", path, body, content_type="application/json")
    assert response.status_code == 413, (response.status_code, response["Content-Type"], response.content[:300])
    assert response["Content-Type"] == "application/json"
    error = response.json()
    if path.startswith("/v1/"):
        assert error["error"]["code"] == "body_too_large" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["code"] == "body_too_large" and error["extra"]["limit"] == 10_000, error
        assert error["extra"]["field"] == "body" and error["extra"]["size"] == len(body)
    assert scope_a.memories.count() == 0
