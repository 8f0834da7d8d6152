"""API token authentication: django-rest-knox tokens (stored as a sha512 digest plus a 15-character lookup
prefix, never the secret), sent as ``Authorization: Token <key>`` like the plaintext DRF tokens before them."""
from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.settings import knox_settings
from knox.signals import token_expired


class TokenAuthentication(KnoxTokenAuthentication):
    """knox's authentication, checking only the presented token's own expiry.

    knox also deletes the user's other expired tokens on every request, one query more per API call (the
    query counts pinned in tests/memories/test_api.py rely on one token query). Tokens here do not expire
    by default (REST_KNOX["TOKEN_TTL"] is None); legacy 40-character keys converted by
    memories/migrations/0003_api_tokens_hashed.py authenticate like knox's own 64-character ones.
    """

    def _cleanup_token(self, auth_token) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            username = auth_token.user.get_username()
            auth_token.delete()
            token_expired.send(sender=self.__class__, username=username, source="auth_token")
            return True
        return False


class TokenScheme(OpenApiAuthenticationExtension):
    """The schema's security scheme for these tokens: the same `tokenAuth` DRF's token authentication had."""

    target_class = TokenAuthentication
    name = "tokenAuth"
    match_subclasses = True

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return build_bearer_security_scheme_object(header_name="Authorization",
                                                   token_prefix=knox_settings.AUTH_HEADER_PREFIX)
