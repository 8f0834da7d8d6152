"""Fuzz every operation of the OpenAPI schema (schemathesis, through Django's WSGI app): no 5xx, and every
response conforms to the schema (its status is declared, its content type is, and its body validates against the
declared schema: the success serializers and the ``Error`` component with its ``code`` enum, core/schema.py).

Positive cases (valid by the schema) and negative cases (invalid by the schema) for each operation, as
alice (granted scope A, which holds memories and an active cartridge) and, for the configuration switch,
as an operator. The example count per operation and mode is bounded (MNESIO_FUZZ_EXAMPLES, default 12) so
the run takes about 20 CPU-seconds; raise it for a longer hunt.
"""
from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from schemathesis.core.failures import FailureGroup

pytestmark = pytest.mark.django_db

NUM_EXAMPLES = int(os.environ.get("MNESIO_FUZZ_EXAMPLES", "12"))
# Checked on every response besides "no 5xx" (schemathesis's own checks, so the rules are the library's).
CONFORMANCE_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def _fuzz(operation, *, mode: GenerationMode, auth: str, failures: list, counts: dict, nonconforming: list) -> None:
    path_parameters = {"scope": "scope-a"} if "{scope}" in operation.path else None
    strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)

    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case) -> None:
        response = case.call(headers={"Authorization": auth})
        counts[response.status_code // 100] = counts.get(response.status_code // 100, 0) + 1
        if response.status_code >= 500 and len(failures) < 50:
            failures.append(
                f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:200]!r} "
                f"-> {response.status_code}"
            )
        try:
            case.validate_response(response, checks=CONFORMANCE_CHECKS)
        except FailureGroup as group:  # one entry per failed check (a BaseExceptionGroup)
            if len(nonconforming) < 50:
                found = "; ".join(f"{type(e).__name__}: {str(e)[:300]}" for e in group.exceptions)
                nonconforming.append(f"{case.method} {case.formatted_path} query={case.query} -> "
                                     f"{response.status_code}: {found}")

    run()


def test_no_operation_of_the_schema_answers_5xx(wsgi_app, fuzz_world, record_figures):
    # the schema needs a login (any authenticated user)
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app,
                                            headers={"Authorization": fuzz_world["alice"]})
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 18, [f"{o.method} {o.path}" for o in operations]
    # the configuration switch last: a switch to the real model would make later operations load it
    operations.sort(key=lambda o: o.path.startswith("/api/v1/kv/configuration"))
    failures: list[str] = []
    nonconforming: list[str] = []
    counts: dict[int, int] = {}
    nothing_to_negate = []
    for operation in operations:
        auth = fuzz_world["operator" if operation.path.startswith("/api/v1/kv/configuration") else "alice"]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode=mode, auth=auth, failures=failures, counts=counts, nonconforming=nonconforming)
            except Unsatisfiable:
                # an operation without parameters or body has no invalid input to generate
                assert mode == GenerationMode.NEGATIVE, f"{operation.method} {operation.path}"
                nothing_to_negate.append(f"{operation.method.upper()} {operation.path}")
    record_figures(
        scenario="schemathesis fuzz",
        num_operations=len(operations),
        max_examples_per_operation_and_mode=NUM_EXAMPLES,
        responses_by_class={f"{k}xx": v for k, v in sorted(counts.items())},
        num_5xx=len(failures),
        num_nonconforming=len(nonconforming),
        operations_without_negative_cases=nothing_to_negate,
    )
    assert sum(counts.values()) >= len(operations) * 2
    assert not failures, "\n".join(failures)
    assert not nonconforming, "\n".join(nonconforming)
