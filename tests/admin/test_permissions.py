"""Operator permissions beyond is_staff: filing an erasure in every scope needs its own
permission, and the fake engine (whole memory texts as answers) is refused unless explicitly allowed. The
full matrix of admin actions x permission levels is tests/reliability/test_isolation.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from cartridges.models import KvConfiguration
from memories.models import ErasureRequest, Subject

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
SWITCH_TO_FAKE = {"backend": "fake", "model": "fake-model", "dtype": "f32", "quant": "q8"}


def _staff_with(django_user_model, *codenames: str):
    user = django_user_model.objects.create_user(username="sam", password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def test_filing_an_erasure_without_a_scope_needs_the_everywhere_permission(client, django_user_model, scope_a, append):
    append(scope_a, "Dana's locker code is 4417.", "dana")
    client.force_login(_staff_with(django_user_model, "add_erasurerequest", "view_erasurerequest"))
    dana = Subject.objects.get(external_id="dana").pk
    refused = client.post("/admin/memories/erasurerequest/add/", {"subject": dana, "reason": "asked", "scope": ""})
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert list(errors) == ["scope"] and "memories.erase_subject_everywhere" in errors["scope"][0]
    assert ErasureRequest.objects.count() == 0
    filed = client.post("/admin/memories/erasurerequest/add/", {"subject": dana, "reason": "asked", "scope": scope_a.pk})
    assert filed.status_code == 302 and ErasureRequest.objects.get().scope == scope_a


def test_an_operator_with_only_the_everywhere_permission_files_for_every_scope(client, django_user_model, scope_a,
                                                                               append):
    append(scope_a, "Dana's locker code is 4417.", "dana")
    client.force_login(_staff_with(django_user_model, "erase_subject_everywhere"))
    dana = Subject.objects.get(external_id="dana").pk
    one_scope = client.post("/admin/memories/erasurerequest/add/", {"subject": dana, "reason": "r", "scope": scope_a.pk})
    assert one_scope.status_code == 200 and "scope" in one_scope.context["adminform"].form.errors
    everywhere = client.post("/admin/memories/erasurerequest/add/", {"subject": dana, "reason": "r", "scope": ""})
    assert everywhere.status_code == 302 and ErasureRequest.objects.get().scope is None


def test_the_api_refuses_a_switch_to_the_fake_engine_unless_allowed(settings, operator, api_client_for):
    settings.MNESIO_ALLOW_FAKE_BACKEND = False
    before = KvConfiguration.objects.count()
    response = api_client_for(operator).post("/api/v1/kv/configuration/", data=SWITCH_TO_FAKE, format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["extra"]["field"] == "backend" and body["extra"]["allowed"] == ["transformers"]
    assert "`backend` has to be one of ['transformers'] but got 'fake'" in body["message"]
    assert "MNESIO_ALLOW_FAKE_BACKEND" in body["message"]
    assert KvConfiguration.objects.count() == before


def test_the_admin_does_not_offer_the_fake_engine_unless_allowed(settings, admin_client):
    settings.MNESIO_ALLOW_FAKE_BACKEND = False
    before = KvConfiguration.objects.count()
    page = admin_client.get("/admin/cartridges/kvconfiguration/add/").content.decode()
    assert 'value="transformers"' in page and 'value="fake"' not in page
    response = admin_client.post("/admin/cartridges/kvconfiguration/add/", SWITCH_TO_FAKE)
    assert response.status_code == 200 and "backend" in response.context["adminform"].form.errors
    assert KvConfiguration.objects.count() == before


def test_a_staff_user_without_the_switch_permission_is_refused_by_the_api(api_client_for, django_user_model):
    staff = _staff_with(django_user_model, "view_kvconfiguration")
    response = api_client_for(staff).post("/api/v1/kv/configuration/", data=SWITCH_TO_FAKE, format="json")
    assert response.status_code == 403 and "cartridges.switch_kvconfiguration" in response.json()["message"]


def test_settings_refuse_the_fake_engine_without_the_flag():
    env = {k: v for k, v in os.environ.items() if k != "MNESIO_ALLOW_FAKE_BACKEND"}
    show = ["manage.py", "shell", "-c", "from django.conf import settings; print(settings.MNESIO_KV_BACKEND)"]
    refused = subprocess.run([sys.executable, *show], cwd=ROOT, env={**env, "MNESIO_KV_BACKEND": "fake"},
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "ImproperlyConfigured" in refused.stderr
    assert "`MNESIO_KV_BACKEND` 'fake'" in refused.stderr and "MNESIO_ALLOW_FAKE_BACKEND=true" in refused.stderr
    allowed = subprocess.run([sys.executable, *show], cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**env, "MNESIO_KV_BACKEND": "fake", "MNESIO_ALLOW_FAKE_BACKEND": "true"})
    assert allowed.returncode == 0 and allowed.stdout.split()[-1] == "fake", allowed.stderr[-1500:]
