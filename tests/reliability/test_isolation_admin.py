"""Admin actions and operator writes x permission levels: only a staff user holding the action's own permission,
or a superuser, may act; a refusal changes nothing (no task queued, no row)."""
from __future__ import annotations

import pytest

from tests.support.isolation import MARKER, perm

pytestmark = pytest.mark.django_db

LEVELS = ["non-staff", "staff view-only", "staff with exactly that permission", "superuser"]
VIEW_MODELS = ["memories.scope", "memories.memory", "memories.subject", "memories.erasurerequest",
               "cartridges.cartridgeversion", "cartridges.kvconfiguration", "cartridges.evaluationcase"]
COUNTED = ["memories.ErasureRequest", "memories.ErasureEvent", "memories.Subject", "cartridges.CartridgeVersion",
           "cartridges.CartridgeEvaluation", "cartridges.CartridgeActivation", "cartridges.KvConfiguration",
           "cartridges.EvaluationCase"]


def _level_user(level: str, permission: str, n: int):
    """A user of ``level``; the non-staff user holds the permission too (a permission alone opens no admin)."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    if level == "superuser":
        return User.objects.create_superuser(username=f"root-{n}", email="", password="x")
    user = User.objects.create_user(username=f"u-{n}", email="", password="x", is_staff=level != "non-staff")
    if level != "non-staff":
        user.user_permissions.add(*[perm(f"{m.split('.')[0]}.view_{m.split('.')[1]}") for m in VIEW_MODELS])
    if level != "staff view-only":
        user.user_permissions.add(perm(permission))
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
