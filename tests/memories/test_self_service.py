"""Self-service onboarding, tried as a hostile tenant would: one auth scheme on every surface, a user's own tokens
(limited to some scopes, expiring), invitations by operators, a creator granted their scope, one name for a
memory's text."""
from __future__ import annotations

import datetime as dt

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from memories.services import api_token_create, memory_append

pytestmark = pytest.mark.django_db


def _client(key: str, scheme: str = "Bearer") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {key}")
    return client


@pytest.fixture
def alice_key(alice):
    return api_token_create(user=alice, name="laptop")[1]


@pytest.mark.parametrize("scheme", ["Token", "Bearer", "bearer"])
def test_it_accepts_both_schemes_on_the_api_and_the_openai_surface(alice_key, scheme):
    client = _client(alice_key, scheme)
    assert client.get("/api/v1/scopes/").json()[0]["name"] == "scope-a"
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["scope-a"]


def test_it_refuses_a_bad_token_on_both_surfaces(db):
    assert _client("0" * 64).get("/api/v1/scopes/").json()["code"] == "authentication_failed"
    assert _client("0" * 64, "Token").get("/v1/models").status_code == 401


def test_it_creates_lists_and_revokes_own_tokens(alice, alice_key):
    client = _client(alice_key)
    r = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["scope-a"]}, format="json")
    assert r.status_code == 201, r.json()
    made = r.json()
    assert made["scopes"] == ["scope-a"] and made["name"] == "ci" and len(made["token"]) >= 64
    days = (dt.datetime.fromisoformat(made["expires_at"]) - timezone.now()).days
    assert 88 <= days <= 90  # the default lifetime
    listed = client.get("/api/v1/tokens/").json()
    assert [t["name"] for t in listed] == ["laptop", "ci"] and all("token" not in t for t in listed)
    assert _client(made["token"]).get("/api/v1/scopes/scope-a/head/").status_code == 200
    assert client.delete(f"/api/v1/tokens/{made['id']}/").status_code == 204
    assert _client(made["token"]).get("/api/v1/scopes/scope-a/head/").json()["code"] == "authentication_failed"
    assert [t["name"] for t in client.get("/api/v1/tokens/").json()] == ["laptop"]


def test_it_answers_404_for_another_users_token_id(alice_key, charlie):
    _, charlies_key = api_token_create(user=charlie)
    charlies_id = _client(charlies_key).get("/api/v1/tokens/").json()[0]["id"]
    r = _client(alice_key).delete(f"/api/v1/tokens/{charlies_id}/")
    assert r.status_code == 404 and r.json()["extra"]["field"] == "token"
    assert _client(charlies_key).get("/api/v1/scopes/").status_code == 200  # still alive
    assert _client(alice_key).delete("/api/v1/tokens/not-an-id/").status_code == 404


def test_it_refuses_a_token_limited_to_a_scope_it_is_not_granted(alice_key):
    r = _client(alice_key).post("/api/v1/tokens/", {"scopes": ["scope-a", "scope-c"]}, format="json")
    assert r.status_code == 404 and r.json()["extra"]["field"] == "scopes[1]"


def test_it_keeps_a_token_limited_to_scope_a_out_of_scope_b(alice, alice_key, scope_c):
    from memories.services import scope_create, scope_grant

    scope_b = scope_create(name="scope-b")
    scope_grant(scope=scope_b, user=alice)
    memory_append(scope=scope_b, content="B's secret")
    limited = _client(alice_key).post("/api/v1/tokens/", {"scopes": ["scope-a"]}, format="json").json()["token"]
    client = _client(limited)
    assert client.get("/api/v1/scopes/scope-a/memories/").status_code == 200
    r = client.get("/api/v1/scopes/scope-b/memories/")
    assert r.status_code == 404 and r.json()["extra"]["field"] == "scope"
    assert client.post("/api/v1/scopes/scope-b/search/", {"query": "secret"}, format="json").status_code == 404
    assert [s["name"] for s in client.get("/api/v1/scopes/").json()] == ["scope-a"]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["scope-a"]
    # the unlimited token still reaches both
    assert len(_client(alice_key).get("/api/v1/scopes/").json()) == 2


def test_it_lets_a_limited_token_manage_no_tokens(alice_key):
    limited = _client(alice_key).post("/api/v1/tokens/", {"scopes": ["scope-a"]}, format="json").json()["token"]
    client = _client(limited)
    assert client.post("/api/v1/tokens/", {}, format="json").status_code == 403  # no wider token minted
    assert client.get("/api/v1/tokens/").status_code == 403
    first = _client(alice_key).get("/api/v1/tokens/").json()[0]["id"]
    assert client.delete(f"/api/v1/tokens/{first}/").status_code == 403


def test_it_refuses_an_expired_token(alice, alice_key):
    token, key = api_token_create(user=alice, expires_at=timezone.now() + dt.timedelta(days=1))
    type(token).objects.filter(pk=token.pk).update(expiry=timezone.now() - dt.timedelta(seconds=1))
    r = _client(key).get("/api/v1/scopes/")
    assert r.status_code == 401 and r.json()["code"] == "authentication_failed"
    assert len(_client(alice_key).get("/api/v1/tokens/").json()) == 1  # the expired one is gone


def test_it_refuses_an_expiry_past_the_longest_lifetime(alice_key):
    too_late = (timezone.now() + dt.timedelta(days=400)).isoformat()
    r = _client(alice_key).post("/api/v1/tokens/", {"expires_at": too_late}, format="json")
    assert r.status_code == 400 and r.json()["extra"]["field"] == "expires_at"
    past = (timezone.now() - dt.timedelta(days=1)).isoformat()
    assert _client(alice_key).post("/api/v1/tokens/", {"expires_at": past}, format="json").status_code == 400


def test_it_invites_a_user_by_command(scope_a, capsys):
    call_command("user_invite", "dora", "--scope", "scope-a")
    key = capsys.readouterr().out.strip()
    client = _client(key)
    assert [s["name"] for s in client.get("/api/v1/scopes/").json()] == ["scope-a"]
    assert client.post("/api/v1/tokens/", {"name": "mine"}, format="json").status_code == 201


def test_it_invites_a_user_by_api_for_staff_with_the_permissions(operator, alice_key, scope_a):
    from django.contrib.auth.models import Permission

    body = {"username": "dora", "scopes": ["scope-a"]}
    assert _client(alice_key).post("/api/v1/users/", body, format="json").status_code == 403  # not staff
    _, op_key = api_token_create(user=operator)
    r = _client(op_key).post("/api/v1/users/", body, format="json")
    assert r.status_code == 403 and r.json()["extra"]["permission"] == "auth.add_user"
    operator.user_permissions.add(Permission.objects.get(codename="add_user"),
                                  Permission.objects.get(codename="add_scopegrant"))
    r = _client(op_key).post("/api/v1/users/", body, format="json")  # the answer's token would read scope-a
    assert r.status_code == 403 and r.json()["extra"]["permission"] == "memories.grant_scope_to_self"
    operator.user_permissions.add(Permission.objects.get(codename="grant_scope_to_self"))
    operator = type(operator).objects.get(pk=operator.pk)  # a fresh permission cache
    r = _client(op_key).post("/api/v1/users/", body, format="json")
    assert r.status_code == 201, r.json()
    assert _client(r.json()["token"]["token"]).get("/api/v1/scopes/scope-a/head/").status_code == 200
    again = _client(op_key).post("/api/v1/users/", body, format="json")
    assert again.status_code == 409 and again.json()["extra"]["field"] == "username"


def test_it_grants_a_new_scope_to_its_creator(operator):
    from django.contrib.auth.models import Permission

    from memories.models import ScopeGrantEvent

    operator.user_permissions.add(Permission.objects.get(codename="add_scope"))
    _, key = api_token_create(user=operator)
    client = _client(key)
    assert client.post("/api/v1/scopes/", {"name": "fresh"}, format="json").status_code == 201
    assert client.post("/api/v1/scopes/fresh/memories/", {"content": "first"}, format="json").status_code == 201
    event = ScopeGrantEvent.objects.get(scope_name="fresh")
    assert event.to_self and event.action == "granted"


def test_it_names_a_memorys_text_content_everywhere_with_text_as_alias(alice_key, scope_a):
    client = _client(alice_key)
    made = client.post("/api/v1/scopes/scope-a/memories/", {"content": "Lena has a dog"}, format="json").json()
    assert made["content"] == made["text"] == "Lena has a dog"
    listed = client.get("/api/v1/scopes/scope-a/memories/").json()["results"][0]
    assert listed["content"] == listed["text"] == "Lena has a dog"
    got = client.get(f"/api/v1/scopes/scope-a/memories/{made['seq']}/").json()
    assert got["content"] == "Lena has a dog"
    found = client.post("/api/v1/scopes/scope-a/search/", {"query": "dog"}, format="json").json()["results"][0]
    assert found["content"] == "Lena has a dog"


def test_it_keeps_a_limited_staff_token_to_its_scopes_for_staff_actions(operator, scope_a, scope_c, charlie):
    from django.contrib.auth.models import Permission

    from memories.models import ScopeGrant
    from memories.services import scope_grant

    operator.user_permissions.add(Permission.objects.get(codename="add_scopegrant"),
                                  Permission.objects.get(codename="grant_scope_to_self"))
    scope_grant(scope=scope_a, user=operator, actor=operator)
    _, key = api_token_create(user=operator, scopes=["scope-a"])
    r = _client(key).post("/api/v1/scopes/scope-c/grants/", {"user": "charlie"}, format="json")
    assert r.status_code == 404 and r.json()["extra"]["field"] == "scope"
    assert _client(key).post("/api/v1/scopes/scope-a/grants/", {"user": "charlie"}, format="json").status_code == 201
    assert ScopeGrant.objects.filter(user=charlie).count() == 2
