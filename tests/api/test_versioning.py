"""The API under /api/v1/: the unversioned /api/ paths are a deprecated alias of the same
views (they answer the same and say so in headers), every route is under both, plain URL names reverse to
v1, and the schema documents v1 only, keeping the operationIds clients were generated with."""
from __future__ import annotations

import pytest
from django.urls import get_resolver, reverse

pytestmark = pytest.mark.django_db


def test_v1_and_the_alias_answer_the_same_and_the_alias_says_it_is_deprecated(alice, scope_a, append, api_client_for):
    append(scope_a, "The spare key is under the flowerpot.")
    client = api_client_for(alice)
    v1 = client.get("/api/v1/scopes/scope-a/memories/")
    alias = client.get("/api/scopes/scope-a/memories/")
    assert v1.status_code == alias.status_code == 200
    assert v1.json()["results"] == alias.json()["results"]
    assert "Deprecation" not in v1 and "Link" not in v1
    assert alias["Deprecation"] == "true"
    assert alias["Link"] == '</api/v1/scopes/scope-a/memories/>; rel="successor-version"'
    # writes too, and errors: the same views
    appended = client.post("/api/scopes/scope-a/memories/", data={"content": "Lunch is at noon."}, format="json")
    assert appended.status_code == 201 and appended["Deprecation"] == "true"
    refused = client.post("/api/scopes/scope-a/search/", data={"query": ""}, format="json")
    assert refused.status_code == 400 and refused["Deprecation"] == "true"


def test_every_api_route_is_served_under_v1_and_the_alias():
    from tests.support.endpoints import all_routes

    routes = {r.route for r in all_routes()}
    api = {r.route[len("api/"):] for r in all_routes() if r.route.startswith("api/") and not r.route.startswith("api/v1/")}
    api -= {"schema/", "docs/", "redoc/"}  # the documentation pages, not API routes
    v1 = {r.route[len("api/v1/"):] for r in all_routes() if r.route.startswith("api/v1/")}
    assert api == v1 and len(v1) >= 20, (sorted(api ^ v1), len(v1))
    assert "api/v1/scopes/<str:scope>/search/" in routes and "api/scopes/<str:scope>/search/" in routes
    # both mounts include the one list of routes (mnesio_site.api_urls): a route added later is under both
    assert sum(1 for p in get_resolver().url_patterns if getattr(p, "urlconf_name", None) is not None
               and getattr(p.urlconf_name, "__name__", "") == "mnesio_site.api_urls") == 2


def test_plain_names_reverse_to_v1_and_the_namespace_to_the_alias():
    assert reverse("scope-memories", kwargs={"scope": "s"}) == "/api/v1/scopes/s/memories/"
    assert reverse("api-unversioned:scope-memories", kwargs={"scope": "s"}) == "/api/scopes/s/memories/"
    assert reverse("kv-configuration") == "/api/v1/kv/configuration/"


def test_the_schema_documents_v1_only_with_the_operation_ids_clients_know(alice, api_client_for):
    schema = api_client_for(alice).get("/api/schema/?format=json").json()
    paths = set(schema["paths"])
    api_paths = {p for p in paths if p.startswith("/api/")}
    assert api_paths and all(p.startswith("/api/v1/") for p in api_paths), sorted(api_paths)
    for path in ("/api/v1/scopes/{scope}/search/", "/api/v1/scopes/", "/api/v1/scopes/{scope}/grants/",
                 "/api/v1/scopes/{scope}/grants/{username}/", "/api/v1/scopes/{scope}/settings/"):
        assert path in paths, path
    ids = [op["operationId"] for ops in schema["paths"].values() for op in ops.values() if isinstance(op, dict)
           and "operationId" in op]
    assert len(ids) == len(set(ids))
    assert "api_scopes_memories_create" in ids and "api_scopes_search_create" in ids
    assert not any(i.startswith("api_v1_") for i in ids)
    assert "/api/v1/" in schema["info"]["description"] and "deprecated" in schema["info"]["description"]
    # the new endpoints are documented through their serializers
    search = schema["paths"]["/api/v1/scopes/{scope}/search/"]["post"]
    body = search["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(schema["components"]["schemas"][body]["properties"]) == {
        "query", "top_k", "subject", "since", "until", "as_of", "metadata"}
    settings = schema["paths"]["/api/v1/scopes/{scope}/settings/"]
    assert set(settings) >= {"get", "patch"}
