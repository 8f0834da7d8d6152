"""The keys of a scope's cartridges: a blob key per stored blob and the secret that keys its block ids."""
from __future__ import annotations

from django.db import models

from core.models import reject_truncate, rewrap_only_trigger


class BlobKey(models.Model):
    """The blob key of one stored blob (wrapped by the master key); deleting the row destroys the key.

    A row is written (committed) before its blob, so every blob in storage is accounted for: a row
    without a CartridgeVersion of the same storage_name is an unfinished or dead compile, which
    cartridge_blobs_sweep removes once it is older than any compile can run.
    """

    storage_name = models.CharField(max_length=300, unique=True)
    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    wrapped_key = models.BinaryField()
    wrapped_by = models.CharField(max_length=32, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The only changes a blob key allows: deletion (destruction), and a re-wrap by a new master key.
        triggers = [
            rewrap_only_trigger(
                "blobkey_protect_update", rewrapped="wrapped_by", kept=["id", "storage_name", "scope_id", "created_at"]
            ),
            # rows go one by one (blob_destroy); a TRUNCATE would drop every key without a record
            reject_truncate("blobkey_protect_truncate"),
        ]


class ScopeBlockSecret(models.Model):
    """The secret that keys a scope's block ids (kvengine.blocks.block_id), wrapped by the master key.

    One per scope, made at its first compile and kept for the scope's life, so the ids of its blocks are stable
    across its versions (blocks are shared, a rebuild reproduces the same bytes). Deleted (shredded) when the scope
    is deleted: then no id of it can be recomputed from a guess. Without it a stored id is a keyed hash nobody can
    check a guess against, however short the text.
    """

    scope = models.OneToOneField("memories.Scope", on_delete=models.PROTECT, related_name="+")
    wrapped_key = models.BinaryField()
    wrapped_by = models.CharField(max_length=32, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # the changes it allows: deletion (the shred) and a re-wrap by a new master key
        triggers = [
            rewrap_only_trigger("scopeblocksecret_protect_update", rewrapped="wrapped_by", kept=["id", "scope_id", "created_at"]),
            reject_truncate("scopeblocksecret_protect_truncate"),
        ]
