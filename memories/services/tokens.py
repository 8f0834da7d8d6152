"""API tokens a user manages themselves (create, revoke) and invitations an operator sends (a user and their
first token). Tokens are django-rest-knox's, stored as a digest; the secret is returned once, at creation."""
from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import Conflict, MnesioError, NotFound, PermissionDenied
from memories.models import Scope
from memories.selectors import scope_get_for_staff, scope_get_for_user, token_management_check, user_token_get
from memories.tokens import ApiTokenProfile

from .scopes import SELF_GRANT_PERMISSION, scope_grant

logger = logging.getLogger("memories")

MAX_TOKEN_NAME_CHARS = 100


def token_ttl_days() -> tuple[int, int]:
    """(default, longest) lifetime of a token made through the API, in days (settings.MNESIO_TOKEN_*_TTL_DAYS)."""
    return settings.MNESIO_TOKEN_DEFAULT_TTL_DAYS, settings.MNESIO_TOKEN_MAX_TTL_DAYS


def _expiry(expires_at: dt.datetime | None) -> dt.datetime:
    default_days, max_days = token_ttl_days()
    now = timezone.now()
    if expires_at is None:
        return now + dt.timedelta(days=default_days)
    latest = now + dt.timedelta(days=max_days)
    if not now < expires_at <= latest:
        raise MnesioError(
            f"`expires_at` has to be in the future and at most {max_days} days away (before {latest.isoformat()}) "
            f"but got {expires_at.isoformat()}", extra={"field": "expires_at"},
        )
    return expires_at


def _granted_scopes(*, user, names: list[str]) -> list[Scope]:
    scopes = []
    for i, name in enumerate(names):
        try:
            scopes.append(scope_get_for_user(user=user, name=name))
        except NotFound as exc:
            raise NotFound(exc.message, extra={"field": f"scopes[{i}]"}) from None
    return scopes


def _token_make(*, user, name: str, scopes: list[Scope] | None, expiry: dt.datetime):
    from knox.models import get_token_model

    with transaction.atomic():
        token, key = get_token_model().objects.create(user=user, expiry=None)
        token.expiry = expiry  # knox takes a lifetime; the API takes an instant
        token.save(update_fields=["expiry"])
        profile = ApiTokenProfile.objects.create(token=token, name=name, restricted=scopes is not None)
        if scopes:
            profile.scopes.set(scopes)
    return token, key


def api_token_create(*, user, name: str = "", scopes: list[str] | None = None,
                     expires_at: dt.datetime | None = None):
    """Create a token for ``user`` (the caller) and return ``(token, key)``; the key is shown only now.

    ``scopes``: the names of some of the user's granted scopes to limit it to (None: every scope they are granted,
    now and later). ``expires_at``: default MNESIO_TOKEN_DEFAULT_TTL_DAYS from now, at most
    MNESIO_TOKEN_MAX_TTL_DAYS. A limited token cannot create tokens (403): it could otherwise mint a wider one.
    """
    token_management_check(user=user)
    if len(name) > MAX_TOKEN_NAME_CHARS:
        raise MnesioError(f"`name` has to be at most {MAX_TOKEN_NAME_CHARS} characters", extra={"field": "name"})
    limited = None if scopes is None else _granted_scopes(user=user, names=scopes)
    token, key = _token_make(user=user, name=name, scopes=limited, expiry=_expiry(expires_at))
    logger.info("api token created user=%s limited=%s", user.pk, limited is not None)
    return token, key


def api_token_revoke(*, user, token_id: str) -> None:
    """Revoke (delete) one of ``user``'s tokens by id; it stops authenticating at once. Another user's id is a 404."""
    token = user_token_get(user=user, token_id=token_id)
    token.delete()
    logger.info("api token revoked user=%s", user.pk)


def _invited_scope(*, actor, name, field: str) -> Scope:
    missing = NotFound(f"`{field}` {name!r} is not a scope", extra={"field": field})
    if actor is None:
        row = Scope.objects.filter(name=name, deleted_at__isnull=True).first() if isinstance(name, str) else None
    else:
        try:
            row = scope_get_for_staff(user=actor, name=name, permission="memories.add_scopegrant")
        except NotFound:
            raise missing from None
        if row.deleted_at is not None:
            row = None
    if row is None:
        raise missing
    return row


def user_invite(*, username: str, email: str = "", scopes: list[str] | None = None, actor=None,
                expires_at: dt.datetime | None = None):
    """Create the account ``username`` (no password: it signs in with tokens), grant it ``scopes`` (by name) and
    give it a first, unlimited token.

    Returns ``(user, token, key)``; the key is shown only now. The user then makes their own tokens and revokes
    this one. An existing username is a 409 naming `username`.

    ``actor`` None is the operator's command (trusted: any scope). An actor over the API (the caller checked
    `auth.add_user`) needs a credential that reaches all their scopes (a limited token invites no one: 403), each
    scope as a staff grant (`memories.add_scopegrant`), and, since the actor receives the new user's secret and so
    reads whatever that user is granted, now or later, `memories.grant_scope_to_self` for any invite (403 naming it).
    """
    username = username.strip() if isinstance(username, str) else username
    User = get_user_model()
    if not isinstance(username, str) or not username or len(username) > 150 or "\x00" in username:
        raise MnesioError("`username` has to be 1 to 150 characters", extra={"field": "username"})
    try:
        User._meta.get_field(User.USERNAME_FIELD).run_validators(username)
    except ValidationError as exc:
        raise MnesioError(f"`username` {username!r}: {' '.join(exc.messages)}", extra={"field": "username"}) from None
    if actor is not None:
        token_management_check(user=actor)
    rows = []
    for i, name in enumerate(scopes or []):
        rows.append(_invited_scope(actor=actor, name=name, field=f"scopes[{i}]"))
    if actor is not None and not actor.has_perm(SELF_GRANT_PERMISSION):
        # with or without `scopes`: the answer holds the new user's token, so whatever that user is granted now or
        # later (a grant to "another" user is allowed) the caller reads; inviting is granting to oneself
        raise PermissionDenied(
            f"inviting a user over the API needs the permission `{SELF_GRANT_PERMISSION}`: the answer holds the new "
            "user's token, which reads every scope that user is granted (or have the operator run "
            "`manage.py user_invite`); nothing was created",
            extra={"field": "scopes" if rows else "username", "permission": SELF_GRANT_PERMISSION},
        )
    taken = Conflict(f"`username` {username!r} is taken", extra={"field": "username"})
    if User.objects.filter(username=username).exists():
        raise taken
    try:
        with transaction.atomic():
            user = User(username=username, email=email or "")
            user.set_unusable_password()
            user.save()
            for row in rows:
                scope_grant(scope=row, user=user, actor=actor)
            token, key = _token_make(user=user, name="invitation", scopes=None, expiry=_expiry(expires_at))
    except IntegrityError:
        raise taken from None
    logger.info("user invited user=%s scopes=%d actor=%s", user.pk, len(rows), getattr(actor, "pk", None))
    return user, token, key
