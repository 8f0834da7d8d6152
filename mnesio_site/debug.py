"""The exception reporter filter: error pages and error log records show the traceback, never the values.

Django's ``SafeExceptionReporterFilter`` hides only variables marked ``sensitive_variables`` and only
when DEBUG is off; with ``MNESIO_DEBUG=true`` a 500 page would show master-key bytes, data keys and
memory plaintext in its frame variables. This filter is active always and hides every frame variable's
value and every POST value (names and source lines stay, so a traceback still says where it failed).
Settings whose name looks like a credential or a connection URL are hidden too.
"""
from __future__ import annotations

import re
from typing import Any

from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter


class SecretsExceptionReporterFilter(SafeExceptionReporterFilter):
    """Hide every frame variable's value, every POST value and credential-like settings, in debug or not."""

    # Django's pattern plus connection URLs (DATABASE_URL, REDIS_URL, CELERY_BROKER_URL carry passwords).
    hidden_settings = re.compile(r"API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|_URL$|DSN", flags=re.I)

    def is_active(self, request: HttpRequest | None) -> bool:
        return True  # Django's own filter is inactive with DEBUG on, exactly when pages show the most

    def get_post_parameters(self, request: HttpRequest | None) -> dict[str, str]:
        if request is None:
            return {}
        return {name: self.cleansed_substitute for name in request.POST}

    def get_traceback_frame_variables(self, request: HttpRequest | None, tb_frame: Any) -> list[tuple[str, str]]:
        # Any local may hold a key or plaintext (a data key, an opened memory, a question): show names only.
        return [(name, self.cleansed_substitute) for name in tb_frame.f_locals]
