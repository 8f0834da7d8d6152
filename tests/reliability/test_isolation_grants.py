"""Granting and inviting x reading: the permission to grant a scope is not a permission to read it.

Staff who may grant (`memories.add_scopegrant`) give scopes to clients; giving one to themselves needs
`memories.grant_scope_to_self`, and every grant and revocation is an audited event (ScopeGrantEvent). The actor
of an invitation receives the new user's first token, so inviting into a scope over the API is a grant the actor
can read through: it needs `memories.grant_scope_to_self` as well, and a token limited to some scopes invites no
one (it manages no tokens, its own or a new user's)."""
from __future__ import annotations

import pytest

from tests.support.isolation import MARKER, perm

pytestmark = pytest.mark.django_db

SELF_GRANT_CELLS = [
    # (who: the permissions besides view-only, whom they grant, may the grant happen)
    (("memories.add_scopegrant",), "self", False),
    (("memories.add_scopegrant", "memories.delete_scope"), "self", False),
    (("memories.add_scopegrant",), "dave", True),
    (("memories.add_scopegrant", "memories.grant_scope_to_self"), "self", True),
    (("memories.grant_scope_to_self",), "self", False),  # the self permission alone grants nothing
]


def test_granting_a_scope_to_oneself_needs_its_own_permission_and_is_audited(
    world, alice, api_client_for, record_figures
):
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from memories.models import Scope, ScopeGrant, ScopeGrantEvent

    User = get_user_model()
    dave = User.objects.create_user(username="dave", email="", password="x")
    cells, wrong = [], []
    for n, (permissions, whom, may_grant) in enumerate(SELF_GRANT_CELLS):
        with transaction.atomic():  # each cell starts from the same world: rolled back below
            staff = User.objects.create_user(username=f"staff-{n}", email="", password="x", is_staff=True)
            staff.user_permissions.add(*[perm(p) for p in ("memories.view_scope", *permissions)])
            client = api_client_for(staff)
            grantee = staff if whom == "self" else dave
            events_before = ScopeGrantEvent.objects.count()
            granted = client.post("/api/v1/scopes/scope-a/grants/", data={"user": grantee.username}, format="json")
            read = client.get("/api/v1/scopes/scope-a/memories/")
            deleted = client.delete("/api/v1/scopes/scope-a/")
            has_grant = ScopeGrant.objects.filter(scope__name="scope-a", user=grantee).exists()
            events = list(ScopeGrantEvent.objects.order_by("pk")[events_before:])
            cell = (f"{'+'.join(permissions)} grants {whom}: grant {granted.status_code}, read {read.status_code}, "
                    f"delete {deleted.status_code}, {len(events)} event(s)")
            cells.append(cell)
            leaked = MARKER in read.content.decode()
            if may_grant:
                ok = (granted.status_code == 201 and has_grant and len(events) == 1
                      and events[0].action == "granted" and events[0].actor_pk == staff.pk
                      and events[0].user_pk == grantee.pk and events[0].scope_name == "scope-a")
                # reading is the grantee's: staff who granted someone else still cannot read
                ok = ok and (leaked == (whom == "self")) and read.status_code == (200 if whom == "self" else 404)
            else:
                ok = (granted.status_code == 403 and not has_grant and not events and not leaked
                      and read.status_code == 404 and deleted.status_code == 404
                      and Scope.objects.get(name="scope-a").deleted_at is None)
                ok = ok and any(p in granted.json()["message"] for p in ("grant_scope_to_self", "add_scopegrant"))
            if not ok:
                wrong.append(cell)
            transaction.set_rollback(True)
    # a revocation is an event too, naming who revoked whose grant
    revoker = User.objects.create_user(username="rev", email="", password="x", is_staff=True)
    revoker.user_permissions.add(perm("memories.delete_scopegrant"))
    assert api_client_for(revoker).delete("/api/v1/scopes/scope-a/grants/alice/").status_code == 204
    revoked = ScopeGrantEvent.objects.order_by("pk").last()
    assert (revoked.action, revoked.actor_pk, revoked.user_pk, revoked.username) == ("revoked", revoker.pk, alice.pk,
                                                                                       "alice")
    record_figures(scenario="self-grant matrix", num_cells=len(cells), num_wrong=len(wrong), cells=cells)
    assert not wrong, "\n".join(wrong)


@pytest.mark.postgres
def test_grant_events_cannot_be_changed_or_removed_in_raw_sql(world, alice):
    from django.db import DatabaseError, connection, transaction

    from memories.models import ScopeGrantEvent

    assert ScopeGrantEvent.objects.filter(user_pk=alice.pk, action="granted").exists()  # the fixture's own grant
    for sql in ("UPDATE memories_scopegrantevent SET actor_pk = NULL", "DELETE FROM memories_scopegrantevent",
                "TRUNCATE memories_scopegrantevent"):
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql)


def test_the_admin_grant_page_needs_the_self_grant_permission_too_and_is_audited(world):
    from django.contrib.auth import get_user_model
    from django.test import Client

    from memories.models import Scope, ScopeGrant, ScopeGrantEvent

    User = get_user_model()
    staff = User.objects.create_user(username="gus", email="", password="x", is_staff=True)
    staff.user_permissions.add(perm("memories.add_scopegrant"), perm("memories.view_scopegrant"))
    dave = User.objects.create_user(username="dave", email="", password="x")
    client = Client()
    client.force_login(staff)
    scope = Scope.objects.get(name="scope-a")
    refused = client.post("/admin/memories/scopegrant/add/", {"scope": scope.pk, "user": staff.pk})
    assert refused.status_code == 200 and b"grant_scope_to_self" in refused.content
    assert not ScopeGrant.objects.filter(user=staff).exists()
    assert client.post("/admin/memories/scopegrant/add/", {"scope": scope.pk, "user": dave.pk}).status_code == 302
    event = ScopeGrantEvent.objects.order_by("pk").last()
    assert (event.action, event.actor_pk, event.user_pk, event.to_self) == ("granted", staff.pk, dave.pk, False)
    # the scope page's grant rows go through the same check and the same events
    staff.user_permissions.add(perm("memories.change_scope"), perm("memories.delete_scopegrant"))
    inline = {"name": "scope-a", "description": "", "grants-INITIAL_FORMS": "0", "grants-TOTAL_FORMS": "1",
              "grants-0-user": staff.pk}
    refused = client.post(f"/admin/memories/scope/{scope.pk}/change/", inline)
    assert refused.status_code == 200 and b"grant_scope_to_self" in refused.content
    assert not ScopeGrant.objects.filter(user=staff).exists()
    erin = User.objects.create_user(username="erin", email="", password="x")
    added = client.post(f"/admin/memories/scope/{scope.pk}/change/", {**inline, "grants-0-user": erin.pk})
    assert added.status_code == 302, added.content.decode()[-2000:]
    event = ScopeGrantEvent.objects.order_by("pk").last()
    assert (event.action, event.actor_pk, event.user_pk) == ("granted", staff.pk, erin.pk)


INVITE_CELLS = [
    # (the permissions besides `auth.add_user`, the token limited to scope C, the scopes invited into, may invite)
    (("memories.add_scopegrant",), False, ["scope-a"], False),
    (("memories.add_scopegrant", "memories.grant_scope_to_self"), True, ["scope-a"], False),
    (("memories.add_scopegrant", "memories.grant_scope_to_self"), True, [], False),
    (("memories.add_scopegrant", "memories.grant_scope_to_self"), False, ["scope-a"], True),
    # no scope: the caller still holds the new user's token, and a grant to "another" user would then read through it
    (("memories.add_scopegrant",), False, [], False),
    (("memories.grant_scope_to_self",), False, [], True),  # no scope: the new user's token reads nothing yet
]


def test_inviting_a_user_into_a_scope_needs_the_self_grant_permission_and_an_unlimited_token(
    world, api_client_for, record_figures
):
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from rest_framework.test import APIClient

    from memories.models import Scope, ScopeGrant
    from memories.services import api_token_create

    User = get_user_model()
    cells, wrong = [], []
    for n, (permissions, limited, scopes, may_invite) in enumerate(INVITE_CELLS):
        with transaction.atomic():
            staff = User.objects.create_user(username=f"inviter-{n}", email="", password="x", is_staff=True)
            staff.user_permissions.add(*[perm(p) for p in ("auth.add_user", *permissions)])
            if limited:
                ScopeGrant.objects.create(scope=Scope.objects.get(name="scope-c"), user=staff)
                client = APIClient()
                client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_create(user=staff, scopes=['scope-c'])[1]}")
            else:
                client = api_client_for(staff)
            invited = client.post("/api/v1/users/", data={"username": f"sock-{n}", "scopes": scopes}, format="json")
            made = User.objects.filter(username=f"sock-{n}").first()
            read = None
            if invited.status_code == 201:
                reader = APIClient()
                reader.credentials(HTTP_AUTHORIZATION=f"Token {invited.json()['token']['token']}")
                read = reader.get("/api/v1/scopes/scope-a/memories/")
            leaked = read is not None and MARKER in read.content.decode()
            cell = (f"{'+'.join(('auth.add_user', *permissions))} {'limited' if limited else 'unlimited'} token "
                    f"invites into {scopes}: {invited.status_code}, read {getattr(read, 'status_code', None)}")
            cells.append(cell)
            if may_invite:
                ok = invited.status_code == 201 and made is not None and leaked == ("scope-a" in scopes)
            else:
                ok = invited.status_code == 403 and made is None and not leaked
                ok = ok and ("limited" in invited.json()["message"] if limited
                             else "grant_scope_to_self" in invited.json()["message"])
            if not ok:
                wrong.append(cell)
            transaction.set_rollback(True)
    record_figures(scenario="invite matrix", num_cells=len(cells), num_wrong=len(wrong), cells=cells)
    assert not wrong, "\n".join(wrong)
