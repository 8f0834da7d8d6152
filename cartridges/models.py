"""Cartridge lifecycle rows: configurations, versions and the immutable records of what happened to them.

A version row is never edited: evaluations, activations and destructions are new rows, and a version's
state is derived from them (cartridges.selectors.version_state). On PostgreSQL triggers reject UPDATE and
DELETE of these rows (also through raw SQL); on SQLite the ORM refuses them (ImmutableRowError).
The only mutable-by-deletion table is BlobKey: the wrapped blob key, deleted when a version is
destroyed so that no copy of the ciphertext can ever be opened again.
"""
from __future__ import annotations

from dataclasses import asdict

import pgtrigger
from django.conf import settings
from django.db import models

from core.models import AppendOnlyModel, append_only_triggers, blank_only_trigger, reject_truncate, rewrap_only_trigger
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


class CartridgeBlock(AppendOnlyModel):
    """One stored block of a scope's cartridges (kvengine/blocks.py): content-addressed by its chain id.

    Its bytes are a blob like a version's (sealed under a key of its own, wrapped by the master key: the
    BlobKey row of the same storage_name); the block is live while that key row exists. Versions that
    share a block reference this one row (CartridgeVersionBlock), so each block is stored once per scope.
    Blocks are per scope, never shared across scopes: a tenant cannot learn another scope's content by reuse.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    # blank once the block is destroyed (block_destroy), as are part_sha256 and sha256
    block_id = models.CharField(max_length=64, help_text="chain id: HMAC-SHA256 under the scope's block secret over parent id, key, position and token ids")
    first_position = models.PositiveIntegerField()
    num_tokens = models.PositiveIntegerField()
    part_sha256 = models.CharField(max_length=64, help_text="digest of the block part (tensor index and data)")
    sha256 = models.CharField(max_length=64, help_text="sha256 of the block part file")
    size_bytes = models.PositiveBigIntegerField()
    stored_sha256 = models.CharField(max_length=64)
    stored_size_bytes = models.PositiveBigIntegerField()
    storage_name = models.CharField(max_length=300, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # the one change allowed: destruction blanks the id and digests (services/destroy.py block_destroy)
        triggers = [
            blank_only_trigger("cartridgeblock_protect_update", blanked=["block_id", "part_sha256", "sha256"]),
            *[t for t in append_only_triggers("cartridgeblock_") if t.name != "cartridgeblock_protect_update"],
        ]
        indexes = [models.Index(fields=["scope", "block_id"], name="cartridges_block_lookup")]

    def __str__(self) -> str:
        return f"block {self.block_id[:12]} of scope {self.scope_id} at {self.first_position}"


class CartridgeVersionBlock(AppendOnlyModel):
    """Version ``version``'s block number ``index`` is ``block`` (protected, append-only: a version's blocks never change)."""

    version = models.ForeignKey("CartridgeVersion", on_delete=models.PROTECT, related_name="block_links")
    index = models.PositiveIntegerField()
    block = models.ForeignKey(CartridgeBlock, on_delete=models.PROTECT, related_name="version_links")

    class Meta:
        triggers = append_only_triggers("cartridgeversionblock_")
        constraints = [models.UniqueConstraint(fields=["version", "index"], name="cartridge_version_block_unique")]


class CartridgeBlockDestruction(AppendOnlyModel):
    """A block's blob and key were destroyed: by an erasure (its chain held an erased memory) or a prune."""

    block = models.OneToOneField(CartridgeBlock, on_delete=models.PROTECT, related_name="destruction")
    erasure_request = models.ForeignKey(
        "memories.ErasureRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="block_destructions"
    )
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        triggers = append_only_triggers("cartridgeblockdestruction_")


class CartridgePrune(AppendOnlyModel):
    """A version was pruned by retention: its tail and the blocks no kept version uses are destroyed; the row stays."""

    version = models.OneToOneField("CartridgeVersion", on_delete=models.PROTECT, related_name="prune")
    keep_previous_versions = models.PositiveIntegerField()
    num_blocks_destroyed = models.PositiveIntegerField()
    bytes_freed = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        triggers = append_only_triggers("cartridgeprune_")


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


class CartridgeEvaluation(LifecycleRecord):
    """One gate run over a version: passed or not, every reason, and the figures measured."""

    version = models.ForeignKey(CartridgeVersion, on_delete=models.PROTECT, related_name="evaluations")
    passed = models.BooleanField()
    reasons = models.JSONField(default=list)
    figures = models.JSONField(default=dict)
    # (backend, model, dtype, quant) active when it ran: a pass under another configuration does not count.
    config_key = models.CharField(max_length=300)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(LifecycleRecord.Meta):
        # the one change allowed: dropping ``figures["verified_blocks"]`` (block ids recorded before they were keyed
        # per scope; the migration that keyed them drops them, and a later gate just runs in full)
        triggers = [
            pgtrigger.Protect(
                name="cartridgeevaluation_protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(
                    "NOT ((to_jsonb(NEW) - 'figures') = (to_jsonb(OLD) - 'figures')"
                    " AND NEW.figures::jsonb = (OLD.figures::jsonb - 'verified_blocks'))"
                ),
            ),
            *[t for t in append_only_triggers("cartridgeevaluation_") if t.name != "cartridgeevaluation_protect_update"],
        ]


class CartridgeActivation(LifecycleRecord):
    """A version put into service for its scope; the scope's newest activation is what serves."""

    KINDS = ["activate", "rollback", "erasure", "recompile"]

    version = models.ForeignKey(CartridgeVersion, on_delete=models.PROTECT, related_name="activations")
    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="cartridge_activations")
    evaluation = models.ForeignKey(CartridgeEvaluation, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, default="activate")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(LifecycleRecord.Meta):
        triggers = append_only_triggers("cartridgeactivation_")


class CartridgeDestruction(AppendOnlyModel):
    """The blob and blob key of a version were destroyed (by an erasure, or an operator's reason)."""

    version = models.OneToOneField(CartridgeVersion, on_delete=models.PROTECT, related_name="destruction")
    erasure_request = models.ForeignKey(
        "memories.ErasureRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="cartridge_destructions"
    )
    reason = models.CharField(max_length=500)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        triggers = append_only_triggers("cartridgedestruction_")


class EvaluationCase(models.Model):
    """An operator's question with accepted answers, used by the gate for a scope's task accuracy.

    A case often quotes a memory (its answer is a fact a person told the agent), so it is sealed like one:
    question and answers are AES-GCM sealed (JSON) with a key of the case's own, wrapped by the master key
    (registered in memories.keyring for rotation and verification), the associated data naming the row.
    ``subjects`` are the people it concerns: those given explicitly, plus, at creation time, every subject
    of the scope whose memory text contains one of the accepted answers (normalized as the gate's
    answers are, kvengine.text.normalize_answer). ``memories`` are the memories it quotes, found the same way (plus any whose whole text the
    question quotes). A memory appended later is not matched. Erasing any of those subjects, forgetting any of
    those memories, or deleting the scope destroys the case's key and sealed bytes
    (``cartridges.services.forget.evaluation_cases_forget``): the row stays, with ``erased_at``, and the gate
    runs without it. Read cases through ``cartridges.selectors.evaluation_case_open``.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="evaluation_cases")
    # nonce (12) + AES-GCM(master key, case key); NULL once erased
    wrapped_key = models.BinaryField(null=True, blank=True)
    wrapped_by = models.CharField(max_length=32, blank=True, help_text="id of the master key that wrapped it")
    # nonce (12) + AES-GCM(case key, {"question": ..., "answers": [...]}); NULL once erased
    sealed = models.BinaryField(null=True, blank=True)
    erased_at = models.DateTimeField(null=True, blank=True)
    subjects = models.ManyToManyField("memories.Subject", blank=True, related_name="evaluation_cases")
    # the memories it quotes (an accepted answer in their text, or their text in the question), found at creation;
    # forgetting any of them erases the case. False on cases made before quotes were recorded: forgetting any
    # memory of their scope erases them (nothing can tell which memory they quote once it is forgotten).
    memories = models.ManyToManyField("memories.Memory", blank=True, related_name="evaluation_cases")
    memories_recorded = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # an erased case has no key or sealed bytes left, and a live one has both once sealed
            models.CheckConstraint(
                condition=models.Q(erased_at__isnull=True) | models.Q(wrapped_key__isnull=True, sealed__isnull=True),
                name="cartridges_evaluationcase_erased_has_no_key",
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation case #{self.pk}" + (" (erased)" if self.erased_at else "")


class AnswerRecord(models.Model):
    """That a question was answered for a scope: version, mode, timings. Never the question or answer text."""

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="answer_records")
    version = models.ForeignKey(CartridgeVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="answer_records")
    mode = models.CharField(max_length=16)
    ttft_s = models.FloatField()
    total_s = models.FloatField()
    num_context_tokens = models.PositiveIntegerField(default=0)
    num_prompt_tokens = models.PositiveIntegerField(default=0)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class AnswerRequest(models.Model):
    """A question waiting for a worker to answer it, sealed at rest; deleted (with its key) once collected.

    The question and the answer are sealed with a key of the request's own (wrapped by the master key),
    so the broker carries only the row's id and nothing readable is left once the caller has collected.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    mode = models.CharField(max_length=16, default="cartridge")
    wrapped_key = models.BinaryField()
    wrapped_by = models.CharField(max_length=32)
    sealed_question = models.BinaryField()
    sealed_answer = models.BinaryField(null=True, blank=True)  # JSON of the AnswerResult, sealed
    error = models.CharField(max_length=1000, blank=True)  # an application error's message (never memory text)
    # that error's HTTP status and kind, so collecting it answers as the synchronous ask would have
    error_status = models.PositiveSmallIntegerField(null=True, blank=True)
    error_kind = models.CharField(max_length=64, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)


class Layout(models.TextChoices):
    PREFIX = "prefix"  # one causal prefix cartridge: exact, bounded by the model's window
    ROUTED = "routed"  # one chunk per memory, the question's memories assembled per ask (services/routed.py)
    AUTO = "auto"  # prefix while the scope fits the model's window, routed past it


class AutoRefresh(models.TextChoices):
    MANUAL = "manual"  # a cartridge is compiled when a client or an operator asks
    ON_APPEND = "on_append"  # recompile after appends, at most once per debounce window (the default)


# A new scope's refresh: on append by default (MNESIO_DEFAULT_AUTO_REFRESH), after a short wait. Asks read the
# memories after the serving version in the meantime (services/answer.py, "Fresh answers"), so the debounce bounds
# how long each ask pays that extra compile, and 2 s still folds an agent's burst of appends into one compile + gate.
DEFAULT_DEBOUNCE_S = 2


def default_auto_refresh() -> str:
    """A new scope's refresh: MNESIO_DEFAULT_AUTO_REFRESH (on_append unless the deployment says manual)."""
    from django.conf import settings

    return settings.MNESIO_DEFAULT_AUTO_REFRESH


# Bounds of the scope settings, checked by the service (a 400 naming the field) and by the database.
MAX_DEBOUNCE_S = 86_400  # a day: a longer wait is "manual" in practice
MAX_KEEP_PREVIOUS_VERSIONS = 1_000
# Versions kept restorable before the active one unless a scope says otherwise. A version is a materialized view of
# the log: a pruned one is rebuilt by compiling at its head, so a few for quick rollback are enough, and each kept
# version keeps its tail (up to half a block of KV, ~6 MB at f32) and the blocks only it uses.
DEFAULT_KEEP_PREVIOUS_VERSIONS = 3


class ScopeSettings(LifecycleRecord):
    """One change of a scope's cartridge settings; the scope's newest row is in force (none: the defaults).

    Append-only like KvConfiguration: a change is a new row naming who made it, so the history of who set
    what is kept without an audit table. The defaults: refresh on append after DEFAULT_DEBOUNCE_S, the
    DEFAULT_KEEP_PREVIOUS_VERSIONS versions before the active one kept (null keeps every one). ``keep_previous_versions`` is applied after every
    activation (services/retention.py).
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="settings_changes")
    auto_refresh = models.CharField(max_length=16, choices=AutoRefresh.choices, default=default_auto_refresh)
    # the wait after an append before an `on_append` refresh (appends within it share one compile)
    auto_refresh_debounce_s = models.PositiveIntegerField(default=DEFAULT_DEBOUNCE_S)
    # how many versions before the active one to keep; null keeps every one
    keep_previous_versions = models.PositiveIntegerField(null=True, blank=True, default=DEFAULT_KEEP_PREVIOUS_VERSIONS)
    # auto: a scope that fits keeps today's exact prefix cartridge, one that grows past the window is still answered
    layout = models.CharField(max_length=8, choices=Layout.choices, default=Layout.AUTO)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(LifecycleRecord.Meta):
        verbose_name_plural = "scope settings"
        triggers = append_only_triggers("scopesettings_")
        permissions = [("change_scope_settings", "Can change a scope's cartridge settings (auto-refresh, retention)")]
        indexes = [models.Index(fields=["scope", "-id"], name="cartridges_scopeset_newest")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(auto_refresh__in=AutoRefresh.values), name="cartridges_scopesettings_auto_refresh"
            ),
            models.CheckConstraint(
                condition=models.Q(auto_refresh_debounce_s__lte=MAX_DEBOUNCE_S),
                name="cartridges_scopesettings_debounce_bounded",
            ),
            models.CheckConstraint(
                condition=models.Q(keep_previous_versions__isnull=True)
                | models.Q(keep_previous_versions__lte=MAX_KEEP_PREVIOUS_VERSIONS),
                name="cartridges_scopesettings_keep_bounded",
            ),
            models.CheckConstraint(condition=models.Q(layout__in=Layout.values), name="cartridges_scopesettings_layout"),
        ]

    def __str__(self) -> str:
        return f"settings of scope {self.scope_id}: {self.auto_refresh}"


class RoutedChunk(models.Model):
    """One memory's chunk of the routed layout under one KV configuration (kvengine.routed), sealed.

    ``sealed`` is the chunk's bytes (kvengine.routed.chunk_dumps) AES-GCM sealed under the memory's own data key
    (memories.selectors.memory_own_keys): shredding that key (the memory forgotten) or the key wrapping it (its
    subject erased, its scope deleted) leaves them unreadable. Every erasure kind also deletes the erased
    memories' rows (services/routed_chunks.py). ``chunk_id`` is an HMAC of the chunk's token ids under the
    scope's block secret (ScopeBlockSecret): it names the chunk without being a guess oracle for its text.
    Compiled once per (memory, configuration) and never changed.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    memory = models.ForeignKey("memories.Memory", on_delete=models.PROTECT, related_name="+")
    config_key = models.CharField(max_length=300, help_text="KvConfig.key the chunk was compiled under")
    chunk_id = models.CharField(max_length=64)
    quant = models.CharField(max_length=8)
    num_tokens = models.PositiveIntegerField()
    sealed = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["memory", "config_key"], name="cartridges_routedchunk_once")]
        indexes = [models.Index(fields=["scope", "config_key"], name="cartridges_routedchunk_scope")]

    def __str__(self) -> str:
        return f"chunk of memory {self.memory_id} ({self.config_key})"
