"""GET /api/kv/metrics (and its Prometheus text) checked field by field against a scenario with known counts."""
from __future__ import annotations

import re

import pytest

from cartridges.models import AnswerRecord
from cartridges.services import cartridge_activate, cartridge_compile, cartridge_evaluate
from memories.services import erasure_request_file, erasure_request_process
from tests.api.conftest import tamper
from tests.api.helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def scenario(alice, charlie, operator, scope_a, scope_c, append):
    """Scope A: v1 active at head 2, v2 failed the gate, 2 memories since v1; scope C: v3 destroyed by an
    erasure (done); one erasure pending; 10 cartridge answers (1..10 s) and 11 text answers in known times."""
    append(scope_a, "The spare key is under the blue flowerpot.")  # seq 1
    append(scope_a, "Evan drinks green tea.", subject="evan")  # seq 2
    v1 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v1, actor=alice)  # evaluation 1: passed
    append(scope_a, "The car is parked on level 3.")  # seq 3
    v2 = cartridge_compile(scope=scope_a)
    tamper(v2)
    cartridge_evaluate(version=v2)  # evaluation 2: failed
    append(scope_a, "The plants need water on Fridays.")  # seq 4
    append(scope_c, "Dora's cat Miso sleeps on the piano.", subject="dora")  # seq 5
    v3 = cartridge_compile(scope=scope_c)
    done = erasure_request_file(subject="dora", requested_by=charlie, reason="asked to be forgotten", scope=scope_c)
    erasure_request_process(erasure_request=done, actor=operator)  # destroys v3; C has nothing left to compile
    erasure_request_file(subject="evan", requested_by=alice, reason="left the team", scope=scope_a)  # pending
    for i in range(1, 11):
        AnswerRecord.objects.create(scope=scope_a, version=v1, mode="cartridge", ttft_s=i / 10, total_s=float(i))
        AnswerRecord.objects.create(scope=scope_a, mode="text", ttft_s=i / 5, total_s=2.0 * i)
    AnswerRecord.objects.create(scope=scope_c, mode="text", ttft_s=50.0, total_s=100.0)
    return {"v1": v1, "v2": v2, "v3": v3}


def test_operators_see_every_field_with_the_known_counts(operator, scenario, api_client_for):
    v1, v2 = scenario["v1"], scenario["v2"]
    response = api_client_for(operator).get("/api/kv/metrics")
    assert response.status_code == 200, response.content
    m = response.json()
    assert set(m) == {"generated_at", "log_head", "configuration", "scopes", "gate", "latency", "versions",
                      "sizes_by_quant", "erasures"}
    assert m["log_head"] == 5
    config = m["configuration"]
    assert (config["backend"], config["model"], config["dtype"], config["quant"], config["device"]) == (
        "fake", "fake-model", "f32", "none", "cpu"
    )
    a, c = m["scopes"]
    assert (a["scope"], a["num_memories"], a["scope_head"], a["lag"], a["serving"], a["activated_version_id"]) == (
        "scope-a", 4, 4, 2, True, v1.pk
    )
    active = a["active_version"]
    assert (active["id"], active["log_head"], active["num_tokens"], active["size_bytes"], active["log_head_lag"]) == (
        v1.pk, 2, v1.num_tokens, v1.size_bytes, 3
    )
    assert active["age_s"] >= 0 and active["quant"] == "none" and active["num_memories"] == 2
    assert (c["scope"], c["num_memories"], c["lag"], c["serving"], c["active_version"]) == ("scope-c", 1, 1, False, None)

    assert (m["gate"]["passed"], m["gate"]["failed"]) == (1, 1)
    newest, oldest = m["gate"]["recent"]
    assert (newest["version_id"], newest["passed"], oldest["version_id"], oldest["passed"]) == (v2.pk, False, v1.pk, True)
    assert any("sha256" in r for r in newest["reasons"]) and oldest["reasons"] == [] and oldest["fidelity"] == 1.0

    # nearest rank over the window: cartridge totals 1..10 s; text totals 2, 4, ..., 20 and 100 s
    assert m["latency"]["window"] >= 11
    assert m["latency"]["cartridge"] == {
        "count": 10, "ttft_p50_s": 0.5, "ttft_p95_s": 1.0, "total_p50_s": 5.0, "total_p95_s": 10.0
    }
    text = m["latency"]["text"]
    assert (text["count"], text["total_p50_s"], text["total_p95_s"], text["ttft_p95_s"]) == (11, 12.0, 100.0, 50.0)

    assert m["versions"] == {"compiled": 3, "failed": 1, "destroyed": 1, "active": 1}
    assert m["sizes_by_quant"] == [{
        "quant": "none", "count": 2, "total_bytes": v1.size_bytes + v2.size_bytes,
        "mean_bytes": round((v1.size_bytes + v2.size_bytes) / 2),
    }]
    assert m["erasures"] == {"pending": 1, "done": 1, "failed": 0}
    assert "flowerpot" not in response.content.decode() and "Miso" not in response.content.decode()


def test_a_client_sees_only_its_own_scopes(alice, charlie, scenario, api_client_for):
    a = api_client_for(alice).get("/api/kv/metrics").json()
    assert [s["scope"] for s in a["scopes"]] == ["scope-a"]
    assert a["versions"] == {"compiled": 2, "failed": 1, "destroyed": 0, "active": 1}
    assert (a["latency"]["text"]["count"], a["latency"]["text"]["total_p95_s"]) == (10, 20.0)
    assert a["erasures"] == {"pending": 1, "done": 0, "failed": 0}
    c = api_client_for(charlie).get("/api/kv/metrics/").json()
    assert [s["scope"] for s in c["scopes"]] == ["scope-c"]
    assert (c["gate"]["passed"], c["gate"]["failed"], c["gate"]["recent"]) == (0, 0, [])
    assert c["versions"] == {"compiled": 1, "failed": 0, "destroyed": 1, "active": 0}
    assert c["erasures"] == {"pending": 0, "done": 1, "failed": 0}


def _samples(text: str) -> dict[str, float]:
    """Parse Prometheus text samples into {'name{labels}': value}, checking every line's syntax."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        match = re.fullmatch(r'([a-z_]+(?:\{[a-z_]+="[^"\\]*"(?:,[a-z_]+="[^"\\]*")*\})?) (-?[0-9.e+-]+)', line)
        assert match, f"not a Prometheus sample line: {line!r}"
        samples[match.group(1)] = float(match.group(2))
    return samples


def test_it_serves_the_same_figures_as_prometheus_text(operator, scenario, api_client_for):
    v1 = scenario["v1"]
    client = api_client_for(operator)
    for url in ("/api/kv/metrics?format=prometheus", "/metrics"):
        response = client.get(url)
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        s = _samples(response.content.decode())
        assert s['mnesio_kv_configuration_info{backend="fake",model="fake-model",dtype="f32",quant="none",device="cpu"}'] == 1
        assert s["mnesio_log_head"] == 5
        assert s['mnesio_scope_lag_memories{scope="scope-a"}'] == 2 and s['mnesio_scope_lag_memories{scope="scope-c"}'] == 1
        assert s['mnesio_scope_serving{scope="scope-a"}'] == 1 and s['mnesio_scope_serving{scope="scope-c"}'] == 0
        assert s['mnesio_scope_active_size_bytes{scope="scope-a"}'] == v1.size_bytes
        assert s['mnesio_gate_evaluations_total{outcome="failed"}'] == 1
        assert s['mnesio_answer_latency_seconds{mode="cartridge",measure="total",quantile="0.95"}'] == 10.0
        assert s['mnesio_answer_latency_seconds{mode="text",measure="total",quantile="0.5"}'] == 12.0
        assert s['mnesio_cartridge_versions{state="destroyed"}'] == 1
        assert s['mnesio_cartridge_blobs{quant="none"}'] == 2
        assert s['mnesio_erasure_requests{status="pending"}'] == 1 and s['mnesio_erasure_requests{status="done"}'] == 1
        text = response.content.decode()
        assert "# TYPE mnesio_gate_evaluations_total counter" in text and "flowerpot" not in text


def test_it_escapes_label_values():
    from cartridges.metrics import _label_value

    assert _label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_it_needs_authentication_and_rejects_unknown_parameters(alice, scenario, api_client_for):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/kv/metrics").status_code == 401
    anonymous = APIClient().get("/metrics")
    assert anonymous.status_code == 401 and anonymous.content.startswith(b"# error:")
    assert_error(api_client_for(alice).get("/api/kv/metrics?window=5"), 400, "window")
    assert api_client_for(alice).get("/api/kv/metrics?format=xml").status_code == 404


def test_percentiles_use_the_nearest_rank():
    from cartridges.metrics import percentile

    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0 and percentile([4.0, 1.0, 3.0, 2.0], 95) == 4.0
