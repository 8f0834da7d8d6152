"""The data migration seals evaluation cases that were stored in plaintext, then the plaintext columns go."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

BEFORE = [("cartridges", "0003_blob_key_rewrap")]
MARKER = "wombat-abacus-2291"


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_it_seals_existing_plaintext_cases_and_drops_the_plaintext(scope_a):
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "cartridges"]
    try:
        old_apps = _migrate(BEFORE)
        OldCase = old_apps.get_model("cartridges", "EvaluationCase")
        case_id = OldCase.objects.create(scope_id=scope_a.pk, question=f"Where is the {MARKER}?", answers=[MARKER, "pot"]).pk
    finally:
        _migrate(latest)

    from cartridges.models import EvaluationCase
    from cartridges.selectors import evaluation_case_open

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {EvaluationCase._meta.db_table}")
        columns = [c.name for c in cursor.description]
        rows = cursor.fetchall()
    assert "question" not in columns and "answers" not in columns
    assert all(MARKER.encode() not in (bytes(v) if isinstance(v, (bytes, memoryview)) else str(v).encode()) for r in rows for v in r)
    opened = evaluation_case_open(case=EvaluationCase.objects.get(pk=case_id))
    assert opened.question == f"Where is the {MARKER}?" and opened.answers == [MARKER, "pot"] and not opened.erased


def test_it_can_be_reversed_while_the_master_key_is_configured(scope_a):
    from cartridges.services import evaluation_case_add

    case_id = evaluation_case_add(scope=scope_a, question=f"Where is the {MARKER}?", answers=[MARKER]).pk
    latest = [key for key in MigrationExecutor(connection).loader.graph.leaf_nodes() if key[0] == "cartridges"]
    try:
        old_apps = _migrate(BEFORE)
        row = old_apps.get_model("cartridges", "EvaluationCase").objects.get(pk=case_id)
        assert (row.question, row.answers) == (f"Where is the {MARKER}?", [MARKER])
    finally:
        _migrate(latest)
