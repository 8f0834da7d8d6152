"""Serializers of questions: an ask (a question or a conversation's turns) and its answer, and evaluation cases."""
from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from core.serializers import Choice, StrictSerializer, TextField
from kvengine import ANSWER_MODES as MODES

# Bounds on evaluation cases (a case is a question plus the answers counted as correct).
MAX_ANSWERS_PER_CASE = 20
MAX_ANSWER_CHARS = 500


def _check_question(value: str) -> str:
    """Refuse questions over MNESIO_MAX_QUESTION_CHARS (read at call time, so tests can override it)."""
    limit = settings.MNESIO_MAX_QUESTION_CHARS
    if len(value) > limit:
        raise serializers.ValidationError(
            f"has {len(value)} characters but at most {limit} are allowed (MNESIO_MAX_QUESTION_CHARS)"
        )
    return value


class TurnSerializer(StrictSerializer):
    """An earlier turn of the conversation."""

    role = Choice(["user", "assistant"])
    content = TextField(trim_whitespace=True, allow_blank=False)


class AskSerializer(StrictSerializer):
    """A question for a scope; ``mode=text`` re-reads the memories instead of using the cartridge."""

    question = TextField(trim_whitespace=True, allow_blank=False)
    mode = Choice(MODES, default="cartridge")
    stream = serializers.BooleanField(default=False, help_text="answer as text/event-stream, an event per token")
    # ``async`` is a Python keyword, so the field is declared by name (the JSON field is "async")
    locals()["async"] = serializers.BooleanField(
        default=False, help_text="answer 202 with a Location to collect the answer once, later"
    )
    system = TextField(required=False, allow_blank=True, default="", trim_whitespace=True,
                       help_text="the client's system text; it goes into the first user turn, after the memories")
    history = TurnSerializer(many=True, required=False, default=list,
                             help_text="earlier turns, oldest first (the first a user's); `question` is answered after them")

    def validate_question(self, value: str) -> str:
        return _check_question(value)

    def validate(self, attrs: dict) -> dict:
        if attrs.get("stream") and attrs.get("async"):
            raise serializers.ValidationError({"async": "`async` and `stream` cannot both be true: pick one"})
        return attrs


class AnswerAcceptedSerializer(serializers.Serializer):
    """A question filed for a gpu worker: where to collect its answer (also the Location header)."""

    answer_request = serializers.IntegerField()
    location = serializers.CharField()
    status = serializers.CharField()


class AnswerSerializer(serializers.Serializer):
    """An answer, the cartridge version it came from (None when re-read as text) and its timings."""

    answer = serializers.CharField()
    mode = serializers.ChoiceField(choices=MODES)
    version_id = serializers.IntegerField(allow_null=True)
    ttft_s = serializers.FloatField()
    total_s = serializers.FloatField()
    num_context_tokens = serializers.IntegerField()
    num_prompt_tokens = serializers.IntegerField()
    note = serializers.CharField(allow_blank=True)
    layout = serializers.ChoiceField(choices=["prefix", "routed"], help_text="What answered in mode `cartridge`: the "
                                     "scope's prefix cartridge, or its routed chunks (the memories in `memory_seqs`).")
    memory_seqs = serializers.ListField(child=serializers.IntegerField(), allow_null=True,
                                        help_text="routed: the memories read, in log order; null: the whole scope.")
    num_memories_after_version = serializers.IntegerField(
        help_text="Memories appended after `version_id` that this answer read on top of its blocks (computed in memory "
        "as the refresh will: the answer is the refreshed version's); 0 when the version is at the scope's head.")
    num_memories_unread = serializers.IntegerField(
        help_text="Memories appended after `version_id` that this answer did not read (more than "
        "MNESIO_FRESH_MAX_MEMORIES, or the scope past the model's window; `note` says which); the refresh catches up.")


class EvaluationCaseSerializer(StrictSerializer):
    """An evaluation case of a scope: a question, the answers that count as correct, the subjects it concerns.

    ``subjects`` (optional) names subjects with memories in the scope; subjects whose memories quote an
    answer are linked as well. Once one of them is erased the case is erased: ``erased_at`` is set and
    ``question`` and ``answers`` are null.
    """

    id = serializers.IntegerField(read_only=True)
    question = TextField(trim_whitespace=True, allow_blank=False)
    answers = serializers.ListField(
        child=TextField(allow_blank=False, max_length=MAX_ANSWER_CHARS),
        min_length=1,
        max_length=MAX_ANSWERS_PER_CASE,
        allow_empty=False,
    )
    subjects = serializers.ListField(
        child=TextField(allow_blank=False, max_length=200), max_length=100, required=False,
        help_text="external ids of subjects in the scope this case concerns",
    )
    erased_at = serializers.DateTimeField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)

    def validate_question(self, value: str) -> str:
        return _check_question(value)
