"""/api/v1/kv/configuration/: operators switch model + precision at runtime; old cartridges stop serving and
recompiles are queued for every scope; unknown values are 400s naming the field."""
from __future__ import annotations

import pytest

from cartridges.models import CartridgeVersion, KvConfiguration
from cartridges.selectors import active_version
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db
URL = "/api/v1/kv/configuration/"
SWITCH = {"backend": "fake", "model": "fake-model", "dtype": "bf16", "quant": "q8"}


def test_anyone_authenticated_reads_the_active_configuration(alice, api_client_for):
    body = api_client_for(alice).get(URL).json()
    assert body["source"] == "settings" and (body["backend"], body["model"], body["dtype"], body["quant"]) == (
        "fake", "fake-model", "f32", "none"
    )


def test_switching_stops_old_cartridges_from_serving_and_queues_recompiles(
    operator, alice, charlie, scope_a, scope_c, served, api_client_for, django_capture_on_commit_callbacks, settings
):
    old_a = served(scope_a, ["The spare key is under the blue flowerpot."])
    old_c = served(scope_c, ["Miso the cat sleeps on the piano."])
    ask = {"question": "Where is the spare key?"}
    assert api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", ask, format="json").json()["version_id"] == old_a.pk

    with django_capture_on_commit_callbacks(execute=False) as queued:
        response = api_client_for(operator).post(URL, SWITCH, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["source"] == "switch" and body["created_by"] == "olga" and (body["dtype"], body["quant"]) == ("bf16", "q8")
    row = KvConfiguration.objects.get()
    assert row.created_by == operator

    # before any recompile ran: the old cartridges no longer serve (their key does not match); the scope's memories
    # are read in memory under the new configuration, or, with that off, nothing serves
    fresh = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", ask, format="json").json()
    assert fresh["version_id"] is None and fresh["num_memories_after_version"] == 1 and "flowerpot" in fresh["answer"]
    settings.MNESIO_FRESH_MAX_MEMORIES = 0
    refused = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", ask, format="json")
    assert_error(refused, 409, "scope")
    assert "fake:fake-model:bf16:q8" in refused.json()["message"]
    metrics = api_client_for(operator).get("/api/v1/kv/metrics").json()
    assert [s["serving"] for s in metrics["scopes"]] == [False, False]
    assert [s["activated_version_id"] for s in metrics["scopes"]] == [old_a.pk, old_c.pk]

    # the recompiles were queued after commit (compile -> evaluate -> activate, one per scope); run them
    assert len(queued) == 2
    with django_capture_on_commit_callbacks(execute=True):
        for callback in queued:
            callback()
    for scope in (scope_a, scope_c):
        new = active_version(scope=scope)
        assert new is not None and new.configuration_id == row.pk and (new.dtype, new.quant) == ("bf16", "q8")
    assert CartridgeVersion.objects.count() == 4
    answer = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", ask, format="json").json()
    assert answer["version_id"] == active_version(scope=scope_a).pk != old_a.pk and "flowerpot" in answer["answer"]


def test_switching_to_the_active_configuration_adds_nothing(operator, api_client_for):
    client = api_client_for(operator)
    first = client.post(URL, SWITCH, format="json").json()
    second = client.post(URL, SWITCH, format="json")
    assert second.status_code == 201 and second.json()["id"] == first["id"] and KvConfiguration.objects.count() == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "gpt-17"}, "model"),
        ({"model": ""}, "model"),
        ({"model": 3}, "model"),
        ({"dtype": "f64"}, "dtype"),
        ({"dtype": 32}, "dtype"),
        ({"quant": "q3"}, "quant"),
        ({"backend": "onnx"}, "backend"),
        ({"device": "cuda"}, "device"),
        ({"precision": "f32"}, "precision"),
    ],
)
def test_it_rejects_an_unknown_model_or_precision_naming_the_field(operator, api_client_for, change, field):
    response = api_client_for(operator).post(URL, {**SWITCH, **change}, format="json")
    body = assert_error(response, 400, field)
    if field in ("model", "dtype", "quant", "backend") and isinstance(change[field], str) and change[field]:
        assert "has to be one of" in body["message"] and repr(change[field]) in body["message"]
    assert not KvConfiguration.objects.exists()


def test_it_requires_every_configuration_field_but_quant(operator, api_client_for):
    body = assert_error(api_client_for(operator).post(URL, {"backend": "fake"}, format="json"), 400)
    assert {"model", "dtype"} <= set(body["extra"]["fields"]) and "quant" not in body["extra"]["fields"]


def test_only_operators_may_switch(alice, charlie, api_client_for):
    for user in (alice, charlie):
        body = assert_error(api_client_for(user).post(URL, SWITCH, format="json"), 403)
        assert "operator" in body["message"]
    assert not KvConfiguration.objects.exists()
