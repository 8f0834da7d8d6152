"""What happened to a version (evaluated, activated, destroyed) and the operator's questions the gate asks."""
from __future__ import annotations

import pgtrigger
from django.conf import settings
from django.db import models

from cartridges.models.versions import CartridgeVersion, LifecycleRecord
from core.models import AppendOnlyModel, append_only_triggers


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
