"""Each scope's block-id secret (ScopeBlockSecret): made once, unwrapped per compile and gate, shredded with the scope.

Why a secret: a block id names the token ids of everything up to the block's end, and a plain hash of them lets
anyone holding an id (a database row, an evaluation's figures, an admin page) test a guess of the text offline.
Keyed with a secret of the scope, sealed like every data key under the master key, an id says nothing without
the master key; the ids of destroyed blocks are overwritten as well (services/erase.py), and deleting the scope
shreds the secret. kvengine.blocks documents the derivation.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.views.decorators.debug import sensitive_variables

from memories import crypto

from ..models import ScopeBlockSecret

SECRET_BYTES = 32  # an HMAC-SHA256 key of the hash's own size


def block_secret_aad(scope_id: int) -> bytes:
    """Associated data of a wrapped scope block secret: the scope it keys."""
    return f"mnesio:scope-block-secret:v1|{scope_id}".encode()


@sensitive_variables()
def scope_block_secret(*, scope) -> bytes:
    """The scope's block-id secret, made (and wrapped by the master key) on first use."""
    row = ScopeBlockSecret.objects.filter(scope_id=scope.pk).first()
    if row is None:
        secret = crypto.new_data_key()[:SECRET_BYTES]
        wrapped, wrapped_by = crypto.wrap(secret, aad=block_secret_aad(scope.pk))
        try:
            with transaction.atomic():
                row = ScopeBlockSecret.objects.create(scope_id=scope.pk, wrapped_key=wrapped, wrapped_by=wrapped_by)
        except IntegrityError:  # a concurrent compile made it first: use that one
            row = ScopeBlockSecret.objects.get(scope_id=scope.pk)
    return crypto.unwrap(bytes(row.wrapped_key), wrapped_by=row.wrapped_by, aad=block_secret_aad(scope.pk))


def scope_block_secret_shred(*, scope_id: int) -> bool:
    """Delete the scope's block-id secret (a deleted scope); True when there was one. Safe to run twice."""
    deleted, _ = ScopeBlockSecret.objects.filter(scope_id=scope_id).delete()
    return bool(deleted)
