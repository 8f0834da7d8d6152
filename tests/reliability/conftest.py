"""Fixtures of the reliability tests: blobs in a temp dir, the fake engine, eager tasks on demand, a figures
recorder (the real Celery worker harness: tests/support/worker.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

# Blobs in a temp dir (autouse) and the fake engine: the cartridges tests' own (the empty LRU is tests/conftest's).
from tests.cartridges.conftest import blob_root, fake_engine  # noqa: F401
from tests.conftest import celery_eager  # noqa: E402

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


def needs_redis() -> pytest.MarkDecorator:
    """Skip unless REDIS_URL is set (the worker and broker tests)."""
    return pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs Redis (set REDIS_URL)")


@pytest.fixture
def real_broker():
    """Send tasks to the broker for real (a test that ran before may have left eager mode on)."""
    with celery_eager(False):
        yield
