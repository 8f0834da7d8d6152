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


def _worker_environment(worker: str, environ: dict[str, str]) -> dict[str, str]:
    """What a pytest-xdist worker (``gw0``, ``gw1``, ...) changes so that no two workers share anything: the
    Redis db (REDIS_URL's number plus the worker's index, and the Celery URLs alike; pub/sub channels carry the
    db number, cartridges/channels.py), the private redis-server's port of the broker fault tests, and the data
    directory (the demo's token and password files). pytest-django gives each worker its own test database."""
    from pathlib import Path
    from urllib.parse import urlsplit, urlunsplit

    index = int(worker.removeprefix("gw"))

    def shifted(url: str) -> str:
        parts = urlsplit(url)
        if not parts.scheme.startswith("redis"):
            return url
        db = int(parts.path.strip("/") or 0) + index
        return urlunsplit(parts._replace(path=f"/{db}"))

    values = {name: shifted(environ[name]) for name in ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")
              if environ.get(name)}
    values["MNESIO_TEST_PRIVATE_REDIS_PORT"] = str(int(environ.get("MNESIO_TEST_PRIVATE_REDIS_PORT") or 6390) + index)
    data_dir = Path(environ.get("MNESIO_DATA_DIR") or Path(__file__).resolve().parents[1] / "var")
    values["MNESIO_DATA_DIR"] = str(data_dir / f"test-{worker}")
    return values


for _name, _value in _test_environment().items():
    if not os.environ.get(_name):
        os.environ[_name] = _value
# Once per worker process: a worker's subprocesses (celery workers, manage.py, bin/serve) inherit the changed values.
if os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("MNESIO_TEST_WORKER_ENV"):
    os.environ.update(_worker_environment(os.environ["PYTEST_XDIST_WORKER"], dict(os.environ)))
    os.environ["MNESIO_TEST_WORKER_ENV"] = os.environ["PYTEST_XDIST_WORKER"]
# Subprocesses started by tests load the real settings module with the environment above.
os.environ["DJANGO_SETTINGS_MODULE"] = "mnesio_site.settings"

from django.conf import global_settings  # noqa: E402

from mnesio_site.settings import *  # noqa: E402,F403

# Most tests make users with passwords: a fast hash, so that each one does not cost PBKDF2's million rounds
# (subprocesses keep the production hasher; they authenticate with tokens, and this process verifies theirs).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher", *global_settings.PASSWORD_HASHERS]

# The test client and the live server speak plain http (subprocesses keep the production values).
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
