"""API token authentication: django-rest-knox tokens (stored as a sha512 digest plus a 15-character lookup
prefix, never the secret), sent as ``Authorization: Token <key>`` or ``Authorization: Bearer <key>``: one scheme,
accepted on /api/, /v1/ and /mcp alike.

A token may be limited to some of its user's scopes (memories.tokens): authentication attaches the limit to the
request's user, and the scope selectors apply it.
"""
from __future__ import annotations

import binascii
from hmac import compare_digest
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.crypto import hash_token
from knox.models import get_token_model
from knox.settings import CONSTANTS, knox_settings
from knox.signals import token_expired
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header

# The prefixes of the Authorization header a token is read from (compared case-insensitively, as knox does).
PREFIXES = (b"token", b"bearer")


class TokenAuthentication(KnoxTokenAuthentication):
    """knox's authentication, reading either prefix and checking only the presented token's own expiry.

    knox also deletes the user's other expired tokens on every request, one query more per API call (the
    query counts pinned in tests/memories/test_api.py rely on one token query: the token's profile comes
    joined to it). Legacy 40-character keys converted by memories/migrations/0003_api_tokens_hashed.py
    authenticate like knox's own 64-character ones.
    """

    def authenticate(self, request):
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() not in PREFIXES:
            return None  # another backend's header (or none)
        if len(auth) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: send `Authorization: Bearer <token>`.")
        return self.authenticate_credentials(auth[1])

    def authenticate_credentials(self, token: bytes):
        """knox's lookup, fetching the token's profile (its scope limit) in the same query."""
        try:
            key = token.decode("utf-8")
            digest = hash_token(key)
        except (UnicodeDecodeError, TypeError, binascii.Error):
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        candidates = get_token_model().objects.filter(token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH])
        for auth_token in candidates.select_related("user", "mnesio_profile"):
            if self._cleanup_token(auth_token):
                continue
            if compare_digest(digest, auth_token.digest):
                return self.validate_user(auth_token)
        raise exceptions.AuthenticationFailed("Invalid token.")

    def validate_user(self, auth_token):
        # imported here: DRF imports this class while core.errors (which the selectors import) may still be loading
        from memories.selectors import token_scope_ids
        from memories.tokens import TOKEN_SCOPES_ATTR

        user, auth_token = super().validate_user(auth_token)
        setattr(user, TOKEN_SCOPES_ATTR, token_scope_ids(auth_token=auth_token))
        return user, auth_token

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
