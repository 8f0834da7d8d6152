"""Input and output shapes of the memories API (validation of shape only; rules live in services)."""
from __future__ import annotations

from rest_framework import serializers

from core.serializers import StrictSerializer
from memories.services import MAX_IDEMPOTENCY_KEY_CHARS, MAX_REASON_CHARS, MAX_SUBJECT_CHARS


class MemoryAppendSerializer(StrictSerializer):
    # No trimming: the content is stored exactly as sent (the service rejects whitespace-only content).
    content = serializers.CharField(trim_whitespace=False)
    subject = serializers.CharField(required=False, allow_null=True, max_length=MAX_SUBJECT_CHARS, trim_whitespace=False)
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, max_length=MAX_IDEMPOTENCY_KEY_CHARS, trim_whitespace=False
    )


class OpenedMemorySerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    subject = serializers.CharField(allow_null=True)
    text = serializers.CharField(allow_null=True, help_text="The plaintext; null when the memory is erased.")
    erased = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class ScopeSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()


class HeadSerializer(serializers.Serializer):
    scope = serializers.CharField()
    head = serializers.IntegerField(
        help_text="The scope's head (its newest seq; never the global head): pass it as `as_of` to read a stable view."
    )
    scope_head = serializers.IntegerField(help_text="The newest seq in this scope (0 when it has none).")


class ErasureRequestFileSerializer(StrictSerializer):
    subject = serializers.CharField(max_length=MAX_SUBJECT_CHARS, trim_whitespace=False)
    reason = serializers.CharField(max_length=MAX_REASON_CHARS)


class ErasureEventSerializer(serializers.Serializer):
    status = serializers.CharField()
    detail = serializers.CharField()
    created_at = serializers.DateTimeField()


class ErasureRequestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    subject = serializers.CharField(source="subject.external_id")
    reason = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.get_username", default=None)
    created_at = serializers.DateTimeField()
    status = serializers.SerializerMethodField()
    events = ErasureEventSerializer(many=True, source="events.all")

    def get_status(self, obj) -> str:
        events = list(obj.events.all())
        return events[-1].status if events else "requested"
