"""DATABASES["default"] from a database URL: django-environ's parse, limited to the engines this project runs on."""
from __future__ import annotations

import warnings
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

ENV = environ.Env()


def envdatabase(name: str, url: str, *, conn_max_age: int) -> dict[str, Any]:
    """Parse the database URL read from ``name`` with django-environ, accepting only the engines this project runs on."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unknown scheme is refused below, by name
            config = ENV.db_url_config(url)
    except (ValueError, KeyError) as exc:
        raise ImproperlyConfigured(f"`{name}` is not a database URL this project understands: {exc}") from None
    engine = config.get("ENGINE")
    if engine not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
        raise ImproperlyConfigured(f"`{name}` has to name 'sqlite' or 'postgres' but names {engine!r}")
    config = {**config, "CONN_MAX_AGE": conn_max_age}
    if engine == "django.db.backends.sqlite3":
        # Concurrent writers (the dev server plus in-process tasks) wait instead of failing at once.
        config.setdefault("OPTIONS", {})["timeout"] = 30
        # Every transaction takes SQLite's write lock at BEGIN, so a compile's subject check and its version
        # insert cannot interleave with an erasure's shred (cartridges.services.compile.manifest_subjects_lock).
        config["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    return config
