from __future__ import annotations

from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "mnesio core"

    def ready(self) -> None:
        """After every migrate, harden the function the append-only triggers consult (core.triggers)."""
        from django.db.models.signals import post_migrate

        from .triggers import ignore_switch_harden

        post_migrate.connect(ignore_switch_harden, sender=self, dispatch_uid="core-harden-pgtrigger-ignore")
        # JSON logs with the request id, carried into Celery tasks (core.observability)
        from .observability import celery_signals_connect, structlog_configure

        structlog_configure()
        celery_signals_connect()
