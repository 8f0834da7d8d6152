"""The admin: the KV metrics panel, read-only version history, and actions that go through the services
(compile, evaluate, activate through the gate with every reason on failure, roll back), attributed."""
from __future__ import annotations

import pytest

from cartridges import selectors
from cartridges.models import (
    CartridgeActivation,
    CartridgeEvaluation,
    CartridgeVersion,
    EvaluationCase,
    KvConfiguration,
)
from cartridges.selectors import active_version
from cartridges.services import cartridge_activate, cartridge_compile
from tests.support.blobs import tamper

pytestmark = pytest.mark.django_db
VERSIONS = "/admin/cartridges/cartridgeversion/"


def _action(client, url: str, action: str, pks: list[int]):
    return client.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks]}, follow=True)


def test_the_admin_index_shows_the_kv_metrics_panel(admin_client, scope_a, served):
    version = served(scope_a, ["The spare key is under the blue flowerpot."])
    html = admin_client.get("/admin/").content.decode()
    assert 'id="kv-metrics-panel"' in html and "fake · fake-model · f32 · quant none" in html
    assert f"version #{version.pk} at head 1" in html and "1 compiled · 1 active · 0 failed · 0 destroyed" in html
    assert "flowerpot" not in html


def test_versions_are_read_only_with_their_history(admin_client, scope_a, served, append):
    v1 = served(scope_a, ["The spare key is under the blue flowerpot."])
    append(scope_a, "Ada drinks green tea.")
    v2 = cartridge_compile(scope=scope_a)
    tamper(v2)
    _action(admin_client, VERSIONS, "evaluate", [v2.pk])
    listing = admin_client.get(VERSIONS).content.decode()
    assert "active" in listing and "failed" in listing
    page = admin_client.get(f"{VERSIONS}{v2.pk}/change/").content.decode()
    assert "does not match its recorded sha256" in page  # the failed evaluation's reason, in the history inline
    assert 'name="_save"' not in page and "green tea" not in page
    assert admin_client.get(f"{VERSIONS}add/").status_code == 403
    assert admin_client.post(f"{VERSIONS}{v1.pk}/delete/", {"post": "yes"}).status_code == 403
    assert CartridgeVersion.objects.count() == 2


def test_the_compile_action_compiles_a_scope_attributed_to_the_operator(admin_client, admin_user, scope_a, append):
    append(scope_a, "The spare key is under the blue flowerpot.")
    response = _action(admin_client, "/admin/memories/scope/", "compile_scopes", [scope_a.pk])
    version = CartridgeVersion.objects.get()
    assert f"compiled version {version.pk}" in response.content.decode()
    assert version.log_head == 1


def test_the_activate_action_goes_through_the_gate_and_is_attributed(admin_client, admin_user, scope_a, append):
    append(scope_a, "The spare key is under the blue flowerpot.")
    version = cartridge_compile(scope=scope_a)
    response = _action(admin_client, VERSIONS, "activate", [version.pk])
    assert f"Version {version.pk} now serves scope" in response.content.decode()
    assert active_version(scope=scope_a) == version
    assert CartridgeActivation.objects.get().actor == admin_user
    assert CartridgeEvaluation.objects.get().created_by == admin_user


def test_a_failed_gate_is_shown_with_every_reason_and_the_old_version_keeps_serving(
    admin_client, scope_a, served, append
):
    from memories.models import Subject
    from memories.services import subject_shred

    old = served(scope_a, ["The spare key is under the blue flowerpot."])
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    new = cartridge_compile(scope=scope_a)
    tamper(new)
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    html = _action(admin_client, VERSIONS, "activate", [new.pk]).content.decode()
    assert "did not pass the gate (2 reason(s))" in html
    assert "erased subject(s)" in html and "does not match its recorded sha256" in html
    assert active_version(scope=scope_a) == old and "4417" not in html


def test_the_rollback_action_reactivates_the_previous_version(admin_client, admin_user, scope_a, served, append):
    v1 = served(scope_a, ["The spare key is under the blue flowerpot."])
    append(scope_a, "Ada drinks green tea.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    html = _action(admin_client, "/admin/memories/scope/", "rollback_scopes", [scope_a.pk]).content.decode()
    assert f"rolled back to version {v1.pk}" in html
    activation = CartridgeActivation.objects.order_by("-id").first()
    assert (activation.version, activation.kind, activation.actor) == (v1, "rollback", admin_user)
    again = _action(admin_client, VERSIONS, "rollback_scopes", [v1.pk]).content.decode()
    assert "rolled back to version" in again  # back to the newer one: rollback follows the activation history


def test_the_scope_page_lists_its_versions(admin_client, scope_a, served):
    version = served(scope_a, ["The spare key is under the blue flowerpot."])
    html = admin_client.get(f"/admin/memories/scope/{scope_a.pk}/change/").content.decode()
    assert f"#{version.pk}</a>" in html and "cartridge versions" in html.lower()


def test_an_operator_switches_the_configuration_from_the_admin(admin_client, admin_user, settings, scope_a, served,
                                                               django_capture_on_commit_callbacks):
    old = served(scope_a, ["The spare key is under the blue flowerpot."])
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/admin/cartridges/kvconfiguration/add/",
            {"backend": "fake", "model": "fake-model", "dtype": "bf16", "quant": "q4"},
            follow=True,
        )
    assert response.status_code == 200 and "recompiles of every scope are queued" in response.content.decode()
    row = KvConfiguration.objects.get()
    assert (row.dtype, row.quant, row.created_by) == ("bf16", "q4", admin_user)
    new = active_version(scope=scope_a)
    assert new is not None and new != old and new.quant == "q4"


def test_the_configuration_form_rejects_an_unknown_model(admin_client):
    response = admin_client.post(
        "/admin/cartridges/kvconfiguration/add/", {"backend": "fake", "model": "gpt-17", "dtype": "f32", "quant": "none"}
    )
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not KvConfiguration.objects.exists()


def test_an_operator_attaches_an_evaluation_case(admin_client, admin_user, scope_a):
    admin_client.post("/admin/cartridges/evaluationcase/add/",
                      {"scope": scope_a.pk, "question": "Where is the spare key?", "answers": "flowerpot\nblue pot\n"})
    case = EvaluationCase.objects.get()
    opened = selectors.evaluation_case_open(case=case)
    assert opened.answers == ["flowerpot", "blue pot"] and case.created_by == admin_user and opened.subjects == []


def test_an_operator_links_a_case_to_subjects_of_the_scope_only(admin_client, scope_a, scope_c, append):
    append(scope_a, "Dana parks in bay 12.", subject="dana")
    append(scope_c, "Erin likes tea.", subject="erin")
    response = admin_client.post("/admin/cartridges/evaluationcase/add/",
                                 {"scope": scope_a.pk, "question": "Where does Erin park?", "answers": "x", "subject_ids": "erin"})
    assert response.status_code == 200 and "subjects" in response.content.decode() and not EvaluationCase.objects.exists()
    admin_client.post("/admin/cartridges/evaluationcase/add/",
                      {"scope": scope_a.pk, "question": "Where does Dana park?", "answers": "x", "subject_ids": "dana\n"})
    assert selectors.evaluation_case_open(case=EvaluationCase.objects.get()).subjects == ["dana"]


def test_staff_rights_are_needed(client, alice, scope_a, served):
    version = served(scope_a, ["The spare key is under the blue flowerpot."])
    client.force_login(alice)
    for url in ("/admin/", VERSIONS, "/admin/cartridges/kvconfiguration/add/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(VERSIONS, {"action": "activate", "_selected_action": [str(version.pk)]})
    assert response.status_code == 302 and CartridgeActivation.objects.count() == 1
