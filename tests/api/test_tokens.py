"""API tokens are stored hashed (django-rest-knox), legacy plaintext tokens are converted by a migration and
keep working, tokens do not expire silently, and the OpenAPI schema and docs need a login."""
from __future__ import annotations

import importlib

import pytest
from django.db import connection
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _token_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        return cursor.fetchall()


def _client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_the_stored_token_row_never_holds_the_secret(alice):
    from knox.models import AuthToken

    instance, secret = AuthToken.objects.create(user=alice)
    assert _client(secret).get("/api/v1/scopes/").status_code == 200
    rows = _token_rows()
    assert len(rows) == 1
    stored = " ".join(str(value) for value in rows[0])
    assert secret not in stored and secret[len(instance.token_key):] not in stored  # only the lookup prefix is kept
    assert instance.expiry is None  # API clients' tokens do not expire silently


def test_a_wrong_or_revoked_token_is_refused(alice):
    from knox.models import AuthToken

    instance, secret = AuthToken.objects.create(user=alice)
    wrong = secret[:-1] + ("0" if secret[-1] != "0" else "1")
    assert _client(wrong).get("/api/v1/scopes/").status_code == 401
    assert _client("not-a-token").get("/api/v1/scopes/").status_code == 401
    instance.delete()
    assert _client(secret).get("/api/v1/scopes/").status_code == 401


def test_a_legacy_plaintext_token_keeps_working_after_the_migration(alice, charlie):
    from django.db.migrations.loader import MigrationLoader
    from rest_framework.authtoken.models import Token

    migration = importlib.import_module("memories.migrations.0003_api_tokens_hashed")
    # the historical models the migration sees when it runs (the state just before it)
    apps = MigrationLoader(connection).project_state(migration.Migration.dependencies).apps
    legacy = [Token.objects.create(user=alice), Token.objects.create(user=charlie)]
    keys = [t.key for t in legacy]
    assert all(len(k) == 40 for k in keys)
    migration.tokens_hash(apps, None)
    assert not Token.objects.exists()  # the plaintext rows are gone
    stored = " ".join(str(value) for row in _token_rows() for value in row)
    assert len(_token_rows()) == 2 and not any(k in stored for k in keys)
    alice_scopes = _client(keys[0]).get("/api/v1/scopes/")
    assert alice_scopes.status_code == 200 and [s["name"] for s in alice_scopes.json()] == ["scope-a"]
    assert [s["name"] for s in _client(keys[1]).get("/api/v1/scopes/").json()] == ["scope-c"]
    migration.tokens_hash(apps, None)  # a second run finds nothing to convert
    assert len(_token_rows()) == 2


@pytest.mark.parametrize("url", ["/api/schema/", "/api/schema/?format=json", "/api/docs/"])
def test_the_schema_and_docs_need_a_login(url, alice, api_client_for, client):
    anonymous = APIClient().get(url)
    assert anonymous.status_code in (401, 403), (url, anonymous.status_code)
    assert b"/api/scopes/" not in anonymous.content
    assert api_client_for(alice).get(url).status_code == 200
    client.force_login(alice)  # the browsable docs with a session
    assert client.get(url).status_code == 200


def test_the_token_command_prints_a_token_that_works_once_and_stores_its_digest(alice):
    import io

    from django.core.management import CommandError, call_command

    out = io.StringIO()
    call_command("api_token_create", "alice", stdout=out)
    key = out.getvalue().strip()
    assert len(key) == 64 and _client(key).get("/api/v1/scopes/").status_code == 200
    assert key not in " ".join(str(value) for row in _token_rows() for value in row)
    with pytest.raises(CommandError, match="`username` 'nobody' does not exist"):
        call_command("api_token_create", "nobody")
