"""Forgetting a memory answers 202 once its key is shredded, before the rebuild, in the embedded default too."""
from __future__ import annotations

import threading

import pytest

from core.jobs import background_jobs_join
from memories import registry
from memories.models import ErasureRequest, ErasureStatus
from memories.selectors import erasure_request_status, scope_memories_open


@pytest.mark.django_db(transaction=True)
def test_the_202_comes_before_the_rebuild_finishes(alice, scope_a, served, api_client_for, monkeypatch):
    version = served(scope_a, ["The spare key is under the blue flowerpot.", "The vault code is 4417."])
    started, release = threading.Event(), threading.Event()
    rebuilders = registry.view_rebuilders()

    def held_rebuilder(erasure_request) -> None:  # the rebuild waits until the test has seen the answer
        started.set()
        release.wait(10)

    monkeypatch.setattr(registry, "_rebuilders", [held_rebuilder, *rebuilders])
    try:
        response = api_client_for(alice).delete("/api/v1/scopes/scope-a/memories/2/")
        assert response.status_code == 202, response.content
        request = ErasureRequest.objects.get(pk=response.json()["id"])
        assert not release.is_set() and started.wait(10)  # the rebuild runs, off the request, still held
        assert erasure_request_status(erasure_request=request) == ErasureStatus.KEYS_SHREDDED
        assert scope_memories_open(scope=scope_a)[1].erased  # the shred was done before the answer
    finally:
        release.set()
        assert background_jobs_join(30)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    rebuilt = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json")
    assert rebuilt.status_code == 200 and rebuilt.json()["version_id"] != version.pk and "4417" not in rebuilt.json()["answer"]


@pytest.mark.django_db(transaction=True)
def test_the_mcp_forget_tool_answers_before_the_rebuild_finishes(alice, scope_a, served, monkeypatch):
    from cartridges.mcp_server import tools

    served(scope_a, ["The spare key is under the blue flowerpot.", "The vault code is 4417."])
    started, release = threading.Event(), threading.Event()

    def held_rebuilder(erasure_request) -> None:
        started.set()
        release.wait(10)

    monkeypatch.setattr(registry, "_rebuilders", [held_rebuilder, *registry.view_rebuilders()])
    try:
        result = tools.forget(user=alice, scope="scope-a", seq=2)
        assert result["forgotten"] is True and not release.is_set() and started.wait(10)
        request = ErasureRequest.objects.get(pk=result["erasure_request"])
        assert erasure_request_status(erasure_request=request) == ErasureStatus.KEYS_SHREDDED
        assert scope_memories_open(scope=scope_a)[1].erased
    finally:
        release.set()
        assert background_jobs_join(30)
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
