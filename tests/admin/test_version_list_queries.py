"""The admin's version list derives every row's state for the page at once: a constant number of queries."""
from __future__ import annotations

import pytest

from tests.support import query_worlds

pytestmark = pytest.mark.django_db

# session, user, the changelist's counts and page (state annotations), the scope filter's choices, the
# active configuration and the page's erased-subject check
VERSION_CHANGELIST_QUERIES = 13  # 12 + the per-request check of cached cartridges (a compile leaves its cartridge in the LRU)


@pytest.mark.parametrize("num_versions", [2, 12])
def test_the_version_list_runs_the_same_queries_for_2_or_12_versions(
    num_versions, admin_client, scope_a, append, django_assert_num_queries
):
    made = query_worlds.versions(scope=scope_a, append=append, num_versions=num_versions)
    with django_assert_num_queries(VERSION_CHANGELIST_QUERIES):
        html = admin_client.get("/admin/cartridges/cartridgeversion/").content.decode()
    assert html.count('<td class="field-state">active</td>') == 1
    assert html.count('<td class="field-state">superseded</td>') == 1
    assert html.count('<td class="field-state">passed</td>') == num_versions - 2
    assert f"{made[-1].pk}</a>" in html
