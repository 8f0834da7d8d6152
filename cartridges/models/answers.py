"""Asks: the record that a question was answered (never its text) and the sealed questions waiting for a worker."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from cartridges.models.versions import CartridgeVersion


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
