"""Serializers of a scope's cartridge versions: compile and evaluate requests and what they accept, the version
list and detail, their history, and activations."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework import serializers

from core.jobs import JobOutcome
from core.serializers import StrictSerializer


class CompileRequestSerializer(StrictSerializer):
    """Ask for a compile of the scope at ``log_head`` (default: the log head now)."""

    log_head = serializers.IntegerField(required=False, min_value=1, allow_null=True)
    activate = serializers.BooleanField(
        required=False, default=False, help_text="Queue evaluate + activate (through the gate) after the compile."
    )


@dataclass(frozen=True)
class CompileAccepted:
    """The 202 answer to a compile request, from the job's outcome (the version once it ran in-process)."""

    scope: str
    log_head: int
    task_id: str
    status: str
    version_id: int | None
    activate: bool

    @classmethod
    def of(cls, outcome: JobOutcome, *, scope: Any, log_head: int, activate: bool) -> CompileAccepted:
        version_id = (outcome.result or {}).get("version") if outcome.done else None
        return cls(scope.name, log_head, outcome.task_id, outcome.status, version_id, activate)


@dataclass(frozen=True)
class EvaluateAccepted:
    """The 202 answer to an evaluation request, from the job's outcome (the verdict once it ran in-process)."""

    scope: str
    version_id: int
    task_id: str
    status: str
    evaluation_id: int | None
    passed: bool | None

    @classmethod
    def of(cls, outcome: JobOutcome, *, scope: Any, version: Any) -> EvaluateAccepted:
        result = outcome.result or {}
        return cls(scope.name, version.pk, outcome.task_id, outcome.status, result.get("evaluation"), result.get("passed"))


class CompileAcceptedSerializer(serializers.Serializer):
    """The 202 answer to a compile request."""

    scope = serializers.CharField()
    log_head = serializers.IntegerField()
    task_id = serializers.CharField()
    status = serializers.ChoiceField(choices=["queued", "done"])
    version_id = serializers.IntegerField(allow_null=True, help_text="Known when the task already ran (eager mode).")
    activate = serializers.BooleanField()


class EvaluateAcceptedSerializer(serializers.Serializer):
    """The 202 answer to an evaluation request."""

    scope = serializers.CharField()
    version_id = serializers.IntegerField()
    task_id = serializers.CharField()
    status = serializers.ChoiceField(choices=["queued", "done"])
    evaluation_id = serializers.IntegerField(allow_null=True)
    passed = serializers.BooleanField(allow_null=True)


class HistoryEventSerializer(serializers.Serializer):
    """One event of a version: compiled (log_head), evaluated (passed, reasons), activated (kind), destroyed (reason).

    Each event carries only its own fields (selectors.version_history): a missing key is left out, not null.
    """

    event = serializers.ChoiceField(choices=["compiled", "evaluated", "activated", "destroyed"])
    at = serializers.DateTimeField()
    actor = serializers.CharField(allow_null=True)
    log_head = serializers.IntegerField(required=False, help_text="compiled: the log head it was compiled at")
    passed = serializers.BooleanField(required=False, help_text="evaluated: whether the gate passed")
    reasons = serializers.ListField(child=serializers.CharField(), required=False, help_text="evaluated: why it failed")
    evaluation = serializers.IntegerField(required=False, help_text="evaluated: the evaluation's id")
    kind = serializers.CharField(required=False, help_text="activated: activate or rollback")
    activation = serializers.IntegerField(required=False, help_text="activated: the activation's id")
    reason = serializers.CharField(required=False, help_text="destroyed: why")
    erasure_request = serializers.IntegerField(required=False, allow_null=True,
                                               help_text="destroyed: the erasure request that destroyed it")

    def to_representation(self, instance: Any) -> dict[str, Any]:
        # allow_null would render an absent erasure_request as null on every event: only the destroyed one has it
        return {name: value for name, value in super().to_representation(instance).items()
                if name in instance}


class VersionKeySerializer(serializers.Serializer):
    """What a cartridge was compiled from (its compatibility key)."""

    backend = serializers.CharField()
    model_id = serializers.CharField()
    dtype = serializers.CharField()
    quant = serializers.CharField()
    rope_config = serializers.CharField()
    weights_fingerprint = serializers.CharField()
    tokenizer_fingerprint = serializers.CharField()
    template_fingerprint = serializers.CharField()
    format_version = serializers.IntegerField()


class VersionConfigurationSerializer(serializers.Serializer):
    """The KV configuration a version was compiled under (id: the operator's switch row, null for settings)."""

    id = serializers.IntegerField(source="configuration_id", allow_null=True)
    backend = serializers.CharField(source="config_backend")
    model = serializers.CharField(source="config_model")
    dtype = serializers.CharField(source="config_dtype")
    quant = serializers.CharField(source="config_quant")


class VersionSerializer(serializers.Serializer):
    """A cartridge version with its derived state and history (renders selectors.VersionRead)."""

    id = serializers.IntegerField(source="version.pk")
    scope = serializers.CharField(source="version.scope.name")
    state = serializers.ChoiceField(choices=["compiled", "passed", "failed", "active", "superseded", "destroyed"])
    log_head = serializers.IntegerField(source="version.log_head")
    num_tokens = serializers.IntegerField(source="version.num_tokens")
    num_memories = serializers.IntegerField(source="version.num_memories")
    size_bytes = serializers.IntegerField(source="version.size_bytes")
    sha256 = serializers.CharField(source="version.sha256")
    manifest_digest = serializers.CharField(source="version.manifest_digest")
    key = VersionKeySerializer(source="version")
    configuration = VersionConfigurationSerializer(source="version")
    supersedes = serializers.IntegerField(source="version.supersedes_id", allow_null=True)
    created_at = serializers.DateTimeField(source="version.created_at")
    created_by = serializers.CharField(source="version.created_by.get_username", allow_null=True)
    history = HistoryEventSerializer(many=True)


class VersionDetailSerializer(VersionSerializer):
    """One version read on its own: everything in the list, plus the manifest (which memories it holds)."""

    manifest = serializers.JSONField(source="version.manifest")


class VersionPageSerializer(serializers.Serializer):
    """A page of a scope's versions and the version serving the scope now (null when none)."""

    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = VersionSerializer(many=True)
    active_version = serializers.IntegerField(allow_null=True)


class ActivationSerializer(serializers.Serializer):
    """An activation: which version now serves the scope, on which evaluation, by whom."""

    id = serializers.IntegerField(source="pk")
    scope = serializers.CharField(source="scope.name")
    version_id = serializers.IntegerField()
    evaluation_id = serializers.IntegerField()
    kind = serializers.CharField()
    actor = serializers.CharField(source="actor.get_username", allow_null=True)
    created_at = serializers.DateTimeField()


class EmptyRequestSerializer(StrictSerializer):
    """An action that takes no parameters (anything sent is an unknown field)."""
