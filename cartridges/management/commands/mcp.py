"""Serve the MCP server over stdio (an agent host starts this command and speaks JSON-RPC on its stdin/stdout)."""
from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from rest_framework.exceptions import AuthenticationFailed

from cartridges.mcp_server.http import authenticate_key
from cartridges.mcp_server.server import build_server
from core.errors import NotFound
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
        if token is not None:
            try:
                account, _ = authenticate_key(token)
            except AuthenticationFailed:
                raise CommandError("`--token` is unknown, expired or revoked") from None
        else:
            try:
                account = user_get(username=user)
            except NotFound as exc:
                raise CommandError(exc.message) from None
            if not account.is_active:
                raise CommandError(f"`--user` {user!r} is inactive")
        build_server(lambda ctx: account).run("stdio")
