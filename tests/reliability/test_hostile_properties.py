"""A property of every JSON endpoint: whatever JSON arrives, the answer is never a 5xx, and an error is the house
shape with a stable code (the OpenAI endpoint: OpenAI's shape).

For each operation of the OpenAPI schema that takes a body (POST, PATCH, DELETE) and for ``/v1/chat/completions``
(documented by OpenAI's reference, outside the schema), hypothesis sends (a) a body valid by the schema with one
string leaf poisoned (a lone UTF-16 surrogate, a NUL, a control character, a bidi override) and (b) arbitrary JSON
built from such strings, numbers past any bound and nesting. schemathesis (tests/reliability/test_fuzz_api.py)
generates strings a UTF-8 codec accepts, so these strings are this test's own. Bounded: MNESIO_PROPERTY_EXAMPLES
(default 8) examples per operation and kind, about half a minute on 2 cores.
"""
from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from .test_fuzz_api import fuzz_world, wsgi_app  # noqa: F401 (fixtures, requested by name)

pytestmark = pytest.mark.django_db

NUM_EXAMPLES = int(os.environ.get("MNESIO_PROPERTY_EXAMPLES", "8"))
BODY_METHODS = ("POST", "PATCH", "PUT", "DELETE")

# Strings no field of the API takes, each a past 500: a lone surrogate (UTF-8 cannot encode it), a NUL (PostgreSQL
# refuses it), control and invisible characters.
POISONS = st.sampled_from(["\ud800", "\udfff", "a\udc00b", "\x00", "nul\x00inside", "\x1b[2J", "bob\u202e", "\ufeff"])
HOSTILE_TEXT = st.one_of(POISONS, st.text(max_size=20), st.builds(lambda a, p: a + p, st.text(max_size=8), POISONS))
HOSTILE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False), HOSTILE_TEXT
)
HOSTILE_JSON = st.recursive(
    HOSTILE_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4),
    max_leaves=12,
)


def _string_paths(value, path=()):
    """Every path to a string leaf (and to a dict key) of a JSON value."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*path, ("key", key))
            yield from _string_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _string_paths(item, (*path, i))


def _poisoned(value, path, poison: str):
    """A copy of ``value`` with the string at ``path`` (or the dict key ``("key", k)``) given ``poison``."""
    if not path:
        return value + poison
    head, rest = path[0], path[1:]
    if isinstance(head, tuple):  # a key of this dict
        return {(k + poison if k == head[1] else k): v for k, v in value.items()}
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[head] = _poisoned(value[head], rest, poison)
    return copy


@st.composite
def poisoned_bodies(draw, valid_bodies):
    body = draw(valid_bodies)
    paths = list(_string_paths(body))
    if not paths:  # nothing to poison: send hostile JSON where the body was
        return draw(HOSTILE_JSON)
    return _poisoned(body, draw(st.sampled_from(paths)), draw(POISONS))


def _check(response, *, where: str, openai: bool, failures: list) -> None:
    if response.status_code >= 500:
        failures.append(f"{where} -> {response.status_code}: {response.content[:200]!r}")
        return
    if response.status_code >= 400:
        body = response.json()
        shaped = (isinstance(body.get("error"), dict) and "message" in body["error"]) if openai else (
            isinstance(body.get("code"), str) and "message" in body)
        if not shaped:
            failures.append(f"{where} -> {response.status_code} not in the error shape: {response.content[:200]!r}")


def _send(client, method: str, path: str, body) -> object:
    # ensure_ascii: a lone surrogate travels as its JSON escape (\ud800), as any JSON client would send it
    return client.generic(method, path, json.dumps(body), content_type="application/json")


def test_no_json_body_makes_any_endpoint_answer_5xx(wsgi_app, fuzz_world, record_figures):  # noqa: F811
    from rest_framework.test import APIClient

    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=fuzz_world["alice"])
    openai = APIClient(raise_request_exception=False)
    openai.credentials(HTTP_AUTHORIZATION=fuzz_world["alice"].replace("Token ", "Bearer "))
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app,
                                            headers={"Authorization": fuzz_world["alice"]})
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().method.upper() in BODY_METHODS]
    # the configuration switch answers alice 403 before it reads a body; nothing here may switch it
    assert len(operations) >= 14, [f"{o.method} {o.path}" for o in operations]
    failures: list[str] = []
    counts: dict[str, int] = {}

    def run(strategy, *, method: str, openai_shape: bool) -> None:
        @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def one(case) -> None:
            path, body = case
            response = _send(openai if openai_shape else client, method, path, body)
            counts[f"{response.status_code // 100}xx"] = counts.get(f"{response.status_code // 100}xx", 0) + 1
            _check(response, where=f"{method} {path} body={str(body)[:120]!r}", openai=openai_shape, failures=failures)

        one()

    for operation in operations:
        params = {"scope": "scope-a"} if "{scope}" in operation.path else None
        cases = operation.as_strategy(generation_mode=GenerationMode.POSITIVE, path_parameters=params)
        valid = cases.map(lambda case: case.body if isinstance(case.body, (dict, list)) else {})
        paths = cases.map(lambda case: case.formatted_path)
        method = operation.method.upper()
        run(st.tuples(paths, poisoned_bodies(valid)), method=method, openai_shape=False)
        run(st.tuples(paths, HOSTILE_JSON), method=method, openai_shape=False)
    chat = st.fixed_dictionaries(
        {"model": st.just("scope-a"),
         "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]),
                                                     "content": st.text(max_size=30)}), min_size=1, max_size=3)},
        optional={"max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2), "stream": st.just(False)},
    )
    run(st.tuples(st.just("/v1/chat/completions"), poisoned_bodies(chat)), method="POST", openai_shape=True)
    run(st.tuples(st.just("/v1/chat/completions"), HOSTILE_JSON), method="POST", openai_shape=True)
    record_figures(scenario="hostile JSON properties", num_operations=len(operations) + 1,
                   max_examples_per_operation_and_kind=NUM_EXAMPLES, responses_by_class=dict(sorted(counts.items())),
                   num_failures=len(failures))
    assert sum(counts.values()) >= (len(operations) + 1) * 2
    assert not failures, "\n".join(failures[:30])
