"""No body makes a cartridge endpoint answer 500: odd JSON shapes, types, sizes and encodings are 4xx
naming what was wrong; the hot ask endpoint runs a bounded number of queries."""
from __future__ import annotations

import json

import pytest

from cartridges.models import AnswerRecord, CartridgeActivation, CartridgeVersion, EvaluationCase, KvConfiguration

pytestmark = pytest.mark.django_db

HOSTILE = [
    None, True, 0, -1, 2**63, 1e308, "", " ", "\x00", "é" * 3000, [], [None], {}, {"$ne": 1},
    [[[[[]]]]], "' OR 1=1 --", "<script>alert(1)</script>", "../../etc/passwd",
]
ROUTES = {
    "/api/v1/scopes/scope-a/ask/": ["question", "mode"],
    "/api/v1/scopes/scope-a/evaluation-cases/": ["question", "answers"],
    "/api/v1/scopes/scope-a/cartridges/compile/": ["log_head", "activate"],
    "/api/v1/kv/configuration/": ["backend", "model", "dtype", "quant"],
}
VALID = {
    "/api/v1/scopes/scope-a/ask/": {"question": "Where is the spare key?", "mode": "cartridge"},
    "/api/v1/scopes/scope-a/evaluation-cases/": {"question": "Where is the spare key?", "answers": ["flowerpot"]},
    "/api/v1/scopes/scope-a/cartridges/compile/": {"log_head": 1, "activate": False},
    "/api/v1/kv/configuration/": {"backend": "fake", "model": "fake-model", "dtype": "bf16", "quant": "q8"},
}


@pytest.fixture
def world(alice, scope_a, served, operator):
    from memories.services import scope_grant

    scope_grant(scope=scope_a, user=operator)
    return served(scope_a, ["The spare key is under the blue flowerpot."])


def test_no_hostile_field_value_gets_a_500(world, operator, api_client_for):
    client = api_client_for(operator)
    before = (AnswerRecord.objects.count(), EvaluationCase.objects.count(), CartridgeVersion.objects.count(),
              KvConfiguration.objects.count())
    checked = 0
    for url, fields in ROUTES.items():
        for field in fields:
            for value in HOSTILE:
                body = {**VALID[url], field: value}
                response = client.post(url, data=json.dumps(body), content_type="application/json")
                assert response.status_code < 500, (url, field, value, response.content[:300])
                if response.status_code >= 400:
                    assert set(response.json()) == {"code", "message", "extra"}, (url, field, value)
                checked += 1
    assert checked == len(HOSTILE) * sum(len(f) for f in ROUTES.values())
    # odd-looking but valid text is stored as text (and only that); no configuration was switched
    odd_text = {"' OR 1=1 --", "<script>alert(1)</script>", "../../etc/passwd"}
    from cartridges.selectors import evaluation_case_open

    assert {evaluation_case_open(case=c).question for c in EvaluationCase.objects.all()} == odd_text and before[1] == 0
    assert KvConfiguration.objects.count() == before[3] == 0


@pytest.mark.parametrize("raw", [b"{", b"\xff\xfe", b'{"question": "a"', b"1" * 10_000, b'{"question": "x"}' * 3])
def test_malformed_bodies_are_400s(world, alice, api_client_for, raw):
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", data=raw, content_type="application/json")
    assert response.status_code == 400 and set(response.json()) == {"code", "message", "extra"}


def test_other_methods_are_405s(world, alice, api_client_for):
    client = api_client_for(alice)
    assert client.get("/api/v1/scopes/scope-a/ask/").status_code == 405
    assert client.delete(f"/api/v1/scopes/scope-a/cartridges/{world.pk}/").status_code == 405
    assert client.put("/api/v1/kv/metrics", {}).status_code == 405
    assert CartridgeActivation.objects.count() == 1


def test_asking_runs_a_bounded_number_of_queries(world, alice, api_client_for, django_assert_max_num_queries):
    client = api_client_for(alice)
    client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")  # warm the LRU
    with django_assert_max_num_queries(13):  # 13: the scope's head, which tells whether memories follow the version
        response = client.post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
    assert response.status_code == 200
