"""Shared fixtures: the actors (alice owns scope A, bob is in A's team, charlie has no access to A)
and the real default model, loaded once per test session."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def real_backend():
    """The real default model (SmolLM2-135M-Instruct, f32 on CPU), loaded once per session."""
    from kvengine import make_backend

    return make_backend("transformers", dtype="f32", quant="none", device="cpu")


@pytest.fixture
def artifacts_dir(tmp_path_factory):
    """Where tests keep artifacts (screenshots, reports): $MNESIO_TEST_ARTIFACTS or a temp dir."""
    from pathlib import Path

    path = Path(os.environ.get("MNESIO_TEST_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path
