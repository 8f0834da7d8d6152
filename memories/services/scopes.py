"""Scopes and the grants that give users the use of them."""
from __future__ import annotations

import logging
import unicodedata

from django.db import IntegrityError, transaction
from django.utils.text import slugify

from core.errors import Conflict, MnesioError, NotFound, PermissionDenied
from memories.models import Scope, ScopeGrant, ScopeGrantAction, ScopeGrantEvent

SELF_GRANT_PERMISSION = "memories.grant_scope_to_self"

logger = logging.getLogger("memories")


def scope_create(*, name: str, description: str = "", actor=None) -> Scope:
    """Create a scope; ``name`` must be a slug (letters, digits, '-', '_'), taken in Unicode NFC.

    The creating user (``actor``) is granted the new scope in the same transaction, recorded as a grant event:
    a scope is empty when it is made, so this reads no one's memories, and its creator can use it at once.
    Scopes made by code (commands, setup: no actor) are granted to no one.
    """
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    if not isinstance(name, str) or not name or slugify(name) != name.lower() or len(name) > 100:
        raise MnesioError(f"`name` has to be a slug of at most 100 characters but got {name!r}", extra={"field": "name"})
    taken = Conflict(f"`name` '{name}' is already a scope", extra={"field": "name"})
    if Scope.objects.filter(name=name).exists():
        raise taken
    try:
        # the check above is for the common case; two concurrent creations of one name both pass it, and the
        # unique index decides (the loser's savepoint is rolled back, the caller's transaction stays usable)
        with transaction.atomic():
            scope = Scope.objects.create(name=name, description=description)
            if actor is not None and getattr(actor, "pk", None) is not None:
                _grant_record(scope=scope, user=actor, actor=actor)
    except IntegrityError:
        raise taken from None
    logger.info("scope created name=%s actor=%s", scope.name, getattr(actor, "pk", None))
    return scope


def _event_record(*, scope: Scope, user, actor, action: str) -> ScopeGrantEvent:
    return ScopeGrantEvent.objects.create(
        scope_name=scope.name, user_pk=user.pk, username=user.get_username(), action=action,
        actor_pk=getattr(actor, "pk", None), actor_username=actor.get_username() if actor is not None else "",
    )


def _grant_record(*, scope: Scope, user, actor) -> tuple[ScopeGrant, bool]:
    with transaction.atomic():
        grant, created = ScopeGrant.objects.get_or_create(scope=scope, user=user)
        if created:
            _event_record(scope=scope, user=user, actor=actor, action=ScopeGrantAction.GRANTED)
    return grant, created


def scope_grant(*, scope: Scope, user, actor=None) -> ScopeGrant:
    """Grant ``user`` the use of ``scope`` (idempotent: ``grant.created`` says whether this call made it).

    A grant to the actor themselves needs ``memories.grant_scope_to_self`` (403 naming it): holding
    ``memories.add_scopegrant`` alone must not let staff read any tenant's memories with their own token.
    A new grant is recorded as a ScopeGrantEvent in the same transaction.
    """
    if actor is not None and actor.pk == user.pk and not actor.has_perm(SELF_GRANT_PERMISSION):
        raise PermissionDenied(
            f"granting a scope to yourself needs the permission `{SELF_GRANT_PERMISSION}` (granting it to a client "
            "needs only `memories.add_scopegrant`); nothing was granted",
            extra={"field": "user", "permission": SELF_GRANT_PERMISSION},
        )
    grant, created = _grant_record(scope=scope, user=user, actor=actor)
    grant.created = created
    logger.info("scope granted scope=%s user=%s actor=%s created=%s", scope.name, user.pk, getattr(actor, "pk", None),
                created)
    return grant


def scope_revoke(*, scope: Scope, user, actor=None) -> None:
    """Take the use of ``scope`` away from ``user`` (their tokens stop reaching it at once), or NotFound naming `user`.

    A grant is access control, not history: the row is deleted, and a ScopeGrantEvent records who revoked it.
    """
    with transaction.atomic():
        deleted, _ = ScopeGrant.objects.filter(scope=scope, user=user).delete()
        if deleted:
            _event_record(scope=scope, user=user, actor=actor, action=ScopeGrantAction.REVOKED)
    if not deleted:
        raise NotFound(f"`user` '{user.get_username()}' is not granted scope '{scope.name}'", extra={"field": "user"})
    logger.info("scope revoked scope=%s user=%s actor=%s", scope.name, user.pk, getattr(actor, "pk", None))
