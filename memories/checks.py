"""`manage.py check --database default`: refuse a deployment whose master key does not open the stored keys."""
from __future__ import annotations

from typing import Any

from django.core.checks import Error, Tags, register
from django.db import DatabaseError


@register(Tags.database)
def master_key_check(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Error]:
    """An error naming MNESIO_MASTER_KEY when some live wrapped key was wrapped by a master key not configured."""
    if not databases:
        return []
    from .keyring import master_key_verify

    try:
        report = master_key_verify()
    except DatabaseError:  # not migrated yet: nothing stored to check against
        return []
    if report.ok:
        return []
    return [Error(report.message(), hint="see docs/operating.md, Master-key rotation", id="memories.E001")]
