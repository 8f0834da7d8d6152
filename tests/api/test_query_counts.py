"""Hot API reads run a constant number of queries per page: one version or a dozen, one scope or six."""
from __future__ import annotations

import pytest

from tests.support import query_worlds

pytestmark = pytest.mark.django_db

# token auth, scope + grant, page count, page (state annotations), its evaluations and activations, the
# active configuration, the page's erased-subject check, and active_version for the body's active_version
VERSION_LIST_QUERIES = 13  # 12 + the per-request check of cached cartridges (a compile leaves its cartridge in the LRU)
# token auth, the client's scopes, the scopes (annotated), heads, the activated versions, the configuration,
# the erased-subject check, lags, gate (2), latency (2), version counts, sizes, erasures, the configuration summary
KV_METRICS_CLIENT_QUERIES = 17
KV_METRICS_OPERATOR_QUERIES = 18  # the same without the client's scopes, with its permissions (user's, groups')


@pytest.mark.parametrize("num_versions", [2, 12])
def test_the_version_list_runs_the_same_queries_for_2_or_12_versions(
    num_versions, alice, scope_a, append, api_client_for, django_assert_num_queries
):
    made = query_worlds.versions(scope=scope_a, append=append, num_versions=num_versions)
    client = api_client_for(alice)
    with django_assert_num_queries(VERSION_LIST_QUERIES):
        body = client.get("/api/v1/scopes/scope-a/cartridges/").json()
    states = [version["state"] for version in body["results"]]
    assert states == ["active", *["passed"] * (num_versions - 2), "superseded"]
    assert body["active_version"] == made[-1].pk and body["count"] == num_versions


@pytest.mark.parametrize("num_scopes", [1, 6])
def test_kv_metrics_run_the_same_queries_for_1_or_6_scopes(
    num_scopes, alice, operator, append, api_client_for, django_assert_num_queries
):
    query_worlds.scopes(user=alice, append=append, num_scopes=num_scopes)
    client, operator_client = api_client_for(alice), api_client_for(operator)
    with django_assert_num_queries(KV_METRICS_CLIENT_QUERIES):
        body = client.get("/api/v1/kv/metrics").json()
    counted = [row for row in body["scopes"] if row["scope"].startswith("counted-")]
    assert [(row["serving"], row["lag"]) for row in counted] == [(True, 1)] * num_scopes
    with django_assert_num_queries(KV_METRICS_OPERATOR_QUERIES):
        assert operator_client.get("/api/v1/kv/metrics").json()["versions"]["active"] == num_scopes
    with django_assert_num_queries(KV_METRICS_OPERATOR_QUERIES):  # the Prometheus scrape reads the same
        assert operator_client.get("/metrics").status_code == 200
