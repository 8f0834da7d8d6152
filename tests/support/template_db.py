"""One migrated PostgreSQL template per set of migrations, which every worker's test database is copied from.

Migrating costs a worker ~5 s of CPU (Django's migration graph and ~60 migrations) and PostgreSQL as much again;
copying a template (CREATE DATABASE ... TEMPLATE) costs a fraction of it. The template's name carries a hash of
every migration file and of the pinned requirements, so a changed migration builds a new one; it is built under a
PostgreSQL advisory lock by whichever worker gets there first, as ``<name>_building`` renamed when complete, so a
run killed halfway leaves no template that looks whole. Django then copies it (``TEST["TEMPLATE"]``) and its
migrate finds nothing to apply.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import django

from tests.support.procs import database_url

ROOT = Path(__file__).resolve().parents[2]
LOCK_KEY = 0x6D6E6573  # pg_advisory_lock's key for building the template ("mnes")


def migrations_hash() -> str:
    """A short hash of every migration file of the project's installed apps, of Django's version and of the pinned
    requirements (the other installed apps' migrations come with their versions)."""
    from django.apps import apps

    digest = hashlib.sha256(django.get_version().encode() + (ROOT / "requirements.txt").read_bytes())
    for config in apps.get_app_configs():  # the project's own apps: in this checkout, not in its virtualenv
        if Path(config.path).is_relative_to(ROOT) and not Path(config.path).is_relative_to(sys.prefix):
            for path in sorted(Path(config.path, "migrations").glob("*.py")):
                digest.update(f"{config.label}/{path.name}".encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def connect(settings_dict: dict, dbname: str):
    import psycopg

    return psycopg.connect(
        dbname=dbname, user=settings_dict.get("USER") or "postgres", password=settings_dict.get("PASSWORD") or None,
        host=settings_dict.get("HOST") or "127.0.0.1", port=settings_dict.get("PORT") or 5432, autocommit=True,
    )


def drop_other_templates(conn, settings_dict: dict, *, keep: str) -> None:
    """Drop the templates of other migrations; one that a run is copying right now stays (PostgreSQL refuses)."""
    import psycopg

    pattern = f"test_{settings_dict['NAME']}_template_%"
    # one with a connection is skipped up front: PostgreSQL would wait 5 s for it before refusing the drop
    for (other,) in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s AND datname NOT IN"
                                 " (SELECT datname FROM pg_stat_activity WHERE datname IS NOT NULL)", [pattern, keep]).fetchall():
        try:
            conn.execute(f'DROP DATABASE "{other}"')
        except psycopg.Error:
            pass  # in use by another checkout's run: it goes next time


def migrate(database_url: str) -> subprocess.CompletedProcess:
    """``manage.py migrate`` against ``database_url``, in a process of its own (the production settings)."""
    env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "mnesio_site.settings"}
    return subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def ensure_template(settings_dict: dict) -> str:
    """The name of a migrated template database for ``settings_dict``'s server, built if it is not there yet."""
    name = f"test_{settings_dict['NAME']}_template_{migrations_hash()}"
    building = f"{name}_building"
    with connect(settings_dict, "postgres") as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        try:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                return name
            conn.execute(f'DROP DATABASE IF EXISTS "{building}"')  # a build that was killed halfway
            conn.execute(f'CREATE DATABASE "{building}"')
            done = migrate(database_url(settings_dict, building))
            if done.returncode != 0:
                raise RuntimeError(f"migrating the template database failed:\n{done.stdout}\n{done.stderr}")
            conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
            drop_other_templates(conn, settings_dict, keep=name)
            return name
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
