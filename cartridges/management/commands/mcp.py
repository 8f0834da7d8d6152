"""Serve the MCP server over stdio (an agent host starts this command and speaks JSON-RPC on its stdin/stdout)."""
from __future__ import annotations

import os
from functools import partial
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections
from rest_framework.exceptions import AuthenticationFailed

from cartridges.mcp_server.http import authenticate_key
from cartridges.mcp_server.server import build_server
from core.errors import MnesioError, NotFound
from memories.selectors import user_get

TOKEN_ENV = "MNESIO_TOKEN"


class Command(BaseCommand):
    help = (
        "Serve mnesio's MCP tools (remember, recall, ask, forget, list_scopes) over stdio, acting for the owner of "
        f"an API token (--token, or the {TOKEN_ENV} environment variable; its scope limit applies) or, for an "
        "operator on the server itself, for --user USERNAME. Nothing but JSON-RPC is written to stdout."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--token", default=None, help=f"an API token (default: ${TOKEN_ENV})")
        parser.add_argument("--user", default=None, help="act for this user (every scope they are granted)")

    def handle(self, *args: Any, token: str | None, user: str | None, **options: Any) -> None:
        token = token or os.environ.get(TOKEN_ENV) or None
        if (token is None) == (user is None):
            raise CommandError(f"give exactly one of `--token` (or ${TOKEN_ENV}) and `--user`")
        resolve = partial(_token_owner, token) if token is not None else partial(_active_user, user)
        try:
            resolve(None)  # refuse to start at all with a bad credential
        except MnesioError as exc:
            raise CommandError(exc.message) from None
        # resolved again on every tool call, in its worker thread: a token revoked or expired (a user deactivated)
        # mid-session is refused from the next call on, as the HTTP transport refuses its next request
        build_server(resolve).run("stdio")


def _token_owner(key: str, ctx: Any) -> Any:
    """The token's owner (its scope limit attached), or MnesioError ``authentication_failed``."""
    try:
        account, _ = authenticate_key(key)
    except AuthenticationFailed:
        raise MnesioError("`--token` is unknown, expired or revoked", code="authentication_failed", status_code=401,
                          extra={"field": "authorization"}) from None
    return account


def _active_user(username: str, ctx: Any) -> Any:
    """The active user ``username``, or MnesioError ``authentication_failed``."""
    close_old_connections()
    try:
        account = user_get(username=username)
    except NotFound as exc:
        raise MnesioError(exc.message, code="authentication_failed", status_code=401,
                          extra={"field": "user"}) from None
    finally:
        close_old_connections()
    if not account.is_active:
        raise MnesioError(f"`--user` {username!r} is inactive", code="authentication_failed", status_code=401,
                          extra={"field": "user"})
    return account
