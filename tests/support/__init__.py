"""Helpers that tests of several packages share: plain functions and classes, imported; fixtures stay in
conftest.py files (tests/support/worker.py's are registered by tests/conftest.py)."""
