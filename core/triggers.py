"""Only a superuser session may skip the append-only triggers.

Every trigger django-pgtrigger generates first asks ``_pgtrigger_should_ignore(TG_NAME)``, which reads the
session setting ``pgtrigger.ignore``: any role may set a custom setting, so any SQL client that can write a
table could switch its UPDATE/DELETE/TRUNCATE protection off. pgtrigger re-creates that function with each
trigger it installs, so after every ``migrate`` (post_migrate) it is replaced by the same function that
first returns false unless the session's current role is a superuser (who could disable triggers anyway).
The test-database flush runs as a superuser and keeps working. What remains: a superuser, and the role that
owns the tables (``ALTER TABLE ... DISABLE TRIGGER``); run the application with a role that owns nothing it
does not have to (docs/guarantees.md, "The log").
"""
from __future__ import annotations

from typing import Any

from django.db import connections

HARDENED_FUNCTION = """
CREATE OR REPLACE FUNCTION {name}(trigger_name NAME)
RETURNS BOOLEAN AS $$
    DECLARE
        _pgtrigger_ignore TEXT[];
    BEGIN
        -- mnesio (core/triggers.py): only a superuser session may skip the append-only triggers
        IF CURRENT_SETTING('is_superuser') <> 'on' THEN
            RETURN FALSE;
        END IF;
        BEGIN
            SELECT INTO _pgtrigger_ignore CURRENT_SETTING('pgtrigger.ignore');
            EXCEPTION WHEN OTHERS THEN
        END;
        RETURN COALESCE(trigger_name = ANY(_pgtrigger_ignore), FALSE);
    END;
$$ LANGUAGE plpgsql;
"""


def ignore_switch_harden(*, using: str = "default", **_: Any) -> None:
    """Replace pgtrigger's ignore function with the superuser-only one (PostgreSQL only; safe to repeat)."""
    from pgtrigger import features

    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    name = f'"{features.schema()}"._pgtrigger_should_ignore'
    with connection.cursor() as cursor:
        cursor.execute(HARDENED_FUNCTION.format(name=name))
