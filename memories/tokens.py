"""What an API token may reach: the profile a token created through the API carries (a name, and the scopes it is
limited to). The token itself is django-rest-knox's (stored as a digest, never the secret).

A token without a profile (made by ``api_token_create`` before profiles, or in the admin) reaches every scope its
user is granted, as does a profile with ``restricted=False``. A restricted token reaches the scopes in ``scopes``
that its user is still granted: a grant revoked later takes the scope away from the token too, and a scope removed
as a row leaves the token reaching fewer scopes, never more. Authentication attaches the limit to the request's
user (``TOKEN_SCOPES_ATTR``, read by memories.selectors), so every surface that resolves a scope through the
selectors (/api/, /v1/, MCP) applies it.
"""
from __future__ import annotations

from django.db import models

# The attribute authentication sets on the request's user: a frozenset of scope pks, or None for no limit.
TOKEN_SCOPES_ATTR = "mnesio_token_scope_ids"


class ApiTokenProfile(models.Model):
    """A knox token's name and scope limit (the public id of a token is a prefix of its digest: see selectors)."""

    token = models.OneToOneField(
        "knox.AuthToken", on_delete=models.CASCADE, primary_key=True, related_name="mnesio_profile"
    )
    name = models.CharField(max_length=100, blank=True)
    restricted = models.BooleanField(default=False, help_text="Reach only `scopes` (those still granted).")
    scopes = models.ManyToManyField("memories.Scope", blank=True, related_name="+")

    class Meta:
        app_label = "memories"

    def __str__(self) -> str:
        return self.name or "api token"
