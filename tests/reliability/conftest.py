"""Fixtures of the reliability tests: blobs in a temp dir, the fake engine, eager tasks on demand, a figures
recorder (the real Celery worker harness: tests/support/worker.py), the isolation tests' world, and the fuzz tests'
world and WSGI app."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Blobs in a temp dir (autouse) and the fake engine: the cartridges tests' own (the empty LRU is tests/conftest's).
from tests.cartridges.conftest import blob_root, fake_engine  # noqa: F401
from tests.conftest import celery_eager  # noqa: E402
from tests.support.isolation import MARKER

FIGURES_FILE = "reliability-figures.jsonl"


@pytest.fixture
def fake_row(fake_engine):  # noqa: F811 (the imported fixture, requested by name)
    """Make the fake engine the active configuration as a row (a worker process reads it too)."""
    from cartridges.services import kv_configuration_switch

    return kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none", actor=None)


@pytest.fixture
def record_figures(request, artifacts_dir):
    """record_figures(**numbers): print the scenario's figures and append them to the artifacts' JSONL file."""

    def record(**figures):
        line = {"test": request.node.nodeid, **figures}
        print("FIGURES " + json.dumps(line, sort_keys=True))
        with open(Path(artifacts_dir) / FIGURES_FILE, "a") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
        return line

    return record


@pytest.fixture
def one_connection():
    """In-process requests keep the test's database connection instead of closing it at their end (Django's
    close_old_connections, as Django's test client does inside a transaction). A flood of in-process requests in a
    transaction=True test otherwise opens a connection per request, and on a loaded machine PostgreSQL frees the
    slots of closed ones more slowly than they come: up to its 100 clients, failing other workers' connections."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def needs_redis() -> pytest.MarkDecorator:
    """Skip unless REDIS_URL is set (the worker and broker tests)."""
    return pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")


@pytest.fixture
def real_broker():
    """Send tasks to the broker for real (a test that ran before may have left eager mode on)."""
    with celery_eager(False):
        yield


@pytest.fixture
def world(alice, charlie, scope_a, scope_c, fake_row, eager_tasks):
    """The isolation tests' world (test_isolation*.py): scope A (alice's) with memories, an active version, an
    erasure request and a case; scope C (charlie's)."""
    from cartridges.services import cartridge_activate, cartridge_compile, evaluation_case_add
    from memories.services import erasure_request_file, memory_append

    memory_append(scope=scope_a, content=f"The spare key is under the blue flowerpot {MARKER}.")
    memory_append(scope=scope_a, subject="dana", content=f"Dana's locker code is 4417 {MARKER}.")
    memory_append(scope=scope_a, subject="erin", content="Erin likes tea.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    case = evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])
    erasure = erasure_request_file(subject="erin", requested_by=alice, reason="asked", scope=scope_a)
    memory_append(scope=scope_c, content="Charlie's own fact.")
    from cartridges.services import answer_request_answer, answer_request_file

    answered = answer_request_answer(answer_request=answer_request_file(
        scope=scope_a, question="Where is the spare key?", actor=alice))  # alice's async ask, ready to collect
    return {
        "pk_answer": answered.pk,
        "seq": scope_a.memories.order_by("seq").first().seq,
        "pk_version": version.pk,
        "pk_erasure": erasure.pk,
        "pk_case": case.pk,
    }


@pytest.fixture
def wsgi_app(one_connection):
    """Django's WSGI app, keeping the test's database connection open across requests (as Django's test client does)."""
    from django.core.handlers.wsgi import WSGIHandler

    return WSGIHandler()


@pytest.fixture
def fuzz_world(alice, operator, scope_a, fake_row, eager_tasks):
    """The fuzz and property tests' world: scope A with memories (one about a subject), an evaluation case and an
    active cartridge; tokens of alice and of an operator."""
    from knox.models import AuthToken

    from cartridges.services import cartridge_activate, cartridge_compile, evaluation_case_add
    from memories.services import memory_append

    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    memory_append(scope=scope_a, subject="dana", content="Dana's locker code is 4417.")
    evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    return {
        "alice": f"Token {AuthToken.objects.create(user=alice)[1]}",
        "operator": f"Token {AuthToken.objects.create(user=operator)[1]}",
    }
