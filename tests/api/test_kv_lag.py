"""Each scope's lag behind its log, in memories and in seconds: /api/v1/kv/metrics, Prometheus text and the dashboard."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cartridges.metrics import kv_metrics
from cartridges.services import cartridge_activate, cartridge_compile
from memories.models import Memory

pytestmark = pytest.mark.django_db


@pytest.fixture
def lagging(scope_a, scope_c, append, fake_engine):
    """Scope A served at head 2 with seqs 3 and 4 appended since; scope C with one memory and no cartridge."""
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Evan drinks green tea.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    append(scope_a, "The car is parked on level 3.")
    append(scope_a, "The plants need water on Fridays.")
    append(scope_c, "Dora's cat sleeps on the piano.")
    return {"a_oldest_unserved": Memory.objects.get(seq=3).created_at, "c_oldest": Memory.objects.get(seq=5).created_at}


def _rows(data) -> dict:
    return {row["scope"]: row for row in data["scopes"]}


def test_the_lag_in_seconds_is_the_age_of_the_oldest_memory_not_served(lagging):
    now = timezone.now() + timedelta(seconds=90)
    rows = _rows(kv_metrics(now=now))
    assert rows["scope-a"]["lag"] == 2
    assert rows["scope-a"]["lag_s"] == round((now - lagging["a_oldest_unserved"]).total_seconds(), 3)
    assert rows["scope-c"]["lag"] == 1  # no cartridge: every memory waits, since the oldest was appended
    assert rows["scope-c"]["lag_s"] == round((now - lagging["c_oldest"]).total_seconds(), 3)


def test_a_served_scope_has_no_lag(scope_a, append, fake_engine):
    append(scope_a, "The spare key is under the blue flowerpot.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    row, = kv_metrics()["scopes"]
    assert (row["lag"], row["lag_s"]) == (0, 0.0)


def test_a_client_sees_the_lag_of_its_own_scopes_only(alice, charlie, lagging, api_client_for):
    a = api_client_for(alice).get("/api/v1/kv/metrics").json()
    assert [(s["scope"], s["lag"]) for s in a["scopes"]] == [("scope-a", 2)] and a["scopes"][0]["lag_s"] > 0
    c = api_client_for(charlie).get("/api/v1/kv/metrics").json()
    assert [(s["scope"], s["lag"]) for s in c["scopes"]] == [("scope-c", 1)]
    text = api_client_for(charlie).get("/api/v1/kv/metrics?format=prometheus").content.decode()
    assert 'mnesio_scope_lag_seconds{scope="scope-c"}' in text and "scope-a" not in text


def test_prometheus_and_the_dashboard_show_the_lag_in_seconds(operator, lagging, api_client_for, client):
    text = api_client_for(operator).get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {s.labels["scope"]: s.value for s in families["mnesio_scope_lag_seconds"].samples}
    assert set(samples) == {"scope-a", "scope-c"} and samples["scope-a"] > 0 and samples["scope-c"] > 0
    client.force_login(operator)
    html = client.get("/dashboard/").content.decode()
    assert 'data-field="lag_s"' in html and html.count('data-field="lag_s"') == 2
    assert '<td class="nowrap" data-field="gate">full · ' in html  # the recent gate results say which gate ran


def test_the_lag_adds_no_query_per_scope(scope_a, scope_c, append, fake_engine, django_assert_num_queries):
    append(scope_a, "The spare key is under the blue flowerpot.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        kv_metrics()
    for i in range(3):
        append(scope_c, f"Crate {i} holds apples.")
    cartridge_activate(version=cartridge_compile(scope=scope_c))
    append(scope_c, "Crate 9 holds figs.")
    with django_assert_num_queries(len(one.captured_queries)):
        rows = {row["scope"]: row for row in kv_metrics()["scopes"]}
    assert rows["scope-c"]["lag"] == 1 and rows["scope-c"]["lag_s"] >= 0
