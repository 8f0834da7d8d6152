"""The staff-permission check of API writes that operators make (scopes, grants, scope settings).

Staff and a Django permission, as the admin's actions check (cartridges.api.views.IsOperatorForWrites does the
same for the configuration switch): a client token without staff gets a 403, and so does a view-only staff
account, naming the permission it lacks.
"""
from __future__ import annotations

from core.errors import PermissionDenied


def staff_permission_check(*, user, permission: str) -> None:
    """Raise a 403 naming ``permission`` unless ``user`` is an active staff user holding it."""
    if not (user and user.is_authenticated and user.is_active and user.is_staff and user.has_perm(permission)):
        raise PermissionDenied(
            f"this needs a staff account with the permission `{permission}`", extra={"permission": permission}
        )
