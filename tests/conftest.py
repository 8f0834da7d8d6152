"""Shared fixtures: the actors (alice owns scope A, bob is in A's team, charlie has no access to A)
and the real default model, loaded once per test session."""
from __future__ import annotations

import contextlib
import os

import pytest

# redis_clean, start_worker and fake_row: the Celery worker harness's fixtures, for every package
pytest_plugins = ["tests.support.worker"]


# A test that requests one of these fixtures gets the marker, so that a marker expression (bin/test-fast) deselects
# every test of that kind, marked by hand or not.
MARKING_FIXTURES = {
    "real_backend": "model", "real_engine": "model", "small_blocks": "model", "long_blocks": "model",
    "start_worker": "celery_worker", "browser_page": "browser",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker in sorted({MARKING_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in MARKING_FIXTURES}):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)


def pytest_runtest_setup(item):
    """Skip tests marked ``postgres`` when the database is not PostgreSQL."""
    if item.get_closest_marker("postgres") is not None:
        from django.db import connection

        if connection.vendor != "postgresql":
            pytest.skip("needs PostgreSQL (set DATABASE_URL=postgres://...)")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """On PostgreSQL, each worker's test database is a copy of one migrated template (tests/support/template_db.py)."""
    from django.conf import settings

    from tests.support.template_db import ensure_template

    default = settings.DATABASES["default"]
    if default["ENGINE"] == "django.db.backends.postgresql":
        default.setdefault("TEST", {})["TEMPLATE"] = ensure_template(default)


@pytest.fixture(scope="session")
def real_backend():
    """The real default model (SmolLM2-135M-Instruct, f32 on CPU), loaded once per session (once per xdist worker)."""
    from kvengine import make_backend

    return make_backend("transformers", dtype="f32", quant="none", device="cpu")


@pytest.fixture
def small_gate(settings):
    """A one-probe gate with short decodes, for tests where activating a real-model version is only setup."""
    settings.MNESIO_GATE_NUM_AUTO_PROBES, settings.MNESIO_GATE_MAX_NEW_TOKENS = 1, 4
    settings.MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = 2


@pytest.fixture(autouse=True)
def fresh_engine():
    """Empty this process's cartridge LRU around each test (backends stay loaded): no test sees another's cache; no
    refresh timer or background job outlives its test."""
    from cartridges import engine
    from cartridges.services.refresh import refresh_timers_cancel, refresh_timers_join
    from core.jobs import background_jobs_join

    engine.cache_clear()
    yield
    # scopes refresh on append after a short debounce by default, and forgetting rebuilds in a background thread:
    # neither may outlive its test (it would compile or erase in the next test's database)
    refresh_timers_cancel()
    assert refresh_timers_join(60) and background_jobs_join(60), "a refresh or background job outlived its test"
    engine.cache_clear()


@contextlib.contextmanager
def celery_eager(on: bool):
    """Run Celery tasks in-process (True) or through the broker (False) inside the block, then restore."""
    from mnesio_site.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = on
    try:
        yield
    finally:
        app.conf.task_always_eager = before


@pytest.fixture
def eager_tasks():
    """Run Celery tasks in-process (the embedded default's mode) for tests that start no worker."""
    with celery_eager(True):
        yield


@pytest.fixture
def append():
    """Append memories: append(scope, "text", subject=None) -> Memory."""
    from memories.services import memory_append

    def do(scope, content, subject=None):
        return memory_append(scope=scope, subject=subject, content=content)

    return do


# What an operator may do besides viewing (Meta.permissions of the models; tests/reliability/test_isolation.py
# checks that each admin action and operator write needs its own).
OPERATOR_PERMISSIONS = [
    "memories.add_erasurerequest", "memories.process_erasurerequest", "memories.erase_subject_everywhere",
    "cartridges.compile_cartridge", "cartridges.evaluate_cartridge", "cartridges.activate_cartridge",
    "cartridges.switch_kvconfiguration", "cartridges.add_evaluationcase", "cartridges.view_kv_metrics",
]


@pytest.fixture
def operator(db):
    """A staff user (an operator) holding the operator permissions, with no scope grants."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.db.models import Q

    user = get_user_model().objects.create_user(
        username="olga", email="olga@example.com", password="x-olga-operator", is_staff=True
    )
    wanted = Q()
    for dotted in OPERATOR_PERMISSIONS:
        app_label, codename = dotted.split(".")
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    user.user_permissions.add(*Permission.objects.filter(wanted))
    return user


@pytest.fixture
def artifacts_dir(tmp_path_factory):
    """Where tests keep artifacts (screenshots, reports): $MNESIO_TEST_ARTIFACTS or a temp dir."""
    from pathlib import Path

    path = Path(os.environ.get("MNESIO_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------------------
# Actors: scope A is alice's (bob is in her team), scope C is charlie's; charlie has no grant on A.
# ---------------------------------------------------------------------------
def _user(username: str):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username=username, email=f"{username}@example.com", password="x-" + username)


@pytest.fixture
def scope_a(db):
    """Scope A (name ``scope-a``)."""
    from memories.services import scope_create

    return scope_create(name="scope-a", description="alice's agent")


@pytest.fixture
def scope_c(db):
    """Scope C (name ``scope-c``)."""
    from memories.services import scope_create

    return scope_create(name="scope-c", description="charlie's agent")


def _granted(username: str, scope):
    from memories.services import scope_grant

    user = _user(username)
    scope_grant(scope=scope, user=user)
    return user


@pytest.fixture
def alice(scope_a):
    """The user who owns scope A (granted it)."""
    return _granted("alice", scope_a)


@pytest.fixture
def bob(scope_a):
    """A member of A's team: granted scope A too."""
    return _granted("bob", scope_a)


@pytest.fixture
def charlie(scope_c):
    """Has no grant on scope A; granted scope C."""
    return _granted("charlie", scope_c)


@pytest.fixture
def api_client_for(db):
    """Factory: user -> DRF APIClient authenticated with a new API token of the user (knox, stored hashed)."""
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    def make(user):
        _, key = AuthToken.objects.create(user=user)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client

    return make
