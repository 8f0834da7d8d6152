"""Who reads which scope: a scope for its user or for staff, users, and API tokens (limited to some scopes or not)."""
from __future__ import annotations

import re
import unicodedata

from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import slug_re
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.errors import NotFound, PermissionDenied
from core.permissions import staff_permission_check
from memories.models import Scope
from memories.tokens import TOKEN_SCOPES_ATTR

from .log import shown


def scope_get_for_user(*, user, name: str) -> Scope:
    """Return the scope called ``name`` if ``user`` is granted it, else NotFound naming `scope`.

    An unknown scope and one that is not granted get the same 404 and message: a client cannot learn
    which scope names exist outside its grants.
    """
    # A name no scope can have (not a slug, too long, a NUL that PostgreSQL refuses) is not looked up.
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    max_chars = Scope._meta.get_field("name").max_length
    if not isinstance(name, str) or len(name) > max_chars or not slug_re.fullmatch(name):
        raise NotFound(
            f"`scope` {shown(name)} does not exist (a scope name is a slug of at most {max_chars} letters, "
            "digits, '-' and '_')",
            extra={"field": "scope"},
        )
    scope = None
    if user and user.is_authenticated:
        # a deleted scope answers like one that never existed
        scope = Scope.objects.filter(
            _token_limit(user), name=name, grants__user=user, deleted_at__isnull=True
        ).first()
    if scope is None:
        raise NotFound(f"`scope` '{name}' does not exist or is not granted to you", extra={"field": "scope"})
    return scope


def scope_get_for_staff(*, user, name: str, permission: str) -> Scope:
    """Return the scope called ``name`` for a staff action needing ``permission`` (e.g. ``memories.add_scopegrant``).

    Staff (who see every scope's name in the admin anyway) are checked for the permission first (403 naming
    it), then any scope is looked up (404). Anyone else first meets ``scope_get_for_user``: a scope they
    are not granted is the same 404 as an unknown one (no probing for names), a granted one a 403.
    """
    if user and user.is_authenticated and user.is_staff:
        staff_permission_check(user=user, permission=permission)
        if isinstance(name, str):
            name = unicodedata.normalize("NFC", name)
        valid = isinstance(name, str) and slug_re.fullmatch(name)
        scope = Scope.objects.filter(_token_limit(user), name=name).first() if valid else None
        if scope is None:
            raise NotFound(f"`scope` {shown(name)} does not exist", extra={"field": "scope"})
        return scope
    scope_get_for_user(user=user, name=name)
    staff_permission_check(user=user, permission=permission)
    raise AssertionError("unreachable: a user who is not staff never passes staff_permission_check")


def user_get(*, username: str):
    """Return the user (an API client: the owner of its tokens) called ``username``, or NotFound naming `user`."""
    from django.contrib.auth import get_user_model

    # a NUL is refused by PostgreSQL (a 500), and no username holds one: not looked up
    valid = isinstance(username, str) and "\x00" not in username and len(username) <= 1000
    user = get_user_model().objects.filter(username=username).first() if valid else None
    if user is None:
        raise NotFound(f"`user` {shown(username)} does not exist", extra={"field": "user"})
    return user


def user_scopes(*, user) -> QuerySet[Scope]:
    """Return the scopes ``user`` is granted (staff get no implicit grants)."""
    if not (user and user.is_authenticated):
        return Scope.objects.none()
    return Scope.objects.filter(_token_limit(user), grants__user=user, deleted_at__isnull=True).order_by("name")


def _token_limit(user) -> Q:
    """The scopes the request's token may reach (memories.tokens): every one, or the pks authentication attached."""
    allowed = getattr(user, TOKEN_SCOPES_ATTR, None)
    return Q() if allowed is None else Q(pk__in=allowed)


# A token's public id: the first characters of its digest (sha512 of the secret, hex); never the secret nor its
# lookup prefix, and useless to someone who has it.
TOKEN_ID_CHARS = 16
_TOKEN_ID_RE = re.compile(rf"[0-9a-f]{{{TOKEN_ID_CHARS}}}")


def token_is_limited(*, user) -> bool:
    """Whether ``user`` came with a token limited to some of their scopes (memories.tokens)."""
    return getattr(user, TOKEN_SCOPES_ATTR, None) is not None


def token_management_check(*, user) -> None:
    """403 unless ``user`` came with a credential that reaches all their scopes (a limited token manages nothing)."""
    if getattr(user, TOKEN_SCOPES_ATTR, None) is not None:
        raise PermissionDenied(
            "this token is limited to some scopes and cannot list, create or revoke tokens; use an unlimited token",
            extra={"field": "authorization"},
        )


def user_tokens(*, user) -> QuerySet:
    """The user's live API tokens (expired ones are dead: left out), oldest first, with their profiles."""
    from knox.models import get_token_model

    token_management_check(user=user)
    live = Q(expiry__isnull=True) | Q(expiry__gt=timezone.now())
    return (get_token_model().objects.filter(live, user=user).select_related("mnesio_profile")
            .prefetch_related("mnesio_profile__scopes").order_by("created", "digest"))


def user_token_get(*, user, token_id: str):
    """The user's live token whose id is ``token_id``, or NotFound naming `token` (another user's is the same 404)."""
    token = None
    if isinstance(token_id, str) and _TOKEN_ID_RE.fullmatch(token_id):
        token = user_tokens(user=user).filter(digest__startswith=token_id).first()
    if token is None:
        raise NotFound(f"`token` {shown(token_id)} is not one of your tokens", extra={"field": "token"})
    return token


def token_scope_ids(*, auth_token) -> frozenset[int] | None:
    """The scope pks ``auth_token`` (knox's) is limited to, or None when it reaches all its user's grants.

    Reads the profile authentication fetched with the token (``select_related("mnesio_profile")``); a limited
    token costs one query more for its scopes.
    """
    try:
        profile = auth_token.mnesio_profile
    except ObjectDoesNotExist:
        return None
    if not profile.restricted:
        return None
    return frozenset(profile.scopes.values_list("pk", flat=True))
