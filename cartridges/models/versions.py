"""Configurations and versions: the operator's KV configuration switches and the compiled versions of a scope."""
from __future__ import annotations

from dataclasses import asdict

from django.conf import settings
from django.db import models

from core.models import AppendOnlyModel, append_only_triggers, blank_only_trigger
from kvengine import KvConfig


class LifecycleRecord(AppendOnlyModel):
    """A record of something that happened to the lifecycle (a switch, an evaluation, an activation): newest first."""

    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]


class KvConfiguration(LifecycleRecord):
    """One operator switch of the engine configuration; the newest row is the active configuration."""

    backend = models.CharField(max_length=32)
    model = models.CharField(max_length=200)
    dtype = models.CharField(max_length=8)
    quant = models.CharField(max_length=8)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(LifecycleRecord.Meta):
        triggers = append_only_triggers("kvconfiguration_")
        permissions = [
            ("switch_kvconfiguration", "Can switch the active KV configuration"),
            # every scope's figures (API, /metrics, dashboard, admin panel); without it staff see their granted scopes'
            ("view_kv_metrics", "Can view every scope's KV metrics"),
        ]

    def __str__(self) -> str:
        return f"{self.backend}:{self.model}/{self.dtype}/{self.quant}"

    @property
    def config(self) -> KvConfig:
        """The configuration this switch made active."""
        return KvConfig(self.backend, self.model, self.dtype, self.quant)


class CartridgeVersion(AppendOnlyModel):
    """A compiled cartridge of a scope: its key, where its encrypted blob lives, and what went into it."""

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="cartridge_versions")
    # The operator configuration it was compiled under (null: the settings default, no row existed).
    configuration = models.ForeignKey(KvConfiguration, null=True, blank=True, on_delete=models.PROTECT, related_name="versions")
    config_backend = models.CharField(max_length=32)
    config_model = models.CharField(max_length=200)
    config_dtype = models.CharField(max_length=8)
    config_quant = models.CharField(max_length=8)
    # The compatibility key, copied from the cartridge header.
    format_version = models.PositiveIntegerField()
    backend = models.CharField(max_length=32)
    model_id = models.CharField(max_length=200)
    weights_fingerprint = models.CharField(max_length=64)
    tokenizer_fingerprint = models.CharField(max_length=64)
    template_fingerprint = models.CharField(max_length=64)
    rope_config = models.CharField(max_length=500)
    dtype = models.CharField(max_length=8)
    quant = models.CharField(max_length=8)
    key_digest = models.CharField(max_length=64, help_text="sha256 of the canonical compatibility key")
    log_head = models.PositiveBigIntegerField()
    num_tokens = models.PositiveIntegerField()
    num_memories = models.PositiveIntegerField()
    # the version digest (the sha256 of its tail part, which commits to every block; of the whole file for a
    # version stored whole; deterministic: the replay identity) and the sha256 of the stored ciphertext of its own blob.
    sha256 = models.CharField(max_length=64)
    payload_sha256 = models.CharField(max_length=64)
    size_bytes = models.PositiveBigIntegerField()
    stored_sha256 = models.CharField(max_length=64)
    stored_size_bytes = models.PositiveBigIntegerField()
    storage_name = models.CharField(max_length=300, unique=True)
    # {"entries": [[seq, subject external id or null], ...], "left_out": [seq, ...]} and its sha256.
    manifest = models.JSONField()
    manifest_digest = models.CharField(max_length=64)
    supersedes = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="superseded_by")
    # Blocks (kvengine/blocks.py): tokens per block, and per manifest entry the first token position its memory
    # can influence (erasure keeps the blocks before the first position an erased memory reaches).
    block_size = models.PositiveIntegerField(default=0)
    entry_positions = models.JSONField(default=list)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        # the one change allowed: an erasure blanks the digests of a version it destroyed (services/destroy.py)
        triggers = [
            blank_only_trigger("cartridgeversion_protect_update", blanked=["sha256", "payload_sha256"]),
            *[t for t in append_only_triggers("cartridgeversion_") if t.name != "cartridgeversion_protect_update"],
        ]
        permissions = [
            ("compile_cartridge", "Can compile a scope's cartridge"),
            ("evaluate_cartridge", "Can evaluate (run the gate on) a cartridge version"),
            ("activate_cartridge", "Can activate a cartridge version or roll a scope back"),
        ]
        constraints = [
            # Idempotent compile: one version per scope, key, head and set of memories (a redelivered
            # task, or a concurrent duplicate, finds this row instead of making a second one).
            models.UniqueConstraint(
                fields=["scope", "key_digest", "log_head", "manifest_digest"], name="cartridge_version_unique_content"
            )
        ]

    def __str__(self) -> str:
        return f"cartridge v{self.pk} of scope {self.scope_id} at head {self.log_head}"

    @property
    def config(self) -> KvConfig:
        """The configuration it was compiled under."""
        return KvConfig(self.config_backend, self.config_model, self.config_dtype, self.config_quant)

    @staticmethod
    def config_columns(config: KvConfig) -> dict[str, str]:
        """The row's columns for ``config`` (the inverse of ``.config``)."""
        return {f"config_{name}": value for name, value in asdict(config).items()}


class CartridgeVersionSubject(AppendOnlyModel):
    """A subject whose memories went into a version (an index of the manifest for erasure lookups)."""

    version = models.ForeignKey(CartridgeVersion, on_delete=models.PROTECT, related_name="subjects")
    subject = models.CharField(max_length=200, db_index=True, help_text="the subject's external id")

    class Meta:
        triggers = append_only_triggers("cartridgeversionsubject_")
        constraints = [models.UniqueConstraint(fields=["version", "subject"], name="cartridge_version_subject_unique")]
