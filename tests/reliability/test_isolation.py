"""The full matrix endpoint x foreign-scope client: every route of the project, enumerated from the URL
resolver (tests/support/endpoints.py), refuses a client that is not granted the scope."""
from __future__ import annotations

import json

import pytest

from tests.support.endpoints import UNSCOPED_API, all_routes, classify
from tests.support.isolation import BODIES, MARKER

pytestmark = pytest.mark.django_db

def _ids(route, world, scope: str) -> dict[str, object]:
    values: dict[str, object] = {"scope": scope}
    if "seq" in route.params:
        values["seq"] = world["seq"]
    if "pk" in route.params:
        values["pk"] = {"erasure-request-detail": world["pk_erasure"], "answer-request": world.get("pk_answer")}.get(
            route.name, world["pk_version"])
    if "username" in route.params:
        values["username"] = "alice"
    return values


def _call(client, method: str, url: str, body: dict | None):
    if method == "get":
        return client.get(url)
    return getattr(client, method)(url, data=json.dumps(body or {}), content_type="application/json")


def test_every_route_is_in_the_matrix():
    routes = all_routes()
    kinds = {r.route: classify(r) for r in routes}  # raises for a route nobody classified
    scoped = sorted(r for r, k in kinds.items() if k == "scoped-api")
    assert len(scoped) >= 12, scoped
    assert set(UNSCOPED_API) <= set(kinds), sorted(set(UNSCOPED_API) - set(kinds))


def _fresh_answer(alice, world) -> int:
    from cartridges.services import answer_request_answer, answer_request_file
    from memories.models import Scope

    scope_a = Scope.objects.get(name="scope-a")
    return answer_request_answer(answer_request=answer_request_file(scope=scope_a, question="Where is the key?", actor=alice)).pk


def test_every_scoped_endpoint_refuses_a_client_of_another_scope(world, charlie, alice, api_client_for, record_figures):
    foreign, owner = api_client_for(charlie), api_client_for(alice)
    refused, cells = 0, []
    for route in all_routes():
        if classify(route) != "scoped-api":
            continue
        for method in route.methods:
            url = route.url(**_ids(route, world, "scope-a"))
            response = _call(foreign, method, url, BODIES.get(route.name))
            cells.append(f"{method.upper()} {route.route}: {response.status_code}")
            assert response.status_code == 404, (method, url, response.status_code, response.content[:300])
            body = response.json()
            assert "scope" in body["message"] and MARKER not in response.content.decode()
            refused += 1
            # an unknown scope answers exactly the same (status and message): no probing for scope names
            unknown = _call(foreign, method, route.url(**_ids(route, world, "no-such-scope")), BODIES.get(route.name))
            assert unknown.status_code == 404, (method, route.route, unknown.status_code)
            assert unknown.json()["message"].replace("no-such-scope", "scope-a") == body["message"], (route.route,)
            if method == "get":  # the owner reaches the same view (the 404 is the grant, not the routing)
                if route.name == "answer-request":  # an answer is collected once: each mount gets one of its own
                    url = route.url(**{**_ids(route, world, "scope-a"), "pk": _fresh_answer(alice, world)})
                assert owner.get(url).status_code == 200, (url, owner.get(url).content[:300])
    record_figures(scenario="isolation matrix", num_cells_refused=refused)
    assert refused >= 16, cells


def test_ids_of_another_scope_are_not_found_through_the_clients_own_scope(world, charlie, api_client_for):
    client = api_client_for(charlie)
    checked = 0
    for route in all_routes():
        if classify(route) != "scoped-api" or not ({"pk", "seq"} & set(route.params)):
            continue
        for method in route.methods:
            url = route.url(**_ids(route, world, "scope-c"))
            response = _call(client, method, url, BODIES.get(route.name))
            assert response.status_code == 404, (method, url, response.status_code, response.content[:300])
            assert MARKER not in response.content.decode()
            checked += 1
    assert checked >= 5
    # an erasure filed through one's own scope for a subject of another scope is refused too
    response = client.post(
        "/api/v1/scopes/scope-c/erasure-requests/", data={"subject": "dana", "reason": "x"}, format="json"
    )
    assert response.status_code == 404 and "subject" in response.json()["message"]


def test_unscoped_endpoints_show_a_client_only_its_own_scopes(world, charlie, api_client_for):
    client = api_client_for(charlie)
    assert [s["name"] for s in client.get("/api/v1/scopes/").json()] == ["scope-c"]
    for url in ("/api/v1/kv/metrics", "/api/v1/kv/metrics/", "/api/v1/kv/metrics?format=prometheus", "/api/v1/kv/configuration/"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        text = response.content.decode()
        assert "scope-a" not in text and MARKER not in text, url
    switch = {"backend": "fake", "model": "fake-model", "dtype": "f32", "quant": "none"}
    assert client.post("/api/v1/kv/configuration/", data=switch, format="json").status_code == 403
    schema = client.get("/api/schema/")
    assert schema.status_code == 200 and MARKER not in schema.content.decode()


def test_the_prometheus_page_shows_a_client_only_its_own_scopes(world, charlie, api_client_for):
    response = api_client_for(charlie).get("/metrics")
    assert response.status_code == 200, response.status_code
    text = response.content.decode()
    assert "scope-c" in text and "scope-a" not in text and MARKER not in text


def test_the_admin_and_dashboard_refuse_a_non_staff_client(world, charlie, client):
    client.force_login(charlie)
    checked = 0
    values = {"object_id": 1, "content_type_id": 1, "id": 1, "app_label": "memories", "url": "nowhere/"}
    for route in all_routes():
        if classify(route) != "admin" and route.route != "dashboard/":
            continue
        if route.route == "admin/logout/":
            continue  # logging out is allowed to anyone and would end this session
        url = route.url(**{p: values[p] for p in route.params})
        response = client.get(url)
        if route.route == "admin/login/":
            assert response.status_code == 200 and b"<form" in response.content  # the login form, nothing else
            continue
        assert response.status_code in (302, 403, 404), (url, response.status_code)
        if response.status_code == 302:
            assert "/login/" in response["Location"], (url, response["Location"])
        assert MARKER not in response.content.decode(errors="replace")
        checked += 1
    assert checked >= 20
