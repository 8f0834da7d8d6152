"""The MCP server's tools: names, descriptions and JSON schemas (from the type hints), each run in a worker thread
(the ORM is sync) for the user the transport authenticated, and the API's errors returned as MCP tool errors.

A tool error is a result with ``isError: true`` whose ``structuredContent`` is the API's error body
(``{"code", "message", "extra"}``, the stable codes of core.errors) and whose text is the same JSON, for the model.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal

import anyio
from django.db import close_old_connections
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from core.errors import MnesioError, error_code
from memories.selectors import MAX_SEARCH_QUERY_CHARS, MAX_SEARCH_TOP_K
from memories.services import MAX_IDEMPOTENCY_KEY_CHARS, MAX_REASON_CHARS, MAX_SUBJECT_CHARS

from . import tools

INSTRUCTIONS = (
    "Long-term memory for this agent. Call list_scopes to see the memory scopes you may use; remember facts with "
    "remember, search them with recall, ask a question answered from a scope's memories with ask, and forget one "
    "memory (by its seq) with forget. Errors carry a stable `code` (not_found, invalid_input, conflict, ...)."
)

# Called in the tool's worker thread, once per tool call: it may use the database (the stdio command re-checks its
# token there, so a revoked or expired token stops working mid-session); it raises MnesioError to refuse the call.
UserResolver = Callable[[Context], Any]

Scope = Annotated[str, Field(description="The scope's name (see list_scopes).", max_length=100)]
Subject = Annotated[str | None, Field(description="Who the memory is about (an external id), if anyone.",
                                      max_length=MAX_SUBJECT_CHARS)]


def tool_error(exc: MnesioError) -> CallToolResult:
    """The API's error body as an MCP tool error."""
    body = {"code": error_code(exc), "message": exc.message, "extra": exc.extra}
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(body))], structured_content=body,
                          is_error=True)


def _in_thread(fn: Callable[..., dict], resolve_user: UserResolver, ctx: Context, **kwargs: Any) -> dict:
    # a worker thread outside Django's request cycle: drop connections that died or aged past CONN_MAX_AGE, as the
    # request_started/finished signals do for views
    close_old_connections()
    try:
        return fn(user=resolve_user(ctx), **kwargs)
    finally:
        close_old_connections()


def build_server(resolve_user: UserResolver) -> MCPServer:
    """An MCPServer whose tools act for ``resolve_user(ctx)`` (the transport's authenticated user)."""
    server = MCPServer("mnesio", instructions=INSTRUCTIONS, log_level="WARNING")

    async def run(ctx: Context, fn: Callable[..., dict], **kwargs: Any) -> dict[str, Any] | CallToolResult:
        try:
            return await anyio.to_thread.run_sync(partial(_in_thread, fn, resolve_user, ctx, **kwargs))
        except MnesioError as exc:
            return tool_error(exc)

    @server.tool(description="List the memory scopes this credential may use.")
    async def list_scopes(ctx: Context) -> dict[str, Any]:
        return await run(ctx, tools.list_scopes)

    @server.tool(description="Remember one memory (`content`) or many at once (`items`, all or nothing) in a scope.")
    async def remember(
        ctx: Context,
        scope: Scope,
        content: Annotated[str | None, Field(description="The memory's text (one memory).")] = None,
        subject: Subject = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="A small JSON object kept with it.")] = None,
        idempotency_key: Annotated[str | None, Field(description="Repeat-safe key: the same key appends once.",
                                                     max_length=MAX_IDEMPOTENCY_KEY_CHARS)] = None,
        items: Annotated[list[dict[str, Any]] | None, Field(
            description="Many memories, each {content, subject?, metadata?, idempotency_key?}.")] = None,
    ) -> dict[str, Any]:
        return await run(ctx, tools.remember, scope=scope, content=content, subject=subject, metadata=metadata,
                         idempotency_key=idempotency_key, items=items)

    @server.tool(description="Search a scope's memories for a query, best match first.")
    async def recall(
        ctx: Context,
        scope: Scope,
        query: Annotated[str, Field(description="What to look for.", min_length=1, max_length=MAX_SEARCH_QUERY_CHARS)],
        top_k: Annotated[int, Field(description="How many memories at most.", ge=1, le=MAX_SEARCH_TOP_K)] = 10,
        subject: Subject = None,
    ) -> dict[str, Any]:
        return await run(ctx, tools.recall, scope=scope, query=query, top_k=top_k, subject=subject)

    @server.tool(description="Ask a question answered from a scope's memories (its compiled cartridge by default).")
    async def ask(
        ctx: Context,
        scope: Scope,
        question: Annotated[str, Field(description="The question.", min_length=1)],
        mode: Annotated[Literal["cartridge", "text"], Field(
            description="cartridge: the compiled memories (fast); text: re-read the memories as text.")] = "cartridge",
    ) -> dict[str, Any]:
        return await run(ctx, tools.ask, scope=scope, question=question, mode=mode)

    @server.tool(description="Forget one memory of a scope by its seq (it is erased at once, for good).")
    async def forget(
        ctx: Context,
        scope: Scope,
        seq: Annotated[int, Field(description="The memory's seq (from remember or recall).", ge=1, le=2**63 - 1)],
        reason: Annotated[str | None, Field(description="Why (kept with the erasure request).",
                                            max_length=MAX_REASON_CHARS)] = None,
    ) -> dict[str, Any]:
        return await run(ctx, tools.forget, scope=scope, seq=seq, reason=reason)

    return server
