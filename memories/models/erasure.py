"""Erasure requests (a subject, one memory or a whole scope) and the events that are their status."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.models import AppendOnlyModel, append_only_triggers
from memories.models.keys import Subject
from memories.models.log import Memory
from memories.models.scopes import Scope


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
