"""A database connection dropped in the middle of an append (pg_terminate_backend from another connection):
no partial row, no gap, an error the client can retry, and the retry with the idempotency key gives one row."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import DatabaseError, connection

from memories.models import Memory
from memories.selectors import log_head
from memories.services import memory_append

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} user={s['USER'] or 'postgres'} dbname={s['NAME']}"


class HeldCounter:
    """Another client holding the log counter's row lock, so an append blocks at a known point mid-transaction."""

    def __init__(self):
        self.conn = psycopg.connect(_dsn(), autocommit=False)
        self.conn.execute("SELECT head FROM memories_loghead WHERE id = 1 FOR UPDATE")
        # pg_stat_activity is a snapshot per transaction: watch from a connection of its own, in autocommit
        self.watcher = psycopg.connect(_dsn(), autocommit=True)

    def blocked_backend(self, timeout: float = 30.0) -> int:
        """Return the pid of the backend waiting for the counter lock (the append in flight)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query ILIKE '%%memories_loghead%%' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row:
                return row[0]
            time.sleep(0.05)
        raise AssertionError("no append is waiting for the counter lock")

    def terminate(self, pid: int) -> None:
        assert self.watcher.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()
        self.watcher.close()


def _in_thread(fn):
    """Run ``fn`` in a thread with its own Django connection; return a dict that gets its result or exception."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as exc:  # the test inspects it
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    box["thread"] = thread
    return box


def test_a_dropped_connection_mid_append_leaves_nothing_and_the_retry_writes_one_row(scope_a, record_figures):
    memory_append(scope=scope_a, content="The first fact.")  # the counter row exists from here on
    head, count = log_head(), Memory.objects.count()

    held = HeldCounter()
    try:
        box = _in_thread(lambda: memory_append(scope=scope_a, content="The car is on level 3.", idempotency_key="car-1"))
        pid = held.blocked_backend()
        held.terminate(pid)
        box["thread"].join(30)
    finally:
        held.release()

    error = box.get("error")
    assert isinstance(error, DatabaseError), box  # an OperationalError/InterfaceError: the connection is gone
    assert "terminat" in str(error).lower() or "closed" in str(error).lower(), str(error)
    assert Memory.objects.count() == count and log_head() == head  # no partial row, no seq taken
    assert not Memory.objects.filter(idempotency_key="car-1").exists()

    retried = memory_append(scope=scope_a, content="The car is on level 3.", idempotency_key="car-1")
    again = memory_append(scope=scope_a, content="The car is on level 3.", idempotency_key="car-1")
    assert retried.appended and not again.appended and again.seq == retried.seq == head + 1  # no gap
    assert Memory.objects.filter(idempotency_key="car-1").count() == 1
    record_figures(scenario="connection dropped mid-append", error=type(error).__name__, rows_after_drop=0,
                   rows_after_two_retries=1, seq=retried.seq)


def test_the_api_answers_a_dropped_connection_with_a_retryable_503(alice, scope_a, api_client_for):
    memory_append(scope=scope_a, content="The first fact.")
    client = api_client_for(alice)
    client.raise_request_exception = False
    body = {"content": "The car is on level 3.", "idempotency_key": "car-2"}
    held = HeldCounter()
    try:
        box = _in_thread(lambda: client.post("/api/v1/scopes/scope-a/memories/", data=body, format="json"))
        held.terminate(held.blocked_backend())
        box["thread"].join(30)
    finally:
        held.release()
    response = box["result"]
    assert not Memory.objects.filter(idempotency_key="car-2").exists()
    assert client.post("/api/v1/scopes/scope-a/memories/", data=body, format="json").status_code == 201
    assert response.status_code == 503, response.status_code
    assert response["Retry-After"] == "5"
    body = response.json()
    assert "idempotency_key" in body["message"] and body["extra"]["kind"] == "database_unavailable"
    assert body["code"] == "database_unavailable"
    assert body["extra"]["error"] in ("OperationalError", "InterfaceError")
