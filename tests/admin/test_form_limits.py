"""Admin add forms answer input over the services' limits with a form error naming the field, not a 500."""
from __future__ import annotations

import pytest

from cartridges.models import EvaluationCase
from cartridges.selectors import evaluation_case_open
from memories.models import ErasureRequest, Subject
from memories.services import MAX_REASON_CHARS

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", email="root@example.com", password="pw")
    client.force_login(user)
    client.raise_request_exception = False  # a 500 must show up as a status here, not as an exception
    return client


def _errors(response) -> dict[str, list[str]]:
    return {name: list(errors) for name, errors in response.context["adminform"].form.errors.items()}


def test_an_erasure_reason_over_the_limit_is_a_form_error(superuser_client, scope_a, append):
    append(scope_a, "Dana's locker code is 4417.", "dana")
    response = superuser_client.post("/admin/memories/erasurerequest/add/", {
        "subject": Subject.objects.get(external_id="dana").pk, "reason": "r" * (MAX_REASON_CHARS + 1),
        "scope": scope_a.pk,
    })
    assert response.status_code == 200, response.status_code
    errors = _errors(response)
    assert list(errors) == ["reason"] and f"at most {MAX_REASON_CHARS} characters" in errors["reason"][0], errors
    assert ErasureRequest.objects.count() == 0


def test_an_evaluation_question_over_the_limit_is_a_form_error(superuser_client, settings, scope_a):
    settings.MNESIO_MAX_QUESTION_CHARS = 50
    response = superuser_client.post("/admin/cartridges/evaluationcase/add/", {
        "scope": scope_a.pk, "question": "q" * 51, "answers": "flowerpot",
    })
    assert response.status_code == 200, response.status_code
    errors = _errors(response)
    assert list(errors) == ["question"] and "at most 50 characters but got 51" in errors["question"][0], errors
    assert EvaluationCase.objects.count() == 0


def test_a_blank_evaluation_question_is_a_form_error(superuser_client, scope_a):
    response = superuser_client.post("/admin/cartridges/evaluationcase/add/", {
        "scope": scope_a.pk, "question": "   ", "answers": "flowerpot",
    })
    assert response.status_code == 200 and "question" in _errors(response)
    assert EvaluationCase.objects.count() == 0


def test_an_erasure_for_a_subject_without_memories_in_the_scope_is_a_form_error(superuser_client, scope_a, scope_c,
                                                                                append):
    append(scope_a, "Dana's locker code is 4417.", "dana")
    response = superuser_client.post("/admin/memories/erasurerequest/add/", {
        "subject": Subject.objects.get(external_id="dana").pk, "reason": "asked", "scope": scope_c.pk,
    })
    assert response.status_code == 200, response.status_code
    assert "has no memories in scope 'scope-c'" in _errors(response)["subject"][0]
    assert ErasureRequest.objects.count() == 0


def test_limits_within_bounds_still_file(superuser_client, scope_a, append):
    append(scope_a, "Dana's locker code is 4417.", "dana")
    response = superuser_client.post("/admin/memories/erasurerequest/add/", {
        "subject": Subject.objects.get(external_id="dana").pk, "reason": "r" * MAX_REASON_CHARS, "scope": scope_a.pk,
    })
    assert response.status_code == 302, _errors(response)
    assert ErasureRequest.objects.get().scope == scope_a
    response = superuser_client.post("/admin/cartridges/evaluationcase/add/", {
        "scope": scope_a.pk, "question": "Where is the spare key?", "answers": "flowerpot",
    })
    assert response.status_code == 302
    assert evaluation_case_open(case=EvaluationCase.objects.get()).answers == ["flowerpot"]
