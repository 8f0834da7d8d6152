"""Compile (202 + task), evaluate (202 + task) and activate (through the gate; 409 with every reason)."""
from __future__ import annotations

import pytest

from cartridges.models import CartridgeActivation, CartridgeEvaluation, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import cartridge_compile
from tests.support.blobs import tamper
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db
KEY = "The spare key is under the blue flowerpot."


@pytest.fixture
def version(scope_a, append):
    """A compiled version of scope A's one memory."""
    append(scope_a, KEY)
    return cartridge_compile(scope=scope_a)


def _act(client, version, action: str, expected_status: int) -> dict:
    """POST an empty body to a version's ``evaluate`` or ``activate`` and return the response body."""
    response = client.post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/{action}/", {}, format="json")
    assert response.status_code == expected_status, response.content
    return response.json()


def test_compile_is_accepted_and_runs_the_task_at_the_head_of_the_request(alice, scope_a, append, api_client_for):
    append(scope_a, KEY)
    append(scope_a, "Ada drinks green tea.")
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "done" and body["task_id"] and body["log_head"] == 2  # eager here; "queued" on a broker
    version = CartridgeVersion.objects.get(pk=body["version_id"])
    assert version.scope == scope_a and version.log_head == 2 and version.num_memories == 2
    # idempotent: the same head gives the same version
    again = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {"log_head": 2}, format="json")
    assert again.json()["version_id"] == version.pk and CartridgeVersion.objects.count() == 1


def test_compile_at_an_earlier_head_leaves_later_memories_out(alice, scope_a, append, api_client_for):
    append(scope_a, KEY)
    append(scope_a, "Ada drinks green tea.")
    body = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {"log_head": 1}, format="json").json()
    assert CartridgeVersion.objects.get(pk=body["version_id"]).num_memories == 1


def test_compile_with_activate_queues_evaluate_and_activate(
    alice, scope_a, append, api_client_for, django_capture_on_commit_callbacks
):
    append(scope_a, KEY)
    with django_capture_on_commit_callbacks(execute=True):
        body = api_client_for(alice).post(
            "/api/v1/scopes/scope-a/cartridges/compile/", {"activate": True}, format="json"
        ).json()
    assert active_version(scope=scope_a).pk == body["version_id"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"log_head": "abc"}, "log_head"),
        ({"log_head": 0}, "log_head"),
        ({"log_head": 99}, "log_head"),
        ({"log_head": 1.5}, "log_head"),
        ({"activate": "perhaps"}, "activate"),
        ({"scope": "scope-c"}, "scope"),
        ({"quant": "q4"}, "quant"),
    ],
)
def test_compile_rejects_bad_input_naming_the_field(alice, scope_a, append, api_client_for, payload, field):
    append(scope_a, KEY)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", payload, format="json")
    assert_error(response, 400, field)
    assert not CartridgeVersion.objects.exists()


def test_compile_refuses_an_empty_scope_naming_it(alice, scope_a, api_client_for):
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json")
    assert_error(response, 400, "scope")


def test_another_scopes_client_can_neither_compile_nor_evaluate_nor_activate(charlie, version, api_client_for):
    client = api_client_for(charlie)
    assert_error(client.post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json"), 404, "scope")
    assert_error(client.post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/evaluate/", {}, format="json"), 404, "scope")
    assert_error(client.post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/activate/", {}, format="json"), 404, "scope")
    # nor through its own scope's URL with A's version id
    assert_error(client.post(f"/api/v1/scopes/scope-c/cartridges/{version.pk}/activate/", {}, format="json"), 404, "version")
    assert CartridgeVersion.objects.count() == 1
    assert not CartridgeEvaluation.objects.exists() and not CartridgeActivation.objects.exists()


def test_evaluate_records_the_gate_result(alice, version, api_client_for):
    body = _act(api_client_for(alice), version, "evaluate", 202)
    assert body["status"] == "done" and body["passed"] is True
    assert CartridgeEvaluation.objects.get(pk=body["evaluation_id"]).version == version


def test_evaluate_rejects_unknown_fields_and_ids(alice, version, api_client_for):
    client = api_client_for(alice)
    assert_error(client.post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/evaluate/", {"fast": True}, format="json"), 400, "fast")
    assert_error(client.post("/api/v1/scopes/scope-a/cartridges/424242/evaluate/", {}, format="json"), 404, "version")


def test_activate_puts_a_version_into_service_attributed_to_the_client(alice, scope_a, version, api_client_for):
    body = _act(api_client_for(alice), version, "activate", 200)
    assert body["version_id"] == version.pk and body["actor"] == "alice" and body["kind"] == "activate"
    assert active_version(scope=scope_a) == version
    assert CartridgeActivation.objects.get().actor == alice
    assert CartridgeEvaluation.objects.get().created_by == alice


def test_activate_answers_409_with_every_reason_and_the_old_version_keeps_serving(
    alice, scope_a, served, append, api_client_for
):
    from memories.models import Subject
    from memories.services import subject_shred

    old = served(scope_a, [KEY])
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    new = cartridge_compile(scope=scope_a)
    tamper(new)
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    response = api_client_for(alice).post(f"/api/v1/scopes/scope-a/cartridges/{new.pk}/activate/", {}, format="json")
    body = assert_error(response, 409)
    reasons = body["extra"]["reasons"]
    assert len(reasons) == 2 and any("erased subject" in r for r in reasons) and any("sha256" in r for r in reasons)
    assert "4417" not in str(body)
    assert active_version(scope=scope_a) == old
    ask = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
    assert ask.json()["version_id"] == old.pk


def test_activate_rejects_unknown_fields_and_foreign_ids(alice, scope_a, scope_c, append, api_client_for):
    append(scope_a, KEY)
    append(scope_c, "Miso the cat sleeps on the piano.")
    version = cartridge_compile(scope=scope_a)
    foreign = cartridge_compile(scope=scope_c)
    client = api_client_for(alice)
    assert_error(client.post(f"/api/v1/scopes/scope-a/cartridges/{version.pk}/activate/", {"force": True}, format="json"), 400, "force")
    assert_error(client.post(f"/api/v1/scopes/scope-a/cartridges/{foreign.pk}/activate/", {}, format="json"), 404, "version")
    assert not CartridgeActivation.objects.exists()


def test_compile_and_evaluate_through_the_api_are_attributed(alice, scope_a, append, api_client_for):
    append(scope_a, KEY)
    client = api_client_for(alice)
    version_id = client.post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json").json()["version_id"]
    evaluation_id = client.post(f"/api/v1/scopes/scope-a/cartridges/{version_id}/evaluate/", {}, format="json").json()[
        "evaluation_id"
    ]
    assert CartridgeVersion.objects.get(pk=version_id).created_by == alice
    assert CartridgeEvaluation.objects.get(pk=evaluation_id).created_by == alice
