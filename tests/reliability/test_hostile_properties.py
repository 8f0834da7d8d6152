"""A property of every JSON endpoint: whatever JSON arrives, the answer is never a 5xx, and an error is the house
shape with a stable code (the OpenAI endpoint: OpenAI's shape).

For each operation of the OpenAPI schema that takes a body (POST, PATCH, DELETE) and for ``/v1/chat/completions``
and ``/v1/completions`` (documented by OpenAI's reference, outside the schema), hypothesis sends (a) a body valid by
the schema with one string leaf poisoned (a lone UTF-16 surrogate, a NUL, a control character, a bidi override) and
(b) arbitrary JSON built from such strings, numbers past any bound and nesting. Every operation is sent as alice (a
client granted scope A) and again as a staff user holding the staff write permissions, so the staff-only
operations (creating scopes, grants, invites, the configuration switch) read their bodies instead of answering 403
first. schemathesis (tests/reliability/test_fuzz_api.py) generates strings a UTF-8 codec accepts, so these strings
are this test's own. Bounded: MNESIO_PROPERTY_EXAMPLES (default 8) examples per operation, kind and user, about a
minute on 2 cores.
"""
from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

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


# What the staff user holds besides the operator's permissions: every staff-only write of the API reads its body.
STAFF_WRITE_PERMISSIONS = [
    "auth.add_user", "memories.add_scope", "memories.delete_scope", "memories.add_scopegrant",
    "memories.delete_scopegrant", "memories.grant_scope_to_self", "cartridges.change_scope_settings",
]


def _client(auth: str):
    from rest_framework.test import APIClient

    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=auth)
    return client


def test_no_json_body_makes_any_endpoint_answer_5xx(wsgi_app, fuzz_world, operator, record_figures):  # noqa: F811
    from django.contrib.auth.models import Permission
    from django.db.models import Q

    wanted = Q()
    for dotted in STAFF_WRITE_PERMISSIONS:
        app_label, codename = dotted.split(".")
        wanted |= Q(content_type__app_label=app_label, codename=codename)
    operator.user_permissions.add(*Permission.objects.filter(wanted))  # fuzz_world's operator token is this user's
    clients = {"alice": _client(fuzz_world["alice"]), "operator": _client(fuzz_world["operator"])}
    openai = _client(fuzz_world["alice"].replace("Token ", "Bearer "))
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app,
                                            headers={"Authorization": fuzz_world["alice"]})
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().method.upper() in BODY_METHODS]
    assert len(operations) >= 14, [f"{o.method} {o.path}" for o in operations]
    # the configuration switch last: once the operator switched to a model nobody has, later asks would meet that
    operations.sort(key=lambda o: o.path.startswith("/api/v1/kv/configuration"))
    failures: list[str] = []
    counts: dict[str, int] = {}

    def run(strategy, *, method: str, client, openai_shape: bool = False) -> None:
        @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def one(case) -> None:
            path, body = case
            response = _send(client, method, path, body)
            counts[f"{response.status_code // 100}xx"] = counts.get(f"{response.status_code // 100}xx", 0) + 1
            _check(response, where=f"{method} {path} body={str(body)[:120]!r}", openai=openai_shape, failures=failures)

        one()

    def run_operations(user: str) -> None:
        for operation in operations:
            params = {"scope": "scope-a"} if "{scope}" in operation.path else None
            cases = operation.as_strategy(generation_mode=GenerationMode.POSITIVE, path_parameters=params)
            valid = cases.map(lambda case: case.body if isinstance(case.body, (dict, list)) else {})
            paths = cases.map(lambda case: case.formatted_path)
            method = operation.method.upper()
            run(st.tuples(paths, poisoned_bodies(valid)), method=method, client=clients[user])
            run(st.tuples(paths, HOSTILE_JSON), method=method, client=clients[user])

    run_operations("alice")  # the configuration switch answers alice 403 before it reads a body
    messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=30)}),
                        min_size=1, max_size=3)
    optional = {"max_tokens": st.integers(1, 8), "temperature": st.floats(0, 2), "stream": st.just(False)}
    chat = st.fixed_dictionaries({"model": st.just("scope-a"), "messages": messages}, optional=optional)
    completion = st.fixed_dictionaries(
        {"model": st.just("scope-a"), "prompt": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=30), max_size=2))},
        optional=optional,
    )
    for path, valid in (("/v1/chat/completions", chat), ("/v1/completions", completion)):  # before any switch
        run(st.tuples(st.just(path), poisoned_bodies(valid)), method="POST", client=openai, openai_shape=True)
        run(st.tuples(st.just(path), HOSTILE_JSON), method="POST", client=openai, openai_shape=True)
    run_operations("operator")
    record_figures(scenario="hostile JSON properties", num_operations=len(operations) + 2, users=sorted(clients),
                   max_examples_per_operation_kind_and_user=NUM_EXAMPLES, responses_by_class=dict(sorted(counts.items())),
                   num_failures=len(failures))
    assert sum(counts.values()) >= (2 * len(operations) + 2) * 2
    assert not failures, "\n".join(failures[:30])
