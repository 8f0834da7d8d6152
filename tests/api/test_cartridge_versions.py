"""GET /api/v1/scopes/<scope>/cartridges/ and /<id>/: versions with derived state and their history, scoped."""
from __future__ import annotations

import pytest

from cartridges.services import cartridge_activate, cartridge_compile, cartridge_evaluate
from tests.support.blobs import tamper
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db


def test_it_lists_versions_newest_first_with_state_and_history(alice, scope_a, served, append, api_client_for):
    v1 = served(scope_a, ["The spare key is under the blue flowerpot."])
    append(scope_a, "Ada drinks green tea.")
    v2 = cartridge_compile(scope=scope_a, actor=alice)
    tamper(v2)
    cartridge_evaluate(version=v2, actor=alice)
    response = api_client_for(alice).get("/api/v1/scopes/scope-a/cartridges/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 2 and body["active_version"] == v1.pk
    newest, oldest = body["results"]
    assert (newest["id"], newest["state"], oldest["id"], oldest["state"]) == (v2.pk, "failed", v1.pk, "active")
    assert newest["supersedes"] == v1.pk and newest["created_by"] == "alice"
    assert [e["event"] for e in oldest["history"]] == ["compiled", "evaluated", "activated"]
    evaluated = newest["history"][-1]
    assert evaluated["event"] == "evaluated" and evaluated["passed"] is False and evaluated["actor"] == "alice"
    assert any("sha256" in r for r in evaluated["reasons"])
    assert newest["key"]["backend"] == "fake" and newest["log_head"] == 2 and newest["size_bytes"] > 0
    assert "manifest" not in newest


def test_it_shows_one_version_with_its_manifest(alice, scope_a, served, api_client_for):
    version = served(scope_a, ["Ada drinks green tea."], subject="ada")
    body = api_client_for(alice).get(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/").json()
    assert body["id"] == version.pk and body["state"] == "active"
    assert body["manifest"]["entries"] == [[1, "ada"]] and body["manifest_digest"] == version.manifest_digest
    assert "green tea" not in str(body)  # seqs and subject ids only, never memory text


def test_it_pages_versions(alice, scope_a, append, api_client_for):
    for i in range(3):
        append(scope_a, f"Memory number {i} about tea.")
        cartridge_compile(scope=scope_a)
    body = api_client_for(alice).get("/api/v1/scopes/scope-a/cartridges/?limit=2").json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]


def test_it_answers_404_naming_the_version_for_an_unknown_or_foreign_id(
    alice, charlie, scope_a, scope_c, served, api_client_for
):
    foreign = served(scope_c, ["Miso the cat sleeps on the piano."])
    client = api_client_for(alice)
    assert_error(client.get("/api/v1/scopes/scope-a/cartridges/999999/"), 404, "version")
    assert_error(client.get(f"/api/v1/scopes/scope-a/cartridges/{foreign.pk}/"), 404, "version")
    assert client.get("/api/v1/scopes/scope-a/cartridges/abc/").status_code == 404


def test_another_scopes_client_cannot_read_versions(alice, charlie, scope_a, served, api_client_for):
    version = served(scope_a, ["The spare key is under the blue flowerpot."])
    client = api_client_for(charlie)
    assert_error(client.get("/api/v1/scopes/scope-a/cartridges/"), 404, "scope")
    assert_error(client.get(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/"), 404, "scope")


def test_a_staff_user_without_a_grant_cannot_read_a_scope_over_the_api(operator, scope_a, served, api_client_for):
    served(scope_a, ["The spare key is under the blue flowerpot."])
    assert_error(api_client_for(operator).get("/api/v1/scopes/scope-a/cartridges/"), 404, "scope")


def test_rollback_reactivates_the_previous_version_through_the_gate(alice, scope_a, served, append, api_client_for):
    v1 = served(scope_a, ["The spare key is under the blue flowerpot."])
    append(scope_a, "Ada drinks green tea.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v2)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/rollback/", {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["version_id"] == v1.pk and body["kind"] == "rollback" and body["actor"] == "alice"


def test_rollback_refuses_with_nothing_to_roll_back_to_and_rejects_fields(
    alice, charlie, scope_a, served, api_client_for
):
    served(scope_a, ["The spare key is under the blue flowerpot."])
    client = api_client_for(alice)
    assert_error(client.post("/api/v1/scopes/scope-a/cartridges/rollback/", {}, format="json"), 409, "scope")
    assert_error(client.post("/api/v1/scopes/scope-a/cartridges/rollback/", {"to": 1}, format="json"), 400, "to")
    assert_error(
        api_client_for(charlie).post("/api/v1/scopes/scope-a/cartridges/rollback/", {}, format="json"), 404, "scope"
    )


def test_rollback_to_a_version_pruned_by_retention_is_refused_with_its_code(alice, scope_a, served, append, api_client_for):
    from cartridges.services.scope_settings import scope_settings_update

    served(scope_a, ["The spare key is under the blue flowerpot."])
    scope_settings_update(scope=scope_a, actor=None, keep_previous_versions=0)
    append(scope_a, "Ada drinks green tea.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))  # prunes the first version
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/rollback/", {}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "version_pruned"
    assert "keep_previous_versions=0" in response.json()["message"]
