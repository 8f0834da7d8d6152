"""LOGGING: every project logger to the console, one format for all (no memory plaintext is ever logged)."""
from __future__ import annotations

from typing import Any

PROJECT_LOGGERS = ("mnesio", "memories", "cartridges", "kvengine", "celery")


def logging_config(*, level: str, fmt: str) -> dict[str, Any]:
    """The LOGGING dict for MNESIO_LOG_LEVEL ``level`` and MNESIO_LOG_FORMAT ``fmt`` (a formatter's name)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {"()": "core.observability.JsonFormatter"},
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": fmt}},
        "root": {"handlers": ["console"], "level": "WARNING"},
        # the project's apps, and a worker's own lines (received, succeeded, a lost child) in the same format
        # (celery.py: no root hijack)
        "loggers": {name: {"handlers": ["console"], "level": level, "propagate": False} for name in PROJECT_LOGGERS},
    }
