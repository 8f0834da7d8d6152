"""`manage.py mnesio_demo`: scope, operator, token, memories, cases, a gated active cartridge, one question
through the API view, instructions; safe to run twice."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from cartridges.models import AnswerRecord, CartridgeActivation, CartridgeVersion, EvaluationCase
from cartridges.selectors import active_version
from memories.models import Memory, Scope

pytestmark = pytest.mark.django_db


def _run(**options) -> str:
    out = io.StringIO()
    call_command("mnesio_demo", stdout=out, **options)
    return out.getvalue()


def test_it_builds_a_served_demo_and_prints_how_to_use_it(settings, tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model
    from knox.crypto import hash_token
    from knox.models import AuthToken

    monkeypatch.delenv("MNESIO_DEMO_PASSWORD", raising=False)
    settings.DATA_DIR = tmp_path
    out = _run(base_url="http://127.0.0.1:8123")
    scope = Scope.objects.get(name="demo")
    operator = get_user_model().objects.get(username="operator")
    token = (tmp_path / "demo-api-token").read_text().strip()
    assert AuthToken.objects.get(user=operator).digest == hash_token(token)  # stored hashed; the secret in DATA_DIR
    assert oct((tmp_path / "demo-api-token").stat().st_mode & 0o777) == "0o600"
    assert operator.is_staff and operator.is_superuser and scope.grants.filter(user=operator).exists()
    assert Memory.objects.filter(scope=scope).count() == 12 and EvaluationCase.objects.filter(scope=scope).count() == 3
    version = active_version(scope=scope)
    assert version is not None and version.num_memories == 12 and version.created_by == operator
    activation = CartridgeActivation.objects.get()
    assert activation.actor == operator and activation.evaluation.passed
    records = AnswerRecord.objects.order_by("id")
    assert [(r.mode, r.version_id, r.actor) for r in records] == [("cartridge", version.pk, operator), ("text", None, operator)]
    assert "Biscuit" in out  # the fake answers with the memory that holds the answer
    assert f"API token: {token}" in out and "Dashboard: http://127.0.0.1:8123/dashboard/" in out
    assert f'curl -H "Authorization: Bearer {token}" http://127.0.0.1:8123/api/v1/kv/metrics' in out
    assert "/api/v1/scopes/demo/ask/" in out and "/api/scopes/" not in out and "gate: passed" in out
    password = (tmp_path / "demo-operator-password").read_text().strip()
    assert operator.check_password(password) and f"operator / password {password}" in out
    assert oct((tmp_path / "demo-operator-password").stat().st_mode & 0o777) == "0o600"


def test_it_is_safe_to_run_twice(settings, tmp_path, monkeypatch):
    from knox.models import AuthToken

    monkeypatch.delenv("MNESIO_DEMO_PASSWORD", raising=False)
    settings.DATA_DIR = tmp_path
    _run()
    first = (Memory.objects.count(), CartridgeVersion.objects.count(), CartridgeActivation.objects.count(),
             EvaluationCase.objects.count())
    out = _run()
    assert (Memory.objects.count(), CartridgeVersion.objects.count(), CartridgeActivation.objects.count(),
            EvaluationCase.objects.count()) == first == (12, 1, 1, 3)
    assert "0 memories appended (12 in all)" in out and "is active" in out
    password = (tmp_path / "demo-operator-password").read_text().strip()
    assert f"password {password}" in out  # the second run can still tell how to log in
    token = (tmp_path / "demo-api-token").read_text().strip()
    assert f"API token: {token}" in out and AuthToken.objects.count() == 1  # the same token, printed again


def test_a_given_password_is_set_and_not_stored(settings, tmp_path, monkeypatch):
    from django.contrib.auth import get_user_model

    settings.DATA_DIR = tmp_path
    monkeypatch.setenv("MNESIO_DEMO_PASSWORD", "correct-horse-battery")
    _run()
    assert get_user_model().objects.get(username="operator").check_password("correct-horse-battery")
    assert not (tmp_path / "demo-operator-password").exists()
