"""The test suite's settings: the production-safe settings, with test secrets put into the environment first.

MNESIO_DEBUG defaults to false, and then ``mnesio_site.settings`` requires SECRET_KEY and the master key.
pytest-django imports this module (pyproject.toml) before any conftest.py runs. The values go into
``os.environ``, and only where unset, so every subprocess a test starts (celery workers, ``manage.py``)
inherits the same master key as the test process; those subprocesses load ``mnesio_site.settings`` itself.
"""
from __future__ import annotations

import base64
import os


def _test_environment() -> dict[str, str]:
    """What is set when absent: a master key for this session, a test SECRET_KEY, the fake engine allowed, manual
    refreshes."""
    values = {
        # The fake engine answers with whole memory texts: for tests only (settings refuse it otherwise).
        "MNESIO_ALLOW_FAKE_BACKEND": "true",
        # New scopes refresh by hand in tests: a test about refreshing opts in (settings.MNESIO_DEFAULT_AUTO_REFRESH
        # or the scope's settings); elsewhere a debounced refresh would compile in the middle of what a test counts.
        "MNESIO_DEFAULT_AUTO_REFRESH": "manual",
    }
    if not os.environ.get("SECRET_KEY_FILE"):
        values["SECRET_KEY"] = "mnesio-test-only-" + base64.urlsafe_b64encode(os.urandom(30)).decode()
    if not os.environ.get("MNESIO_MASTER_KEY_FILE"):
        values["MNESIO_MASTER_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
    return values


for _name, _value in _test_environment().items():
    if not os.environ.get(_name):
        os.environ[_name] = _value
# Subprocesses started by tests load the real settings module with the environment above.
os.environ["DJANGO_SETTINGS_MODULE"] = "mnesio_site.settings"

from mnesio_site.settings import *  # noqa: E402,F403

# The test client and the live server speak plain http (subprocesses keep the production values).
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
