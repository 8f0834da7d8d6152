"""The memory log and its keys: append-only rows, protected by triggers on PostgreSQL and by the ORM.

What only PostgreSQL guarantees: the ``pgtrigger`` triggers below reject UPDATE, DELETE and TRUNCATE
from *any* client (raw SQL included). On SQLite the same rules hold only through the ORM: ``save()`` of
an existing row, ``delete()`` and queryset ``update()``/``delete()`` raise ``ImmutableRowError``, but
raw SQL can still change rows. Seq allocation without gaps holds on both (see ``services.memory``).
"""
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


# A wrapped key may change in exactly three ways: a re-wrap by a new master key (same key_generation), a
# re-key (memories.services.memory_keys_backfill: a new data key, key_generation + 1), or a one-way shred.
_REWRAP_SQL = (
    "OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL"
    " AND ((NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.key_generation = OLD.key_generation)"
    " OR NEW.key_generation = OLD.key_generation + 1)"
)
_SHRED_SQL = (
    "OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL"
    " AND NEW.key_generation = OLD.key_generation"
)


class ScopeKey(AppendOnlyModel):
    """The data key of a scope, wrapped by the master key: it wraps the own keys of the scope's memories
    without a subject (and sealed such memories directly before memories had keys of their own).

    Shredded (one way) when the scope is deleted. ``key_generation`` grows by one when a backfill re-keys it
    (memories.services.memory_keys_backfill): the old data key, the one legacy rows were sealed with, is
    then gone from the database.
    """

    scope = models.OneToOneField(Scope, on_delete=models.PROTECT, related_name="key")
    wrapped_key = models.BinaryField(null=True)
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(default=timezone.now)
    key_generation = models.PositiveIntegerField(default=1)
    shredded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
                | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True),
                name="memories_scopekey_key_xor_shredded",
            ),
        ]
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(
                    f"NOT ((({_SHRED_SQL}) OR ({_REWRAP_SQL})) AND NEW.id = OLD.id"
                    " AND NEW.scope_id = OLD.scope_id AND NEW.created_at = OLD.created_at)"
                ),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None


class MasterKeyRotation(AppendOnlyModel):
    """A master-key rotation, recorded before its re-wrap starts: the master keys it retired wrap nothing more.

    ``crypto.wrap`` checks the rows before each wrap (memories.keyring.master_key_retired_check), so a process
    still configured with a retired key, even one that verified it before the rotation, refuses to wrap a new key
    that a process holding only the new key could never open.
    """

    master_key_id = models.CharField(max_length=16, help_text="id of the master key it rotated to")
    retired_key_ids = models.JSONField(default=list, help_text="ids of the master keys it re-wrapped away from")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        triggers = append_only_triggers("masterkeyrotation_")

    def __str__(self) -> str:
        return f"rotation to master key {self.master_key_id} retiring {', '.join(self.retired_key_ids) or 'none'}"


class Subject(AppendOnlyModel):
    """A person memories are about, within one scope. Holds its wrapped data key until shredded (one way).

    The subject model: a subject belongs to one scope. The same external id in two scopes is two
    subjects with two keys, so a client granted scope C can erase only C's ``bob`` and learns nothing
    about a ``bob`` elsewhere; erasing an id in every scope is an operator action (an erasure request
    without a scope, its own permission). Rows created before subjects were per scope have no scope
    (legacy, global): they keep opening their memories, are erased by an operator's erasure everywhere,
    and by a client's only when every scope holding their memories is granted to that client.

    A shredded subject stays shredded: appending for it in its scope is refused (409 naming `subject`)
    rather than silently creating a new key, because new facts filed under an erased person's id would
    undo the erasure's intent. A client that truly has a new person uses a new external id.
    External ids are stored in Unicode NFC (memories.services.subject_id_validate), so "josé" typed
    composed or decomposed is one subject.
    """

    scope = models.ForeignKey(Scope, on_delete=models.PROTECT, null=True, blank=True, related_name="subjects")
    external_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    # nonce (12 bytes) + AES-GCM(master key, data key); NULL once shredded.
    wrapped_key = models.BinaryField(null=True)
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    shredded_at = models.DateTimeField(null=True, blank=True)
    key_generation = models.PositiveIntegerField(default=1)  # + 1 on each re-key (see ScopeKey)

    class Meta:
        ordering = ["external_id"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "external_id"], name="memories_subject_unique_per_scope"),
            # legacy rows (no scope) stay unique by external id, as they were
            models.UniqueConstraint(
                fields=["external_id"], condition=models.Q(scope__isnull=True), name="memories_subject_unique_legacy"
            ),
            # A shredded subject has no key bytes, and a live one has them: the database checks both.
            models.CheckConstraint(
                condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
                | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True),
                name="memories_subject_key_xor_shredded",
            ),
        ]
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(
                    f"NOT ((({_SHRED_SQL}) OR ({_REWRAP_SQL})) AND NEW.id = OLD.id"
                    " AND NEW.external_id = OLD.external_id AND NEW.created_at = OLD.created_at"
                    " AND NEW.scope_id IS NOT DISTINCT FROM OLD.scope_id)"
                ),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    def __str__(self) -> str:
        return f"{self.external_id} ({self.scope.name if self.scope_id else 'legacy, every scope'})"

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None


class LogHead(AppendOnlyModel):
    """The one-row seq counter: appends lock it, so seqs are handed out in commit order without gaps.

    A batch append moves it by the number of rows it inserts, in one UPDATE, so the trigger lets it move
    forward by any amount. That the rows behind it exist is the append code's guarantee (the same transaction
    inserts them).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    head = models.PositiveBigIntegerField(default=0)

    class Meta:
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition("NOT (NEW.head > OLD.head AND NEW.id = OLD.id)"),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]


class Memory(AppendOnlyModel):
    """One entry of the log: a global position, where it belongs, and its sealed content (never plaintext)."""

    seq = models.PositiveBigIntegerField(unique=True)
    scope = models.ForeignKey(Scope, on_delete=models.PROTECT, related_name="memories")
    subject = models.ForeignKey(Subject, on_delete=models.PROTECT, null=True, blank=True, related_name="memories")
    created_at = models.DateTimeField(default=timezone.now)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    nonce = models.BinaryField(max_length=12)
    # AES-256-GCM(data key, utf-8 content, aad=(seq, scope, subject)) with the 16-byte tag appended. The data key
    # is the memory's own key (MemoryKey) for memories appended since memories had one, else (legacy) its
    # subject's or scope's key.
    ciphertext = models.BinaryField()
    # The optional metadata (canonical JSON), sealed with the memory's own key (crypto.seal_box, aad
    # memory_metadata_aad); NULL when there is none. Never stored in plaintext.
    metadata_box = models.BinaryField(null=True, blank=True)

    class Meta:
        ordering = ["seq"]
        verbose_name_plural = "memories"
        constraints = [
            models.UniqueConstraint(fields=["scope", "idempotency_key"], name="memories_memory_idempotency_unique"),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="memories_memory_seq_positive"),
        ]
        indexes = [models.Index(fields=["scope", "seq"], name="memories_memory_scope_seq")]
        triggers = append_only_triggers()

    def __str__(self) -> str:
        return f"memory #{self.seq}"


class MemoryKey(AppendOnlyModel):
    """A memory's own data key, wrapped by its subject's key (or its scope's key without a subject).

    The log row stays immutable; this row is what forgetting one memory destroys (a one-way shred, like a
    subject's). Besides the shred it changes only when its parent is re-keyed (key_generation + 1, a new
    wrapping of the same memory key). ``resealed`` holds, for a memory appended before memories had own keys,
    a copy of its content sealed under this key (the log row's ciphertext was sealed with the parent's old
    key, which the backfill that created this row destroyed); NULL for memories sealed with their own key.
    """

    memory = models.OneToOneField(
        Memory, on_delete=models.PROTECT, to_field="seq", db_column="seq", related_name="own_key", primary_key=True
    )
    # nonce (12 bytes) + AES-GCM(parent data key, memory key, aad=crypto.memory_key_aad); NULL once shredded.
    wrapped_key = models.BinaryField(null=True)
    key_generation = models.PositiveIntegerField(default=1)  # the parent's key_generation that wrapped it
    resealed = models.BinaryField(null=True)
    created_at = models.DateTimeField(default=timezone.now)
    shredded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
                | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True, resealed__isnull=True),
                name="memories_memorykey_key_xor_shredded",
            ),
        ]
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(
                    "NOT (((OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL"
                    " AND NEW.resealed IS NULL AND NEW.key_generation = OLD.key_generation)"
                    " OR (OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL"
                    " AND NEW.key_generation = OLD.key_generation + 1"
                    " AND NEW.resealed IS NOT DISTINCT FROM OLD.resealed))"
                    " AND NEW.seq = OLD.seq AND NEW.created_at = OLD.created_at)"
                ),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None


class ErasureKind(models.TextChoices):
    SUBJECT = "subject"  # every memory of a subject (its key shredded)
    MEMORY = "memory"  # one memory (its own key shredded)
    SCOPE = "scope"  # a whole deleted scope (every key of its memories shredded, its cartridges destroyed)


class ErasureRequest(AppendOnlyModel):
    """Someone asked for data to be erased (a subject, one memory or a whole scope): who, when, why.

    Its status lives in events. ``subject`` is set for a subject's erasure, ``memory`` for one memory's,
    and a scope's deletion has neither (``scope`` is the deleted scope).
    """

    kind = models.CharField(max_length=10, choices=ErasureKind.choices, default=ErasureKind.SUBJECT)
    subject = models.ForeignKey(
        Subject, on_delete=models.PROTECT, null=True, blank=True, related_name="erasure_requests"
    )
    memory = models.ForeignKey(
        Memory, on_delete=models.PROTECT, null=True, blank=True, to_field="seq", db_column="memory_seq", related_name="+"
    )
    # The scope an API client filed it through (None when an operator filed it); the erasure is global.
    scope = models.ForeignKey(Scope, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    reason = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        triggers = append_only_triggers()
        constraints = [
            # each kind names exactly what it erases
            models.CheckConstraint(
                condition=models.Q(kind="subject", subject__isnull=False, memory__isnull=True)
                | models.Q(kind="memory", subject__isnull=True, memory__isnull=False, scope__isnull=False)
                | models.Q(kind="scope", subject__isnull=True, memory__isnull=True, scope__isnull=False),
                name="memories_erasurerequest_kind_target",
            ),
            # one request per forgotten memory and per deleted scope: a concurrent repeat loses the race here
            models.UniqueConstraint(
                fields=["memory"], condition=models.Q(kind="memory"), name="memories_erasurerequest_memory_once"
            ),
            models.UniqueConstraint(
                fields=["scope"], condition=models.Q(kind="scope"), name="memories_erasurerequest_scope_once"
            ),
        ]
        permissions = [
            ("process_erasurerequest", "Can process an erasure request (shred keys, rebuild views)"),
            ("erase_subject_everywhere", "Can file an erasure of a subject in every scope"),
        ]

    def __str__(self) -> str:
        target = {"memory": f"memory {self.memory_id}", "scope": f"scope {self.scope_id}"}.get(self.kind, self.subject_id)
        return f"erasure request #{self.pk} for {target}"


class ErasureStatus(models.TextChoices):
    REQUESTED = "requested"
    KEYS_SHREDDED = "keys_shredded"
    VIEWS_REBUILT = "views_rebuilt"
    FAILED = "failed"


class ErasureEvent(AppendOnlyModel):
    """One step of an erasure request; the newest event is the request's status."""

    request = models.ForeignKey(ErasureRequest, on_delete=models.PROTECT, related_name="events")
    status = models.CharField(max_length=20, choices=ErasureStatus.choices)
    detail = models.TextField(blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Each step but `failed` happens once; a concurrent second run loses the race here.
            models.UniqueConstraint(
                fields=["request", "status"],
                condition=~models.Q(status="failed"),
                name="memories_erasureevent_step_once",
            ),
        ]
        triggers = append_only_triggers()


# ---------------------------------------------------------------------------
# The search index (memories.search_index): BM25 postings kept up to date by appends and erasures
# ---------------------------------------------------------------------------
# The search index's current tokenizer (memories.search_index.TOKENIZERS): 1 lower-cased words, 2 the same
# Porter-stemmed. A new index is built with it.
SEARCH_TOKENIZER = 2


class SearchIndex(models.Model):
    """A scope's search index: the secret of its term digests (HMAC-SHA256), wrapped by the master key, and the
    totals BM25 needs (documents and their summed length), kept by the same transactions as the postings.

    Terms are stored only as digests under this key, so the index holds no plaintext word, and once the key is
    shredded (the scope deleted) nobody can test a guessed word against what is left. A key of its own, not one
    derived from the scope key: a backfill re-keys the scope key, and every digest would change with it.
    """

    scope = models.OneToOneField(Scope, on_delete=models.PROTECT, related_name="search_index")
    wrapped_key = models.BinaryField(null=True)  # NULL once shredded
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(default=timezone.now)
    shredded_at = models.DateTimeField(null=True, blank=True)
    num_documents = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)  # in tokens: the mean document length is this / num_documents
    # +1 by every change other than an append (an erasure, a backfill): a process's cached postings of this scope
    # (memories.search_index) are then dropped; an append only adds seqs past the scope's head, read as a delta
    generation = models.BigIntegerField(default=0)
    # how its postings were tokenized (memories.search_index.TOKENIZERS): searches and appends of the scope use
    # this one; search_index_backfill rebuilds an index of an older one with the current one
    tokenizer = models.PositiveSmallIntegerField(default=SEARCH_TOKENIZER)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
                | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True),
                name="memories_searchindex_key_xor_shredded",
            ),
        ]


class SearchTerm(models.Model):
    """How many of a scope's indexed memories hold a term (BM25's document frequency), by the term's digest.

    Kept so that a search knows each query term's weight before reading any posting, and can skip the postings
    of frequent terms that cannot change the top results (memories.search_index.rank). A term no memory holds
    any more is deleted with the erasure that took its last memory.
    """

    pk = models.CompositePrimaryKey("scope", "term")
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    term = models.BigIntegerField()
    df = models.BigIntegerField()


class SearchDocument(models.Model):
    """One indexed memory: its length in tokens (BM25's document length) and what the search filters on.

    Written in the append's transaction, deleted in the erasure's; the postings repeat ``length`` so that
    scoring reads only them (an index-only scan), and this table gives the scope's document count and mean length.
    """

    memory = models.OneToOneField(
        Memory, on_delete=models.DO_NOTHING, to_field="seq", db_column="seq", primary_key=True,
        related_name="search_document",
    )
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    subject = models.ForeignKey(Subject, on_delete=models.DO_NOTHING, db_constraint=False, null=True, related_name="+")
    created_at = models.DateTimeField()
    length = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["scope", "memory", "length"], name="memories_searchdoc_scope")]


class SearchPosting(models.Model):
    """A term of one indexed memory: the term's digest under the scope's SearchIndex key and its count there.

    The primary key (seq, term) is what an erasure deletes by; the (scope, term, seq, tf, length) index is what
    scoring reads, without touching the table.
    """

    pk = models.CompositePrimaryKey("seq", "term")
    seq = models.BigIntegerField()
    term = models.BigIntegerField()  # the first 8 bytes of HMAC-SHA256(scope's index key, term), signed
    # no index of its own: the (scope, term, ...) index below starts with it
    scope = models.ForeignKey(Scope, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+")
    tf = models.PositiveIntegerField()
    length = models.PositiveIntegerField()  # the memory's length in tokens (SearchDocument.length)

    class Meta:
        indexes = [models.Index(fields=["scope", "term", "seq", "tf", "length"], name="memories_searchposting_term")]


from memories.tokens import ApiTokenProfile  # noqa: E402,F401 - a model of this app, kept in its own module
