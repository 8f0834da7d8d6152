"""The MCP server with the official MCP client SDK: streamable HTTP at /mcp on a live ASGI server (uvicorn), and
stdio through ``manage.py mcp`` in a subprocess. Same tokens and scopes as the API: charlie never reaches alice's
scope, a bad token gets nothing, errors are tool errors carrying the API's codes."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from memories.models import Memory
from memories.services import api_token_create
from tests.support.servers import token_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
TOOLS = {"ask", "forget", "list_scopes", "recall", "remember"}
FACTS = ["Lena's dog is called Pixel.", "The spare key is under the blue flowerpot."]


def over_http(base_url: str, key: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return Client(streamable_http_client(f"{base_url}/mcp", http_client=http))


def over_stdio(key: str, blob_root: Path) -> Client:
    from tests.support.procs import database_url

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CELERY_BROKER_URL")}  # tasks in-process
    env.update({"DATABASE_URL": database_url(), "MNESIO_TOKEN": key, "MNESIO_KV_BACKEND": "fake",
                "MNESIO_KV_MODEL": "fake-model", "MNESIO_BLOB_ROOT": str(blob_root), "MNESIO_LOG_LEVEL": "WARNING"})
    return Client(StdioServerParameters(command=sys.executable, args=["manage.py", "mcp"], env=env, cwd=str(ROOT)))


def run(client: Client, calls: list[tuple[str, dict]]) -> tuple[list, list]:
    """Open ``client``, list its tools and make ``calls`` in order: (tools, results)."""

    async def go():
        async with client:
            tools = (await client.list_tools()).tools
            return tools, [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(go)


def error_code(result) -> str:
    assert result.is_error, result
    assert json.loads(result.content[0].text)["code"] == result.structured_content["code"]
    return result.structured_content["code"]


def test_it_serves_the_memory_tools_over_http_with_json_schemas(alice, scope_a, served, asgi_server):
    served(scope_a, FACTS)
    tools, (scopes, remembered, many, found, answer, forgotten, found_after) = run(
        over_http(asgi_server.url, token_for(alice)), [
            ("list_scopes", {}),
            ("remember", {"scope": "scope-a", "content": "Mira moved to the third floor.", "subject": "mira"}),
            ("remember", {"scope": "scope-a", "items": [{"content": "Otto plays the oboe."},
                                                        {"content": "Otto lives in Ghent.", "subject": "otto"}]}),
            ("recall", {"scope": "scope-a", "query": "oboe"}),
            ("ask", {"scope": "scope-a", "question": "What is Lena's dog called?"}),
            ("forget", {"scope": "scope-a", "seq": 1}),
            ("recall", {"scope": "scope-a", "query": "Pixel dog"}),
        ])
    by_name = {t.name: t for t in tools}
    assert set(by_name) == TOOLS
    assert by_name["remember"].input_schema["required"] == ["scope"]
    assert by_name["recall"].input_schema["properties"]["top_k"]["maximum"] == 100
    assert by_name["ask"].input_schema["properties"]["mode"]["enum"] == ["cartridge", "text"]
    assert scopes.structured_content == {"scopes": [{"name": "scope-a", "description": "alice's agent"}]}
    assert remembered.structured_content["memories"][0]["content"] == "Mira moved to the third floor."
    assert many.structured_content["num_created"] == 2
    assert found.structured_content["results"][0]["content"] == "Otto plays the oboe."
    assert not answer.is_error and answer.structured_content["answer"] in FACTS  # the fake engine answers a memory
    assert forgotten.structured_content["forgotten"] is True
    assert all(hit["seq"] != 1 for hit in found_after.structured_content["results"])
    assert Memory.objects.filter(scope=scope_a).count() == 5


def test_it_keeps_charlie_out_of_alices_scope_over_http(alice, charlie, scope_a, scope_c, asgi_server, append):
    append(scope_a, "Alice's PIN is 4711.")
    _, (scopes, recalled, remembered, asked, forgot) = run(over_http(asgi_server.url, token_for(charlie)), [
        ("list_scopes", {}),
        ("recall", {"scope": "scope-a", "query": "PIN"}),
        ("remember", {"scope": "scope-a", "content": "planted"}),
        ("ask", {"scope": "scope-a", "question": "What is Alice's PIN?", "mode": "text"}),
        ("forget", {"scope": "scope-a", "seq": 1}),
    ])
    assert [s["name"] for s in scopes.structured_content["scopes"]] == ["scope-c"]
    for result in (recalled, remembered, asked, forgot):
        assert error_code(result) == "not_found" and result.structured_content["extra"]["field"] == "scope"
        assert "4711" not in result.content[0].text
    assert list(Memory.objects.filter(scope=scope_a).values_list("seq", flat=True)) == [1]  # nothing planted


def test_it_applies_a_tokens_scope_limit_over_http(alice, scope_a, asgi_server):
    from memories.services import scope_create, scope_grant

    scope_grant(scope=scope_create(name="scope-b"), user=alice)
    _, limited = api_token_create(user=alice, scopes=["scope-a"])
    _, (scopes, refused) = run(over_http(asgi_server.url, limited), [
        ("list_scopes", {}), ("remember", {"scope": "scope-b", "content": "x"})])
    assert [s["name"] for s in scopes.structured_content["scopes"]] == ["scope-a"]
    assert error_code(refused) == "not_found"


def test_it_refuses_a_bad_or_missing_token_over_http(alice, asgi_server):
    bad = httpx2.post(f"{asgi_server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                      headers={"Authorization": "Bearer " + "0" * 64})
    assert bad.status_code == 401 and bad.json()["code"] == "authentication_failed"
    assert bad.headers["www-authenticate"].startswith("Bearer")
    missing = httpx2.post(f"{asgi_server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert missing.status_code == 401 and missing.json()["code"] == "not_authenticated"
    with pytest.raises(BaseExceptionGroup) as caught:  # the SDK client cannot even open a session
        run(over_http(asgi_server.url, "0" * 64), [("list_scopes", {})])
    assert caught.group_contains(MCPError, match="error response")


def test_it_serves_mcp_for_a_host_in_allowed_hosts_and_refuses_others(alice, scope_a, asgi_server, settings):
    settings.ALLOWED_HOSTS = ["mnesio.example.com", ".corp.example"]
    key = token_for(alice)
    results = {}
    for host in ("mnesio.example.com", "mnesio.example.com:8443", "mcp.corp.example"):
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}", "Host": host}, timeout=60)
        _, (results[host],) = run(Client(streamable_http_client(f"{asgi_server.url}/mcp", http_client=http)),
                                  [("list_scopes", {})])
    assert all(r.structured_content["scopes"][0]["name"] == "scope-a" for r in results.values())
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    sent = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
    other_host = httpx2.post(f"{asgi_server.url}/mcp", json=initialize, headers={**sent, "Host": "evil.example"})
    assert other_host.status_code == 400 and other_host.json()["code"] == "invalid_input"
    assert other_host.json()["extra"]["field"] == "host"
    loopback = httpx2.post(f"{asgi_server.url}/mcp", json=initialize, headers=sent)  # 127.0.0.1 is not listed now
    assert loopback.status_code == 400
    other_origin = httpx2.post(f"{asgi_server.url}/mcp", json=initialize, headers={
        **sent, "Host": "mnesio.example.com", "Origin": "https://evil.example"})
    assert other_origin.status_code == 403 and other_origin.json()["extra"]["field"] == "origin"
    same_origin = httpx2.post(f"{asgi_server.url}/mcp", json=initialize, headers={
        **sent, "Host": "mnesio.example.com", "Origin": "https://mnesio.example.com"})
    assert same_origin.status_code == 200


def test_it_caps_open_sessions_per_user_over_all_their_tokens_and_leaves_other_users_room(
    alice, bob, scope_a, asgi_server, settings
):
    from cartridges.mcp_server.http import McpHttpApp

    settings.MNESIO_MCP_MAX_SESSIONS_PER_USER = 2
    alices, bobs = token_for(alice), token_for(bob)
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {  # a handshake-era client's opening
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}

    def open_session(key: str):
        return httpx2.post(f"{asgi_server.url}/mcp", json=initialize, timeout=60, headers={
            "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"})

    first, second, third = open_session(alices), open_session(alices), open_session(alices)
    assert first.status_code == second.status_code == 200 and first.headers["mcp-session-id"]
    assert third.status_code == 429 and third.json()["code"] == "too_many_sessions"
    assert int(third.headers["retry-after"]) >= 1 and third.json()["extra"]["limit"] == 2
    assert open_session(token_for(alice)).status_code == 429  # a freshly minted token of hers does not pass the cap
    assert open_session(bobs).status_code == 200  # another user still opens a session
    _, (scopes,) = run(over_http(asgi_server.url, alices), [("list_scopes", {})])  # sessionless requests still served
    assert [s["name"] for s in scopes.structured_content["scopes"]] == ["scope-a"]
    ended = httpx2.delete(f"{asgi_server.url}/mcp", headers={
        "Authorization": f"Bearer {alices}", "Mcp-Session-Id": first.headers["mcp-session-id"],
        "MCP-Protocol-Version": "2025-06-18"})
    assert ended.status_code == 200 and open_session(alices).status_code == 200  # ending one made room
    settings.MNESIO_MCP_MAX_SESSIONS, settings.MNESIO_MCP_SESSION_IDLE_S = 50, 120
    manager = McpHttpApp().server.session_manager  # the SDK's process-wide bounds come from the settings too
    assert (manager.max_sessions, manager.session_idle_timeout) == (50, 120)


def test_it_returns_the_apis_error_codes_as_tool_errors(alice, scope_a, asgi_server):
    _, (blank, both, unknown_seq) = run(over_http(asgi_server.url, token_for(alice)), [
        ("remember", {"scope": "scope-a", "content": "   "}),
        ("remember", {"scope": "scope-a", "content": "x", "items": [{"content": "y"}]}),
        ("forget", {"scope": "scope-a", "seq": 99}),
    ])
    assert error_code(blank) == "invalid_input" and blank.structured_content["extra"]["field"] == "content"
    assert error_code(both) == "invalid_input"
    assert error_code(unknown_seq) == "not_found" and unknown_seq.structured_content["extra"]["field"] == "seq"


@pytest.mark.postgres  # `manage.py mcp` is another process: it cannot open the test run's SQLite database
def test_it_serves_the_tools_over_stdio_for_a_tokens_owner(alice, charlie, scope_a, scope_c, blob_root):
    tools, (scopes, remembered, found, answer, intruding) = run(over_stdio(token_for(alice), blob_root), [
        ("list_scopes", {}),
        ("remember", {"scope": "scope-a", "content": "Lena's dog is called Pixel."}),
        ("recall", {"scope": "scope-a", "query": "dog"}),
        ("ask", {"scope": "scope-a", "question": "What is Lena's dog called?", "mode": "text"}),
        ("recall", {"scope": "scope-c", "query": "anything"}),
    ])
    assert {t.name for t in tools} == TOOLS
    assert [s["name"] for s in scopes.structured_content["scopes"]] == ["scope-a"]
    assert remembered.structured_content["num_created"] == 1
    assert found.structured_content["results"][0]["content"] == "Lena's dog is called Pixel."
    assert answer.structured_content["answer"] == "Lena's dog is called Pixel."
    assert error_code(intruding) == "not_found"  # alice's token never reaches charlie's scope


@pytest.mark.postgres  # `manage.py mcp` is another process: it cannot open the test run's SQLite database
def test_it_stops_serving_stdio_once_its_token_is_revoked(alice, scope_a, blob_root):
    from django.db import connection
    from knox.models import AuthToken

    token, key = api_token_create(user=alice)

    def revoke() -> None:  # in a worker thread (the ORM is sync), its connection closed after
        try:
            AuthToken.objects.filter(pk=token.pk).delete()
        finally:
            connection.close()

    async def go():
        async with over_stdio(key, blob_root) as client:
            before = await client.call_tool("list_scopes", {})
            await anyio.to_thread.run_sync(revoke)
            after = await client.call_tool("recall", {"scope": "scope-a", "query": "anything"})
            return before, after

    before, after = anyio.run(go)
    assert [s["name"] for s in before.structured_content["scopes"]] == ["scope-a"]
    assert error_code(after) == "authentication_failed"  # checked per call, not once at start


@pytest.mark.postgres  # `manage.py mcp` is another process: it cannot open the test run's SQLite database
def test_it_refuses_to_start_stdio_with_a_bad_token(db):
    import subprocess

    env = {**os.environ, "MNESIO_TOKEN": "0" * 64}
    from tests.support.procs import database_url

    env["DATABASE_URL"] = database_url()
    done = subprocess.run([sys.executable, "manage.py", "mcp"], cwd=ROOT, env=env, capture_output=True, timeout=120)
    assert done.returncode != 0 and b"unknown, expired or revoked" in done.stderr and done.stdout == b""
