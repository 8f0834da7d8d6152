"""The workers' template database (tests/support/template_db.py): a build that fails leaves nothing that looks whole,
and templates of other migrations go unless a run is copying one. A made-up database name keeps these tests apart
from the suite's own template."""
from __future__ import annotations

import subprocess
import uuid

import pytest
from django.conf import settings

from tests.support import template_db

pytestmark = pytest.mark.postgres


@pytest.fixture
def server():
    """A settings dict for this PostgreSQL server under a name no other run uses; its databases dropped afterwards."""
    settings_dict = {**settings.DATABASES["default"], "NAME": f"tplcheck_{uuid.uuid4().hex[:8]}"}
    if settings_dict["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("needs PostgreSQL")
    yield settings_dict
    with template_db.connect(settings_dict, "postgres") as conn:
        for (name,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                    [f"test_{settings_dict['NAME']}_%"]).fetchall():
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _databases(settings_dict) -> set[str]:
    with template_db.connect(settings_dict, "postgres") as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"test_{settings_dict['NAME']}_%"])
        return {name for (name,) in rows.fetchall()}


def test_a_failed_build_leaves_no_template_that_looks_whole(server, monkeypatch):
    def failing_migrate(database_url):
        return subprocess.CompletedProcess([], returncode=1, stdout="", stderr="migrate was killed")

    monkeypatch.setattr(template_db, "migrate", failing_migrate)
    with pytest.raises(RuntimeError, match="migrate was killed"):
        template_db.ensure_template(server)
    name = f"test_{server['NAME']}_template_{template_db.migrations_hash()}"
    assert _databases(server) == {f"{name}_building"}  # half-built, under a name no worker copies


def test_a_half_built_template_is_dropped_and_built_again(server, monkeypatch):
    name = f"test_{server['NAME']}_template_{template_db.migrations_hash()}"
    with template_db.connect(server, "postgres") as conn:
        conn.execute(f'CREATE DATABASE "{name}_building"')  # what a killed build leaves
    with template_db.connect(server, f"{name}_building") as conn:
        conn.execute("CREATE TABLE leftover (id int)")
    monkeypatch.setattr(template_db, "migrate", lambda database_url: subprocess.CompletedProcess([], returncode=0))
    assert template_db.ensure_template(server) == name
    assert _databases(server) == {name}
    with template_db.connect(server, name) as conn:  # a new database, not the leftover renamed
        assert conn.execute("SELECT to_regclass('leftover')").fetchone()[0] is None


def test_other_templates_are_dropped_unless_a_run_is_copying_one(server):
    stale, copied = (f"test_{server['NAME']}_template_{suffix}" for suffix in ("stale", "copied"))
    with template_db.connect(server, "postgres") as conn:
        conn.execute(f'CREATE DATABASE "{stale}"')
        conn.execute(f'CREATE DATABASE "{copied}"')
        with template_db.connect(server, copied):  # in use, as while another run's worker copies it
            template_db.drop_other_templates(conn, server, keep=f"test_{server['NAME']}_template_new")
            assert _databases(server) == {copied}
