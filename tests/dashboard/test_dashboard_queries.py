"""The dashboard (page and self-refreshing fragment) runs a constant number of queries: one scope or six."""
from __future__ import annotations

import pytest

from tests.support import query_worlds

pytestmark = pytest.mark.django_db

# session, user, the user's and groups' permissions (2: cartridges.view_kv_metrics), kv_metrics (16, see
# tests/api/test_query_counts.py) and the latency chart's series (2)
DASHBOARD_QUERIES = 21


@pytest.mark.parametrize("num_scopes", [1, 6])
@pytest.mark.parametrize("url", ["/dashboard/", "/dashboard/?fragment=1"])
def test_the_dashboard_runs_the_same_queries_for_1_or_6_scopes(
    url, num_scopes, client, alice, operator, append, django_assert_num_queries
):
    scopes = query_worlds.scopes(user=alice, append=append, num_scopes=num_scopes)
    client.force_login(operator)
    with django_assert_num_queries(DASHBOARD_QUERIES):
        html = client.get(url).content.decode()
    assert all(f'<tr data-scope="{scope.name}">' in html for scope in scopes)
