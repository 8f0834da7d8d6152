"""The full matrix endpoint x foreign-scope client: every route of the project, enumerated from the URL
resolver (tests/reliability/endpoints.py), refuses a client that is not granted the scope."""
from __future__ import annotations

import json

import pytest

from tests.support.endpoints import UNSCOPED_API, all_routes, classify

pytestmark = pytest.mark.django_db

MARKER = "zebra-quokka-7731"  # a unique plaintext that must never reach a foreign client

# A valid body per POST route: the refusal must come from the scope check, not from validation.
BODIES = {
    "scope-memories": {"content": "a new fact"},
    "erasure-requests": {"subject": "dana", "reason": "asked to be forgotten"},
    "cartridge-compile": {},
    "cartridge-rollback": {},
    "cartridge-evaluate": {},
    "cartridge-activate": {},
    "scope-ask": {"question": "Where is the spare key?"},
    "evaluation-cases": {"question": "Where is the spare key?", "answers": ["flowerpot"]},
    "scope-search": {"query": "spare key"},
    "scope-grants": {"user": "charlie"},
    "scope-settings": {"auto_refresh": "on_append"},
}


@pytest.fixture
def world(alice, charlie, scope_a, scope_c, fake_row, eager_tasks):
    """Scope A (alice's) with memories, an active version, an erasure request and a case; scope C (charlie's)."""
    from cartridges.services import cartridge_activate, cartridge_compile, evaluation_case_add
    from memories.services import erasure_request_file, memory_append

    memory_append(scope=scope_a, content=f"The spare key is under the blue flowerpot {MARKER}.")
    memory_append(scope=scope_a, subject="dana", content=f"Dana's locker code is 4417 {MARKER}.")
    memory_append(scope=scope_a, subject="erin", content="Erin likes tea.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    case = evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])
    erasure = erasure_request_file(subject="erin", requested_by=alice, reason="asked", scope=scope_a)
    memory_append(scope=scope_c, content="Charlie's own fact.")
    from cartridges.services import answer_request_answer, answer_request_file

    answered = answer_request_answer(answer_request=answer_request_file(
        scope=scope_a, question="Where is the spare key?", actor=alice))  # alice's async ask, ready to collect
    return {
        "pk_answer": answered.pk,
        "seq": scope_a.memories.order_by("seq").first().seq,
        "pk_version": version.pk,
        "pk_erasure": erasure.pk,
        "pk_case": case.pk,
    }


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


# ---------------------------------------------------------------------------
# Admin actions and operator writes x permission levels: only a staff user holding the
# action's own permission, or a superuser, may act; a refusal changes nothing (no task queued, no row).
# ---------------------------------------------------------------------------
LEVELS = ["non-staff", "staff view-only", "staff with exactly that permission", "superuser"]
VIEW_MODELS = ["memories.scope", "memories.memory", "memories.subject", "memories.erasurerequest",
               "cartridges.cartridgeversion", "cartridges.kvconfiguration", "cartridges.evaluationcase"]
COUNTED = ["memories.ErasureRequest", "memories.ErasureEvent", "memories.Subject", "cartridges.CartridgeVersion",
           "cartridges.CartridgeEvaluation", "cartridges.CartridgeActivation", "cartridges.KvConfiguration",
           "cartridges.EvaluationCase"]


def _perm(dotted: str):
    from django.contrib.auth.models import Permission

    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def _level_user(level: str, permission: str, n: int):
    """A user of ``level``; the non-staff user holds the permission too (a permission alone opens no admin)."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    if level == "superuser":
        return User.objects.create_superuser(username=f"root-{n}", email="", password="x")
    user = User.objects.create_user(username=f"u-{n}", email="", password="x", is_staff=level != "non-staff")
    if level != "non-staff":
        user.user_permissions.add(*[_perm(f"{m.split('.')[0]}.view_{m.split('.')[1]}") for m in VIEW_MODELS])
    if level != "staff view-only":
        user.user_permissions.add(_perm(permission))
    return user


@pytest.fixture
def admin_world(scope_a, fake_row, eager_tasks):
    """Scope A with v1 (superseded), v2 (active), v3 (compiled, not active), one more memory past v3's head,
    and an erasure request waiting to be processed."""
    from cartridges.services import cartridge_activate, cartridge_compile
    from memories.models import Subject
    from memories.services import erasure_request_file, memory_append

    memory_append(scope=scope_a, content=f"The spare key is under the blue flowerpot {MARKER}.")
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    memory_append(scope=scope_a, subject="erin", content="Erin likes tea.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v2)
    memory_append(scope=scope_a, content="The car is on level 3.")
    v3 = cartridge_compile(scope=scope_a)
    memory_append(scope=scope_a, content="The bike is in the shed.")
    erasure = erasure_request_file(subject="erin", requested_by=None, reason="asked", scope=scope_a)
    return {"scope": scope_a, "v2": v2, "v3": v3, "erasure": erasure, "dana": Subject.objects.get(external_id="dana")}


def _admin_action(url: str, action: str, pk: int):
    return lambda client, w: client.post(url, {"action": action, "_selected_action": [str(pk)]})


OPERATOR_WRITES = {
    # name: (permission that may act, how to act: (client for the user, world) -> response)
    "erasure process": ("memories.process_erasurerequest",
                        lambda c, w: _admin_action("/admin/memories/erasurerequest/", "process", w["erasure"].pk)(c, w)),
    "erasure add, one scope": ("memories.add_erasurerequest", lambda c, w: c.post(
        "/admin/memories/erasurerequest/add/", {"subject": w["dana"].pk, "reason": "asked", "scope": w["scope"].pk})),
    "erasure add, every scope": ("memories.erase_subject_everywhere", lambda c, w: c.post(
        "/admin/memories/erasurerequest/add/", {"subject": w["dana"].pk, "reason": "asked", "scope": ""})),
    "compile": ("cartridges.compile_cartridge",
                lambda c, w: _admin_action("/admin/memories/scope/", "compile_scopes", w["scope"].pk)(c, w)),
    "compile (versions list)": ("cartridges.compile_cartridge", lambda c, w: _admin_action(
        "/admin/cartridges/cartridgeversion/", "compile_scopes", w["v3"].pk)(c, w)),
    "evaluate": ("cartridges.evaluate_cartridge",
                 lambda c, w: _admin_action("/admin/cartridges/cartridgeversion/", "evaluate", w["v3"].pk)(c, w)),
    "activate": ("cartridges.activate_cartridge",
                 lambda c, w: _admin_action("/admin/cartridges/cartridgeversion/", "activate", w["v3"].pk)(c, w)),
    "rollback": ("cartridges.activate_cartridge",
                 lambda c, w: _admin_action("/admin/memories/scope/", "rollback_scopes", w["scope"].pk)(c, w)),
    "rollback (versions list)": ("cartridges.activate_cartridge", lambda c, w: _admin_action(
        "/admin/cartridges/cartridgeversion/", "rollback_scopes", w["v2"].pk)(c, w)),
    "configuration switch (admin)": ("cartridges.switch_kvconfiguration", lambda c, w: c.post(
        "/admin/cartridges/kvconfiguration/add/", {"backend": "fake", "model": "fake-model", "dtype": "f32",
                                                   "quant": "q8"})),
    "configuration switch (API)": ("cartridges.switch_kvconfiguration", lambda c, w: c.post(
        "/api/v1/kv/configuration/", data={"backend": "fake", "model": "fake-model", "dtype": "f32", "quant": "q8"},
        format="json")),
    "evaluation case add": ("cartridges.add_evaluationcase", lambda c, w: c.post(
        "/admin/cartridges/evaluationcase/add/", {"scope": w["scope"].pk, "question": "Where is the car?",
                                                  "answers": "level 3"})),
}


def _state() -> dict[str, int]:
    from django.apps import apps

    counts = {name: apps.get_model(name).objects.count() for name in COUNTED}
    counts["shredded subjects"] = apps.get_model("memories.Subject").objects.filter(shredded_at__isnull=False).count()
    return counts


def test_every_admin_action_and_operator_write_needs_its_own_permission(
    admin_world, api_client_for, monkeypatch, record_figures
):
    from celery.app.task import Task
    from django.db import connection, transaction
    from django.test import Client

    sent: list[str] = []
    original_apply_async = Task.apply_async

    def counting_apply_async(task, *args, **kwargs):
        sent.append(task.name)
        return original_apply_async(task, *args, **kwargs)

    monkeypatch.setattr(Task, "apply_async", counting_apply_async)
    cells, wrong, refused, acted, n = [], [], 0, 0, 0
    for name, (permission, act) in OPERATOR_WRITES.items():
        for level in LEVELS:
            n += 1
            with transaction.atomic():  # each cell starts from the same world: rolled back below
                user = _level_user(level, permission, n)
                if name.endswith("(API)"):
                    client = api_client_for(user)
                else:
                    client = Client()
                    client.force_login(user)
                before, num_sent, num_callbacks = _state(), len(sent), len(connection.run_on_commit)
                response = act(client, admin_world)
                changed = {k: v - before[k] for k, v in _state().items() if v != before[k]}
                queued = len(sent) - num_sent + len(connection.run_on_commit) - num_callbacks
                cell = f"{name} x {level}: {response.status_code}, rows {changed or 'unchanged'}, {queued} task(s)"
                cells.append(cell)
                may_act = level in ("staff with exactly that permission", "superuser")
                if response.status_code >= 500 or bool(changed or queued) != may_act:
                    wrong.append(cell)
                refused += not (changed or queued)
                acted += bool(changed or queued)
                transaction.set_rollback(True)
    record_figures(scenario="admin actions x permission levels", num_actions=len(OPERATOR_WRITES),
                   num_levels=len(LEVELS), num_cells=len(cells), num_refused=refused, num_acted=acted,
                   num_wrong=len(wrong))
    assert not wrong, "\n".join(wrong)
    assert refused == acted == 2 * len(OPERATOR_WRITES), "\n".join(cells)


# ---------------------------------------------------------------------------
# Granting x reading: the permission to grant a scope is not a permission to read it. Staff who may grant
# (`memories.add_scopegrant`) give scopes to clients; giving one to themselves needs
# `memories.grant_scope_to_self`, and every grant and revocation is an audited event (ScopeGrantEvent).
# ---------------------------------------------------------------------------
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
            staff.user_permissions.add(*[_perm(p) for p in ("memories.view_scope", *permissions)])
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
    revoker.user_permissions.add(_perm("memories.delete_scopegrant"))
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
    staff.user_permissions.add(_perm("memories.add_scopegrant"), _perm("memories.view_scopegrant"))
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
    staff.user_permissions.add(_perm("memories.change_scope"), _perm("memories.delete_scopegrant"))
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


# Inviting x reading: the actor of an invitation receives the new user's first token, so inviting into a scope
# over the API is a grant the actor can read through. It needs `memories.grant_scope_to_self` as well, and a token
# limited to some scopes invites no one (it manages no tokens, its own or a new user's).
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
            staff.user_permissions.add(*[_perm(p) for p in ("auth.add_user", *permissions)])
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
