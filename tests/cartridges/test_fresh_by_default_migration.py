"""New scopes refresh on append after 2 s; scopes that existed before keep the manual refresh they had."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BEFORE = [("cartridges", "0013_routed_layout")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def test_existing_scopes_keep_manual_and_new_ones_refresh_on_append(scope_a):
    from cartridges.selectors import scope_settings_get
    from cartridges.services import scope_settings_update
    from memories.services import scope_create

    tuned = scope_create(name="tuned")
    scope_settings_update(scope=tuned, auto_refresh="on_append", auto_refresh_debounce_s=30)
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "cartridges"]
    try:
        _migrate(BEFORE)
    finally:
        _migrate(latest)
    new = scope_create(name="new-scope")

    read = {s.name: scope_settings_get(scope=s) for s in (scope_a, tuned, new)}
    assert (read["scope-a"].auto_refresh, read["scope-a"].auto_refresh_debounce_s) == ("manual", 60)
    assert (read["tuned"].auto_refresh, read["tuned"].auto_refresh_debounce_s) == ("on_append", 30)
    assert (read["new-scope"].auto_refresh, read["new-scope"].auto_refresh_debounce_s) == ("on_append", 2)
