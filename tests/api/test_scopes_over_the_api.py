"""Scopes over the API: staff with Django permissions create scopes and grant or revoke a
client's use of them; per-scope cartridge settings are readable by the scope's clients and changed only by staff
holding `cartridges.change_scope_settings`. Clients and view-only staff get a 403; no one learns of scopes
they are not granted."""
from __future__ import annotations

import pytest

from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

VIEW_ONLY = ["memories.view_scope", "memories.view_scopegrant", "cartridges.view_scopesettings"]


@pytest.fixture
def staff_with(db):
    """Factory: staff_with("name", "app.codename", ...) -> a staff user holding exactly those permissions."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    def make(username: str, *perms: str):
        user = get_user_model().objects.create_user(username=username, password="x-" + username, is_staff=True)
        for dotted in perms:
            app_label, codename = dotted.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return user

    return make


@pytest.fixture
def dave(db):
    """A client with no grant yet."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username="dave", password="x-dave")


def _names(client) -> list[str]:
    return [scope["name"] for scope in client.get("/api/v1/scopes/").json()]


# --- create -------------------------------------------------------------------------------------------
def test_staff_with_add_scope_creates_a_scope(staff_with, api_client_for):
    from memories.models import Scope

    client = api_client_for(staff_with("sam", "memories.add_scope"))
    response = client.post("/api/v1/scopes/", data={"name": "agent-7", "description": "the support bot"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "agent-7" and response.json()["description"] == "the support bot"
    assert Scope.objects.filter(name="agent-7").exists()
    assert _names(client) == ["agent-7"]  # its creator is granted it (and nobody else)
    assert_error(client.post("/api/v1/scopes/", data={"name": "agent-7"}, format="json"), 409, "name")
    for bad in ("has spaces", "", "x" * 101, "a/b"):
        assert_error(client.post("/api/v1/scopes/", data={"name": bad}, format="json"), 400, "name")
    assert_error(client.post("/api/v1/scopes/", data={"name": "ok", "owner": "sam"}, format="json"), 400, "owner")


def test_a_client_or_view_only_staff_cannot_create_a_scope(alice, staff_with, api_client_for):
    from memories.models import Scope

    for user in (alice, staff_with("vera", *VIEW_ONLY), staff_with("gus", "memories.add_scopegrant")):
        body = assert_error(api_client_for(user).post("/api/v1/scopes/", data={"name": "mine"}, format="json"), 403)
        assert "memories.add_scope" in body["message"]
    assert not Scope.objects.filter(name="mine").exists()


# --- grant and revoke -------------------------------------------------------------------------------
def test_staff_grant_a_client_a_scope_and_revoke_it(scope_a, dave, append, staff_with, api_client_for):
    append(scope_a, "The spare key is under the flowerpot.")
    staff = api_client_for(staff_with("sam", "memories.add_scopegrant", "memories.delete_scopegrant"))
    client = api_client_for(dave)
    assert client.get("/api/v1/scopes/scope-a/memories/").status_code == 404
    response = staff.post("/api/v1/scopes/scope-a/grants/", data={"user": "dave"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["scope"] == "scope-a" and response.json()["user"] == "dave"
    assert staff.post("/api/v1/scopes/scope-a/grants/", data={"user": "dave"}, format="json").status_code == 200
    assert _names(client) == ["scope-a"]
    assert client.get("/api/v1/scopes/scope-a/memories/").json()["count"] == 1
    # revoke: the same token stops reaching the scope at once
    assert staff.delete("/api/v1/scopes/scope-a/grants/dave/").status_code == 204
    assert _names(client) == []
    assert_error(client.get("/api/v1/scopes/scope-a/memories/"), 404, "scope")
    assert_error(staff.delete("/api/v1/scopes/scope-a/grants/dave/"), 404, "user")


def test_a_grant_names_an_unknown_user_or_scope(staff_with, scope_a, api_client_for):
    staff = api_client_for(staff_with("sam", "memories.add_scopegrant", "memories.delete_scopegrant"))
    assert_error(staff.post("/api/v1/scopes/scope-a/grants/", data={"user": "nobody"}, format="json"), 404, "user")
    assert_error(staff.post("/api/v1/scopes/scope-a/grants/", data={}, format="json"), 400, "user")
    assert_error(staff.post("/api/v1/scopes/scope-a/grants/", data={"user": 5}, format="json"), 400, "user")
    assert_error(staff.post("/api/v1/scopes/no-such/grants/", data={"user": "sam"}, format="json"), 404, "scope")
    assert_error(staff.delete("/api/v1/scopes/scope-a/grants/nobody/"), 404, "user")


def test_clients_and_view_only_staff_cannot_grant_or_revoke(alice, bob, charlie, dave, staff_with, api_client_for):
    from memories.models import ScopeGrant

    before = set(ScopeGrant.objects.values_list("scope__name", "user__username"))
    grant_only = staff_with("gus", "memories.add_scopegrant")
    for user in (alice, staff_with("vera", *VIEW_ONLY), staff_with("rita", "memories.delete_scopegrant")):
        client = api_client_for(user)
        body = assert_error(client.post("/api/v1/scopes/scope-a/grants/", data={"user": "dave"}, format="json"), 403)
        assert "memories.add_scopegrant" in body["message"]
    for user in (alice, staff_with("walt", *VIEW_ONLY), grant_only):
        body = assert_error(api_client_for(user).delete("/api/v1/scopes/scope-a/grants/bob/"), 403)
        assert "memories.delete_scopegrant" in body["message"]
    # a client of another scope learns nothing: the same 404 as a scope that does not exist
    foreign = assert_error(api_client_for(charlie).post("/api/v1/scopes/scope-a/grants/", data={"user": "charlie"},
                                                        format="json"), 404, "scope")
    unknown = assert_error(api_client_for(charlie).post("/api/v1/scopes/no-such/grants/", data={"user": "charlie"},
                                                        format="json"), 404, "scope")
    assert foreign["message"] == unknown["message"].replace("no-such", "scope-a")
    assert set(ScopeGrant.objects.values_list("scope__name", "user__username")) == before


def test_the_scope_list_shows_only_the_callers_grants(alice, charlie, staff_with, api_client_for):
    assert _names(api_client_for(alice)) == ["scope-a"]
    assert _names(api_client_for(charlie)) == ["scope-c"]
    assert _names(api_client_for(staff_with("sam", "memories.add_scope", "memories.view_scope"))) == []


# --- settings ------------------------------------------------------------------------------------------
def test_a_scopes_clients_read_its_settings_defaults_first(alice, api_client_for, settings):
    settings.MNESIO_DEFAULT_AUTO_REFRESH = "on_append"  # the production default (tests/settings.py makes it manual)
    body = api_client_for(alice).get("/api/v1/scopes/scope-a/settings/").json()
    assert body == {"scope": "scope-a", "auto_refresh": "on_append", "auto_refresh_debounce_s": 2,
                    "keep_previous_versions": 3, "layout": "auto", "updated_at": None, "updated_by": None}


def test_staff_with_the_permission_change_settings_and_clients_see_them(alice, bob, staff_with, api_client_for):
    from cartridges.models import ScopeSettings

    staff = api_client_for(staff_with("sam", "cartridges.change_scope_settings"))
    response = staff.patch("/api/v1/scopes/scope-a/settings/",
                           data={"auto_refresh": "on_append", "auto_refresh_debounce_s": 30}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["auto_refresh"] == "on_append" and response.json()["updated_by"] == "sam"
    # a partial change keeps the other fields
    staff.patch("/api/v1/scopes/scope-a/settings/", data={"keep_previous_versions": 5}, format="json")
    body = api_client_for(bob).get("/api/v1/scopes/scope-a/settings/").json()
    assert (body["auto_refresh"], body["auto_refresh_debounce_s"], body["keep_previous_versions"]) == ("on_append", 30, 5)
    staff.patch("/api/v1/scopes/scope-a/settings/", data={"keep_previous_versions": None}, format="json")
    assert api_client_for(alice).get("/api/v1/scopes/scope-a/settings/").json()["keep_previous_versions"] is None
    # every change is its own row: the history of who set what is kept
    rows = list(ScopeSettings.objects.filter(scope__name="scope-a").order_by("id"))
    assert [(r.auto_refresh, r.keep_previous_versions) for r in rows] == [("on_append", 3), ("on_append", 5),
                                                                          ("on_append", None)]


def test_clients_and_view_only_staff_cannot_change_settings(alice, charlie, staff_with, api_client_for, settings):
    settings.MNESIO_DEFAULT_AUTO_REFRESH = "on_append"  # the production default (tests/settings.py makes it manual)
    from cartridges.models import ScopeSettings

    change = {"auto_refresh": "manual"}
    viewer = staff_with("vera", *VIEW_ONLY)
    for user in (alice, viewer):
        body = assert_error(api_client_for(user).patch("/api/v1/scopes/scope-a/settings/", data=change, format="json"), 403)
        assert "cartridges.change_scope_settings" in body["message"]
    assert_error(api_client_for(charlie).patch("/api/v1/scopes/scope-a/settings/", data=change, format="json"), 404, "scope")
    assert_error(api_client_for(charlie).get("/api/v1/scopes/scope-a/settings/"), 404, "scope")
    assert not ScopeSettings.objects.exists()
    # view-only staff read any scope's settings (as in the admin), without a grant
    assert api_client_for(viewer).get("/api/v1/scopes/scope-a/settings/").json()["auto_refresh"] == "on_append"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"auto_refresh": "sometimes"}, "auto_refresh"),
        ({"auto_refresh": None}, "auto_refresh"),
        ({"auto_refresh_debounce_s": -1}, "auto_refresh_debounce_s"),
        ({"auto_refresh_debounce_s": 86_401}, "auto_refresh_debounce_s"),
        ({"auto_refresh_debounce_s": "soon"}, "auto_refresh_debounce_s"),
        ({"keep_previous_versions": -2}, "keep_previous_versions"),
        ({"keep_previous_versions": 1001}, "keep_previous_versions"),
        ({"retention": 3}, "retention"),
        ({}, "body"),
    ],
)
def test_bad_settings_are_a_400_naming_the_field(scope_a, staff_with, api_client_for, body, field):
    staff = api_client_for(staff_with("sam", "cartridges.change_scope_settings"))
    assert_error(staff.patch("/api/v1/scopes/scope-a/settings/", data=body, format="json"), 400, field)


def test_the_settings_service_validates_callers_that_skip_the_api(scope_a):
    from cartridges.services import scope_settings_update
    from core.errors import MnesioError

    for kwargs, field in [({"auto_refresh": "always"}, "auto_refresh"), ({"auto_refresh_debounce_s": True},
                          "auto_refresh_debounce_s"), ({"keep_previous_versions": 10**6}, "keep_previous_versions")]:
        with pytest.raises(MnesioError) as caught:
            scope_settings_update(scope=scope_a, **kwargs)
        assert caught.value.extra["field"] == field and f"`{field}`" in caught.value.message
    row = scope_settings_update(scope=scope_a, auto_refresh="manual")
    assert (row.auto_refresh, row.auto_refresh_debounce_s, row.keep_previous_versions) == ("manual", 2, 3)


@pytest.mark.postgres
def test_the_database_refuses_out_of_range_settings_and_edits(scope_a):
    from django.db import DatabaseError, IntegrityError, connection, transaction

    from cartridges.models import ScopeSettings

    for kwargs in ({"auto_refresh": "always"}, {"auto_refresh_debounce_s": 10**6}, {"keep_previous_versions": 5000}):
        with pytest.raises(IntegrityError), transaction.atomic():
            ScopeSettings.objects.create(scope=scope_a, **kwargs)
    row = ScopeSettings.objects.create(scope=scope_a)
    # append-only, raw SQL included: a change is a new row
    with pytest.raises(DatabaseError, match="protect_update"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE cartridges_scopesettings SET auto_refresh = 'on_append' WHERE id = %s", [row.pk])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_partial_changes_both_land(scope_a, monkeypatch):
    import threading
    import time

    from django.db import connection

    from cartridges.selectors import scope_settings_get
    from cartridges.services import scope_settings as module

    real = module.scope_settings_get

    def slow_read(*, scope):  # widen the read-merge-write window: without the scope lock one change is lost
        settings_now = real(scope=scope)
        time.sleep(0.3)
        return settings_now

    monkeypatch.setattr(module, "scope_settings_get", slow_read)
    errors: list[Exception] = []

    def change(**kwargs):
        try:
            module.scope_settings_update(scope=scope_a, **kwargs)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=change, kwargs={"auto_refresh": "manual"}),
               threading.Thread(target=change, kwargs={"keep_previous_versions": 2})]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    final = scope_settings_get(scope=scope_a)
    assert (final.auto_refresh, final.keep_previous_versions) == ("manual", 2)


def test_a_hostile_username_in_the_path_is_a_404_naming_user(scope_a, staff_with, api_client_for):
    staff = api_client_for(staff_with("sam", "memories.delete_scopegrant"))
    for name in ("a%00b", "x" * 5000, "%FF%FE", "..", "dave%20"):
        response = staff.delete(f"/api/v1/scopes/scope-a/grants/{name}/")
        assert_error(response, 404, "user")


def test_an_operator_revokes_a_grant_from_the_command_line(alice, api_client_for):
    import io

    from django.core.management import CommandError, call_command

    client = api_client_for(alice)
    call_command("revoke_scope", "scope-a", "alice", stdout=io.StringIO())
    assert_error(client.get("/api/v1/scopes/scope-a/head/"), 404, "scope")
    with pytest.raises(CommandError, match="`user`"):
        call_command("revoke_scope", "scope-a", "alice", stdout=io.StringIO())
    with pytest.raises(CommandError, match="`scope`"):
        call_command("revoke_scope", "nope", "alice", stdout=io.StringIO())


def test_the_admin_shows_the_settings_history_read_only(scope_a, staff_with, client, django_user_model):
    from cartridges.services import scope_settings_update

    scope_settings_update(scope=scope_a, auto_refresh="manual")
    viewer = staff_with("vera", "cartridges.view_scopesettings")
    client.force_login(viewer)
    page = client.get("/admin/cartridges/scopesettings/")
    assert page.status_code == 200 and "manual" in page.content.decode()
    assert client.get("/admin/cartridges/scopesettings/add/").status_code == 403
    # even a superuser has no form to change a setting there: the API's PATCH is the one door
    client.force_login(django_user_model.objects.create_superuser(username="root", password="x-root"))
    assert client.get("/admin/cartridges/scopesettings/add/").status_code == 403
    row = scope_a.settings_changes.get()
    assert client.post(f"/admin/cartridges/scopesettings/{row.pk}/change/", {"auto_refresh": "manual"}).status_code == 403
