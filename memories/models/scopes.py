"""Scopes and who may use them: the scope row, its grants to users, and the append-only history of grants."""
from __future__ import annotations

import pgtrigger
from django.conf import settings
from django.db import models
from django.utils import timezone

from core.models import AppendOnlyModel, append_only_triggers, reject_truncate


class Scope(models.Model):
    """A namespace of memories that one cartridge is compiled for (an agent, a tenant)."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Set once when the scope is deleted (memories.services.scope_delete_file): from then on it is invisible to
    # clients and refuses appends, and its keys are shredded by the erasure it filed. The row stays (the log
    # rows point at it) and so does its name.
    deleted_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        # Deletion is one way in the database too, like the other append-only facts: a deleted scope's row is
        # frozen (clearing `deleted_at` would bring its grants back and make its shredded key a live scope's),
        # and it is never removed (its name stays taken). A live scope's row may still change (deleted,
        # described); an empty live one may be removed as a row (the admin's typo case).
        triggers = [
            pgtrigger.Protect(
                name="protect_deleted_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition("OLD.deleted_at IS NOT NULL"),
            ),
            pgtrigger.Protect(
                name="protect_deleted_delete",
                operation=pgtrigger.Delete,
                condition=pgtrigger.Condition("OLD.deleted_at IS NOT NULL"),
            ),
            reject_truncate("protect_truncate"),
        ]

    def __str__(self) -> str:
        return self.name


class ScopeGrant(models.Model):
    """Lets a user (an API client) use a scope; staff users get no implicit grant over the API.

    Granting is not reading: ``memories.add_scopegrant`` lets staff give a scope to clients, and giving one to
    themselves (which lets their own token read its memories) needs ``memories.grant_scope_to_self`` too
    (memories.services.scope_grant). Every grant and revocation is a ScopeGrantEvent.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="scope_grants")
    scope = models.ForeignKey(Scope, on_delete=models.CASCADE, related_name="grants")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "scope"], name="memories_scopegrant_unique")]
        permissions = [("grant_scope_to_self", "Can grant a scope to oneself (and so read its memories)")]

    def __str__(self) -> str:
        return f"{self.user} -> {self.scope}"


class ScopeGrantAction(models.TextChoices):
    GRANTED = "granted"
    REVOKED = "revoked"


class ScopeGrantEvent(AppendOnlyModel):
    """Who gave (or took away) whom the use of a scope, and when: the audit trail of access to plaintext.

    A grant row is access control and is deleted on revocation; this row is history and is never changed
    (append-only triggers). It names the scope and the users by value (name, username and primary key), not by
    foreign key, so it outlives them: an empty scope removed as a row (a typo) or a deleted user account keeps
    its history, and the event never blocks either. ``actor_pk`` is None for grants made by code (setup, commands).
    """

    scope_name = models.CharField(max_length=100)
    user_pk = models.BigIntegerField()
    username = models.CharField(max_length=150)
    actor_pk = models.BigIntegerField(null=True, blank=True)
    actor_username = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=10, choices=ScopeGrantAction.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["scope_name", "created_at"], name="memories_grantevent_scope")]
        triggers = append_only_triggers()

    def __str__(self) -> str:
        return f"{self.actor_username or 'code'} {self.action} {self.username} scope {self.scope_name}"

    @property
    def to_self(self) -> bool:
        return self.actor_pk is not None and self.actor_pk == self.user_pk
