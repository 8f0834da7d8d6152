"""API token authentication: django-rest-knox tokens (stored as a sha512 digest plus a 15-character lookup
prefix, never the secret), sent as ``Authorization: Token <key>`` like the plaintext DRF tokens before them."""
from __future__ import annotations

from django.utils import timezone
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
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
