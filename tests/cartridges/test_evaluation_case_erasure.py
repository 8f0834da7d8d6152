"""Evaluation cases are sealed and linked to the subjects they concern; erasing a subject makes its cases
unreadable everywhere (API, admin, every column of the table) and the gate then runs without them."""
from __future__ import annotations

import pytest
from django.db import connection

from cartridges.models import EvaluationCase
from cartridges.services import cartridge_compile, cartridge_evaluate, evaluation_case_add
from memories.models import Subject
from memories.services import erasure_request_file, erasure_request_process

pytestmark = pytest.mark.django_db

MARKER = "quokka-lantern-9083"  # unique: quoted by bob's memory and by the case about it
URL = "/api/v1/scopes/scope-a/evaluation-cases/"


def _erase(subject: str) -> None:
    request = erasure_request_file(subject=subject, requested_by=None, reason="the person asked")
    erasure_request_process(erasure_request=request)


def _raw_table_text() -> str:
    """Every column of every evaluation-case row (and of its subject links), bytes decoded leniently."""
    chunks = []
    for table in (EvaluationCase._meta.db_table, EvaluationCase.subjects.through._meta.db_table):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            for row in cursor.fetchall():
                for value in row:
                    chunks.append(bytes(value).decode("latin-1") if isinstance(value, (bytes, memoryview)) else str(value))
    return "\n".join(chunks)


@pytest.fixture
def bobs_case(alice, scope_a, append, api_client_for):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, f"Bob's locker password is {MARKER}.", subject="bob")
    response = api_client_for(alice).post(
        URL, {"question": f"What is Bob's locker password ({MARKER})?", "answers": [MARKER]}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_a_case_quoting_an_erased_subjects_memory_is_unreadable_everywhere(
    alice, admin_client, scope_a, bobs_case, api_client_for, fake_engine, blob_root
):
    assert bobs_case["subjects"] == ["bob"]  # linked automatically: bob's memory holds the accepted answer
    assert MARKER not in _raw_table_text()  # sealed at rest from the start
    assert MARKER in api_client_for(alice).get(URL).content.decode()

    _erase("bob")

    listed = api_client_for(alice).get(URL).json()["results"]
    assert len(listed) == 1 and listed[0]["erased_at"] and listed[0]["question"] is None and listed[0]["answers"] is None
    page = admin_client.get("/admin/cartridges/evaluationcase/")
    assert page.status_code == 200 and "erased" in page.content.decode()
    detail = admin_client.get(f"/admin/cartridges/evaluationcase/{bobs_case['id']}/change/")
    for response in (api_client_for(alice).get(URL), page, detail):
        assert MARKER not in response.content.decode()
    assert MARKER not in _raw_table_text()
    row = EvaluationCase.objects.get(pk=bobs_case["id"])
    assert row.erased_at is not None and row.wrapped_key is None and row.sealed is None


def test_the_gate_runs_without_erased_cases_and_records_them(scope_a, append, fake_engine, blob_root):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, f"Bob's locker password is {MARKER}.", subject="bob")
    evaluation_case_add(scope=scope_a, question="What is Bob's locker password?", answers=[MARKER])
    evaluation_case_add(scope=scope_a, question="Where is Bob?", answers=["at home"], subjects=["bob"])
    evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])

    _erase("bob")

    accuracy = cartridge_evaluate(version=cartridge_compile(scope=scope_a)).figures["accuracy"]
    assert accuracy["num_cases"] == 1 and accuracy["num_cases_erased"] == 2 and accuracy["cartridge"] == 1.0
    # a fresh case without erased subjects still counts
    evaluation_case_add(scope=scope_a, question="Is the key under the flowerpot?", answers=["flowerpot"])
    accuracy = cartridge_evaluate(version=cartridge_compile(scope=scope_a)).figures["accuracy"]
    assert accuracy["num_cases"] == 2 and accuracy["num_cases_erased"] == 2


def test_it_links_the_given_subjects_and_refuses_ones_not_in_the_scope(alice, scope_a, scope_c, append, api_client_for):
    from tests.support.errors import assert_error

    append(scope_a, "Dana parks in bay 12.", subject="dana")
    append(scope_c, "Erin likes tea.", subject="erin")
    client = api_client_for(alice)
    response = client.post(URL, {"question": "Where does Dana park?", "answers": ["bay 12"], "subjects": ["dana"]}, format="json")
    assert response.status_code == 201 and response.json()["subjects"] == ["dana"]
    for subjects in (["nobody"], ["erin"], "dana", [7]):  # unknown, another scope's, not a list, not text
        assert_error(client.post(URL, {"question": "q?", "answers": ["x"], "subjects": subjects}, format="json"), 400, "subjects")
    assert EvaluationCase.objects.count() == 1


def test_it_refuses_a_case_about_an_erased_subject(scope_a, append, fake_engine, blob_root):
    from core.errors import MnesioError

    append(scope_a, "Dana parks in bay 12.", subject="dana")
    _erase("dana")
    with pytest.raises(MnesioError, match="subjects"):
        evaluation_case_add(scope=scope_a, question="Where does Dana park?", answers=["x"], subjects=["dana"])


def test_forgetting_is_counted_and_safe_to_repeat(scope_a, append):
    from cartridges.services.forget import evaluation_cases_forget

    append(scope_a, "Dana parks in bay 12.", subject="dana")
    case = evaluation_case_add(scope=scope_a, question="Where does Dana park?", answers=["bay 12"])
    other = evaluation_case_add(scope=scope_a, question="Where is the key?", answers=["flowerpot"])
    dana = Subject.objects.get(external_id="dana")
    assert list(case.subjects.all()) == [dana] and not other.subjects.exists()
    assert evaluation_cases_forget(subject_ids=[dana.pk]) == 1
    assert evaluation_cases_forget(subject_ids=[dana.pk]) == 0
    assert EvaluationCase.objects.filter(erased_at__isnull=True).get() == other
