"""GET /api/v1/kv/metrics (and its Prometheus text) checked field by field against a scenario with known counts."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.test import override_settings
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cartridges.metrics import MODES
from cartridges.models import AnswerRecord
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, cartridge_evaluate
from memories.services import erasure_request_file, erasure_request_process
from tests.support.blobs import tamper
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

# A kv_metrics() dict with nothing in it, for rendering without a database scenario.
EMPTY_METRICS = {
    "generated_at": None, "log_head": 0, "configuration": None, "scopes": [], "gate": {"passed": 0, "failed": 0},
    "latency": {"window": 200, **{mode: {"count": 0, "ttft_p50_s": None, "ttft_p95_s": None, "total_p50_s": None,
                                         "total_p95_s": None} for mode in ("cartridge", "text")}},
    "versions": {"compiled": 0, "active": 0, "failed": 0, "destroyed": 0}, "sizes_by_quant": [],
    "erasures": {"pending": 0, "done": 0, "failed": 0},
}


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
    response = api_client_for(operator).get("/api/v1/kv/metrics")
    assert response.status_code == 200, response.content
    m = response.json()
    assert set(m) == {"generated_at", "log_head", "configuration", "scopes", "gate", "latency", "versions",
                      "sizes_by_quant", "erasures", "asks", "routed"}
    assert (m["routed"]["repair"], m["routed"]["chunk_quant"]) == ("full", "q8")
    assert m["asks"] == {"in_flight": 0, "limit": 32, "async_pending": 0, "async_limit": 64}
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
    assert (a["layout"], a["routed_chunks"]) == ("auto", {"count": 0, "size_bytes": 0})

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
    a = api_client_for(alice).get("/api/v1/kv/metrics").json()
    assert [s["scope"] for s in a["scopes"]] == ["scope-a"]
    assert a["versions"] == {"compiled": 2, "failed": 1, "destroyed": 0, "active": 1}
    assert (a["latency"]["text"]["count"], a["latency"]["text"]["total_p95_s"]) == (10, 20.0)
    assert a["erasures"] == {"pending": 1, "done": 0, "failed": 0}
    c = api_client_for(charlie).get("/api/v1/kv/metrics/").json()
    assert [s["scope"] for s in c["scopes"]] == ["scope-c"]
    assert (c["gate"]["passed"], c["gate"]["failed"], c["gate"]["recent"]) == (0, 0, [])
    assert c["versions"] == {"compiled": 1, "failed": 0, "destroyed": 1, "active": 0}
    assert c["erasures"] == {"pending": 0, "done": 1, "failed": 0}


def _staff(username: str, *permissions: str):
    """A staff user holding only ``permissions`` (view-only staff, as a hostile tenant's operator could be)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username=username, password="x-" + username, is_staff=True)
    for dotted in permissions:
        app_label, codename = dotted.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def test_staff_without_the_metrics_permission_see_only_the_scopes_granted_to_them(
        alice, bob, charlie, scenario, api_client_for, client):

    charlie.is_staff = True  # charlie turns staff, with no permission: still only scope C's figures
    charlie.save(update_fields=["is_staff"])
    viewer = _staff("vera", "memories.view_scope", "cartridges.view_cartridgeversion")  # view-only staff, no grants
    for user, shown in ((charlie, ["scope-c"]), (viewer, []), (bob, ["scope-a"])):
        api = api_client_for(user)
        body = api.get("/api/v1/kv/metrics").json()
        assert [row["scope"] for row in body["scopes"]] == shown, user.username
        for url in ("/api/v1/kv/metrics?format=prometheus", "/metrics"):
            text = api.get(url).content.decode()
            hidden = {"scope-a", "scope-c"} - set(shown)
            assert not any(f'scope="{name}"' in text for name in hidden), (user.username, url)
            assert "mnesio_answer_total_seconds" not in text  # the histograms count every scope's answers
        if user.is_staff:
            client.force_login(user)
            assert client.get("/dashboard/").status_code == 403
            assert client.get("/dashboard/?fragment=1").status_code == 403
            index = client.get("/admin/").content.decode()
            assert "scope-a" not in index and "scope-c" not in index  # the admin index's metrics panel
    operator = _staff("mona", "cartridges.view_kv_metrics")
    body = api_client_for(operator).get("/api/v1/kv/metrics").json()
    assert [row["scope"] for row in body["scopes"]] == ["scope-a", "scope-c"]
    client.force_login(operator)
    dashboard = client.get("/dashboard/")
    assert dashboard.status_code == 200 and "scope-a" in dashboard.content.decode()


def _families(text: str) -> dict[str, Metric]:
    """Parse Prometheus text with prometheus_client's own parser (it refuses malformed lines)."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def _samples(families: dict[str, Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_it_serves_the_same_figures_as_prometheus_text(operator, scenario, api_client_for):
    v1 = scenario["v1"]
    client = api_client_for(operator)
    for url in ("/api/v1/kv/metrics?format=prometheus", "/metrics"):
        response = client.get(url)
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.content.decode()
        families = _families(text)
        s = _samples(families)
        assert _value(s, "mnesio_kv_configuration_info", backend="fake", model="fake-model", dtype="f32", quant="none",
                      device="cpu") == 1
        assert _value(s, "mnesio_log_head") == 5
        assert _value(s, "mnesio_scope_lag_memories", scope="scope-a") == 2
        assert _value(s, "mnesio_scope_lag_memories", scope="scope-c") == 1
        assert _value(s, "mnesio_scope_serving", scope="scope-a") == 1
        assert _value(s, "mnesio_scope_serving", scope="scope-c") == 0
        assert _value(s, "mnesio_scope_active_size_bytes", scope="scope-a") == v1.size_bytes
        assert ("mnesio_scope_active_size_bytes", (("scope", "scope-c"),)) not in s  # nothing serves scope C
        assert _value(s, "mnesio_gate_evaluations_total", outcome="failed") == 1
        assert _value(s, "mnesio_gate_evaluations_total", outcome="passed") == 1
        assert _value(s, "mnesio_answer_latency_seconds", mode="cartridge", measure="total", quantile="0.95") == 10.0
        assert _value(s, "mnesio_answer_latency_seconds", mode="text", measure="total", quantile="0.5") == 12.0
        assert _value(s, "mnesio_answer_latency_window_answers", mode="text") == 11
        assert _value(s, "mnesio_cartridge_versions", state="destroyed") == 1
        assert _value(s, "mnesio_cartridge_blobs", quant="none") == 2
        assert _value(s, "mnesio_erasure_requests", status="pending") == 1
        assert _value(s, "mnesio_erasure_requests", status="done") == 1
        assert families["mnesio_gate_evaluations"].type == "counter"
        assert families["mnesio_answer_total_seconds"].type == "histogram"
        assert families["mnesio_answer_ttft_seconds"].type == "histogram"
        assert "# TYPE mnesio_gate_evaluations_total counter" in text and "flowerpot" not in text


def _histogram_counts(client: Any, name: str, mode: str) -> tuple[float, float, dict[str, float]]:
    """(_count, _sum, {le: cumulative count}) of one mode of a latency histogram, as served by /metrics."""
    s = _samples(_families(client.get("/metrics").content.decode()))
    buckets = {dict(labels)["le"]: v for (n, labels), v in s.items() if n == f"{name}_bucket" and dict(labels)["mode"] == mode}
    return _value(s, f"{name}_count", mode=mode), _value(s, f"{name}_sum", mode=mode), buckets


def test_answers_in_this_process_show_up_as_histogram_counts(operator, alice, scope_a, append, api_client_for):
    """Two answers add two to each histogram's _count (the AnswerRecords made directly in `scenario` do not count:
    the histograms are observed by the process that answers, where the answer is recorded)."""
    append(scope_a, "The spare key is under the blue flowerpot.")
    cartridge_activate(version=cartridge_compile(scope=scope_a), actor=alice)
    client = api_client_for(operator)
    before = {(name, mode): _histogram_counts(client, name, mode)
              for name in ("mnesio_answer_total_seconds", "mnesio_answer_ttft_seconds") for mode in MODES}
    records_before = AnswerRecord.objects.filter(mode="cartridge").count()
    first = cartridge_answer(scope=scope_a, question="Where is the spare key?", mode="cartridge")
    second = cartridge_answer(scope=scope_a, question="Where is the spare key?", mode="cartridge")
    assert AnswerRecord.objects.filter(mode="cartridge").count() - records_before == 2
    count, total, buckets = _histogram_counts(client, "mnesio_answer_total_seconds", "cartridge")
    count_0, total_0, buckets_0 = before[("mnesio_answer_total_seconds", "cartridge")]
    assert count - count_0 == 2 and buckets["+Inf"] == count  # _count equals the number of answers
    assert total - total_0 == pytest.approx(first.total_s + second.total_s)
    assert all(buckets[le] >= buckets_0[le] for le in buckets) and len(buckets) == 15  # 14 bounds + Inf
    ttft_count, _, _ = _histogram_counts(client, "mnesio_answer_ttft_seconds", "cartridge")
    assert ttft_count - before[("mnesio_answer_ttft_seconds", "cartridge")][0] == 2
    # the other mode is exposed, unchanged
    assert _histogram_counts(client, "mnesio_answer_total_seconds", "text")[0] == before[("mnesio_answer_total_seconds", "text")][0]
    # the API's own spelling serves the same histograms
    s = _samples(_families(client.get("/api/v1/kv/metrics?format=prometheus").content.decode()))
    assert _value(s, "mnesio_answer_total_seconds_count", mode="cartridge") == count


def test_a_client_gets_no_histograms_since_they_count_every_scope(alice, scenario, api_client_for):
    families = _families(api_client_for(alice).get("/metrics").content.decode())
    assert "mnesio_answer_total_seconds" not in families and "mnesio_answer_ttft_seconds" not in families
    assert "mnesio_scope_serving" in families


def test_the_histograms_sum_across_processes_in_multiprocess_mode(tmp_path):
    """With PROMETHEUS_MULTIPROC_DIR, answers observed by other processes show in this one's scrape."""
    script = (
        "from prometheus_client import Histogram\n"
        "h = Histogram('mnesio_answer_total_seconds', 'x', ['mode'], buckets=(0.005, 1.0, 60.0))\n"
        "h.labels(mode='cartridge').observe(0.5)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):  # two worker processes, one answer each
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    from cartridges import prometheus

    with override_settings(PROMETHEUS_MULTIPROC_DIR=str(tmp_path)):
        s = _samples(_families(prometheus.render(EMPTY_METRICS).decode()))
    assert _value(s, "mnesio_answer_total_seconds_count", mode="cartridge") == 2
    assert _value(s, "mnesio_answer_total_seconds_sum", mode="cartridge") == 1.0


def test_it_escapes_label_values():
    from cartridges import prometheus

    data = {**EMPTY_METRICS, "scopes": [{"scope": 'a"b\\c\nd', "activated_version_id": None, "serving": False,
                                         "lag": 3, "active_version": None}]}
    text = prometheus.render(data).decode()
    assert 'scope="a\\"b\\\\c\\nd"' in text
    assert _value(_samples(_families(text)), "mnesio_scope_lag_memories", scope='a"b\\c\nd') == 3


def test_it_needs_authentication_and_rejects_unknown_parameters(alice, scenario, api_client_for):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/kv/metrics").status_code == 401
    anonymous = APIClient().get("/metrics")
    assert anonymous.status_code == 401 and anonymous.content.startswith(b"# error:")
    assert_error(api_client_for(alice).get("/api/v1/kv/metrics?window=5"), 400, "window")
    assert api_client_for(alice).get("/api/v1/kv/metrics?format=xml").status_code == 404


def test_percentiles_use_the_nearest_rank():
    from cartridges.metrics import percentile

    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0 and percentile([4.0, 1.0, 3.0, 2.0], 95) == 4.0


def test_a_token_limited_to_some_scopes_shows_only_those_even_to_staff_with_the_permission(scenario):
    from rest_framework.test import APIClient

    from memories.models import Scope, ScopeGrant
    from memories.services import api_token_create

    operator = _staff("mona", "cartridges.view_kv_metrics")
    ScopeGrant.objects.create(scope=Scope.objects.get(name="scope-a"), user=operator)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_create(user=operator, scopes=['scope-a'])[1]}")
    body = api.get("/api/v1/kv/metrics").json()
    assert [row["scope"] for row in body["scopes"]] == ["scope-a"]
    assert body["erasures"] == {"pending": 1, "done": 0, "failed": 0}  # scope C's erasure is not counted
    for url in ("/api/v1/kv/metrics?format=prometheus", "/metrics"):
        text = api.get(url).content.decode()
        assert 'scope="scope-c"' not in text and 'scope="scope-a"' in text, url
        assert "mnesio_answer_total_seconds" not in text, url  # the histograms count every scope's answers
