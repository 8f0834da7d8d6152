"""Serializers for the cartridge API: every request body is validated here, unknown keys rejected."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework import serializers

from cartridges import conf
from cartridges.models import MAX_DEBOUNCE_S, MAX_KEEP_PREVIOUS_VERSIONS
from core.jobs import JobOutcome
from core.serializers import Choice, StrictSerializer, TextField
from kvengine import ANSWER_MODES as MODES
from kvengine import BACKENDS, DTYPES, QUANTS

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


class KvConfigurationSwitchSerializer(StrictSerializer):
    """Switch the active KV configuration: a known backend, model, precision (dtype) and quant."""

    backend = Choice(BACKENDS)
    model = TextField(max_length=200, allow_blank=False)
    dtype = Choice(DTYPES)
    quant = Choice(QUANTS, default="none")

    def validate_model(self, value: str) -> str:
        allowed = conf.allowed_models()
        if value not in allowed:
            raise serializers.ValidationError(
                f"has to be one of {allowed} but got {value!r} (operators extend the list with MNESIO_KV_ALLOWED_MODELS)"
            )
        return value


class KvConfigurationSerializer(serializers.Serializer):
    """The active KV configuration (``source``: "switch" for an operator's row, "settings" for the default)."""

    id = serializers.IntegerField(allow_null=True)
    source = serializers.ChoiceField(choices=["switch", "settings"])
    backend = serializers.CharField()
    model = serializers.CharField()
    dtype = serializers.CharField()
    quant = serializers.CharField()
    device = serializers.CharField()
    created_at = serializers.DateTimeField(allow_null=True)
    created_by = serializers.CharField(allow_null=True)


class ActiveVersionMetricsSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    log_head = serializers.IntegerField()
    num_tokens = serializers.IntegerField()
    num_memories = serializers.IntegerField()
    size_bytes = serializers.IntegerField()
    dtype = serializers.CharField()
    quant = serializers.CharField()
    created_at = serializers.DateTimeField()
    age_s = serializers.FloatField()
    log_head_lag = serializers.IntegerField(
        help_text="The view's head (global for operators; the newest memory of the client's scopes otherwise) minus "
                  "the version's head."
    )


class ScopeMetricsSerializer(serializers.Serializer):
    scope = serializers.CharField()
    num_memories = serializers.IntegerField()
    scope_head = serializers.IntegerField()
    lag = serializers.IntegerField(help_text="Memories of the scope the serving cartridge does not hold.")
    lag_s = serializers.FloatField(help_text="Age in seconds of the oldest memory the serving cartridge does not hold (0: none).")
    serving = serializers.BooleanField()
    layout = serializers.ChoiceField(choices=["prefix", "routed", "auto"], help_text="The scope's layout setting.")
    routed_chunks = serializers.DictField(child=serializers.IntegerField(), help_text="`count` and sealed `size_bytes` of its routed chunks.")
    activated_version_id = serializers.IntegerField(allow_null=True)
    active_version = ActiveVersionMetricsSerializer(allow_null=True)


class GateResultMetricsSerializer(serializers.Serializer):
    evaluation_id = serializers.IntegerField()
    version_id = serializers.IntegerField()
    scope = serializers.CharField()
    passed = serializers.BooleanField()
    reasons = serializers.ListField(child=serializers.CharField())
    stage = serializers.CharField()
    fidelity = serializers.FloatField(allow_null=True)
    accuracy_cartridge = serializers.FloatField(allow_null=True)
    accuracy_text = serializers.FloatField(allow_null=True)
    gate = serializers.CharField(
        allow_null=True, help_text="Which gate ran: full or incremental (null if the evaluation did not record it).")
    gate_seconds = serializers.FloatField(allow_null=True, help_text="What the gate cost, in seconds.")
    created_at = serializers.DateTimeField()


class GateMetricsSerializer(serializers.Serializer):
    passed = serializers.IntegerField()
    failed = serializers.IntegerField()
    recent = GateResultMetricsSerializer(many=True)


class LatencySummarySerializer(serializers.Serializer):
    count = serializers.IntegerField()
    ttft_p50_s = serializers.FloatField(allow_null=True)
    ttft_p95_s = serializers.FloatField(allow_null=True)
    total_p50_s = serializers.FloatField(allow_null=True)
    total_p95_s = serializers.FloatField(allow_null=True)


class LatencyMetricsSerializer(serializers.Serializer):
    window = serializers.IntegerField(help_text="Newest answers per mode the percentiles (nearest rank) cover.")
    cartridge = LatencySummarySerializer()
    text = LatencySummarySerializer()


class VersionCountsSerializer(serializers.Serializer):
    compiled = serializers.IntegerField()
    failed = serializers.IntegerField(help_text="Versions whose newest evaluation failed.")
    destroyed = serializers.IntegerField()
    active = serializers.IntegerField(help_text="Scopes with a serving version.")


class QuantSizeSerializer(serializers.Serializer):
    quant = serializers.CharField()
    count = serializers.IntegerField()
    total_bytes = serializers.IntegerField()
    mean_bytes = serializers.IntegerField()


class ErasureCountsSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    done = serializers.IntegerField()
    failed = serializers.IntegerField()


class AskMetricsSerializer(serializers.Serializer):
    in_flight = serializers.IntegerField(help_text="Answer slots this process holds now (sync, streamed, OpenAI-compatible).")
    limit = serializers.IntegerField(help_text="MNESIO_MAX_WAITING_ASKS: past it an ask answers 429.")
    async_pending = serializers.IntegerField(help_text="Async asks this process filed that wait for an answer.")
    async_limit = serializers.IntegerField(help_text="MNESIO_MAX_PENDING_ASYNC_ASKS: past it an async ask answers 429.")


class KvMetricsSerializer(serializers.Serializer):
    """The shape of GET /api/kv/metrics (built by ``cartridges.metrics.kv_metrics``)."""

    generated_at = serializers.DateTimeField()
    log_head = serializers.IntegerField()
    configuration = KvConfigurationSerializer()
    scopes = ScopeMetricsSerializer(many=True)
    gate = GateMetricsSerializer()
    latency = LatencyMetricsSerializer()
    versions = VersionCountsSerializer()
    sizes_by_quant = QuantSizeSerializer(many=True)
    erasures = ErasureCountsSerializer()
    asks = AskMetricsSerializer(help_text="This web process's asks (each process of a web tier counts its own).")
    routed = serializers.DictField(help_text="The routed layout's repair, chunk quant, top k, token budget and this process's chunk LRU.")


class ScopeSettingsSerializer(serializers.Serializer):
    scope = serializers.CharField()
    auto_refresh = serializers.ChoiceField(
        choices=["manual", "on_append"],
        help_text="`manual` (default): compile when asked; `on_append`: compile, gate and activate after appends, once "
        "per debounce window (README: auto-refresh).",
    )
    auto_refresh_debounce_s = serializers.IntegerField(help_text="Seconds to wait after an append (on_append only).")
    keep_previous_versions = serializers.IntegerField(
        allow_null=True, help_text="Versions before the active one to keep restorable (default 3); null keeps every one."
    )
    layout = serializers.ChoiceField(
        choices=["prefix", "routed", "auto"],
        help_text="`prefix`: one cartridge of the whole scope (up to the model's window); `routed`: one chunk per memory, "
        "the question's memories assembled per ask (any size); `auto` (default): prefix while it serves, routed past the window.",
    )
    updated_at = serializers.DateTimeField(allow_null=True, help_text="null: never changed, the defaults apply.")
    updated_by = serializers.CharField(allow_null=True)


class ScopeSettingsChangeSerializer(StrictSerializer):
    """A partial change: only the fields sent change."""

    auto_refresh = Choice(["manual", "on_append"], required=False)
    auto_refresh_debounce_s = serializers.IntegerField(required=False, min_value=0, max_value=MAX_DEBOUNCE_S)
    keep_previous_versions = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_KEEP_PREVIOUS_VERSIONS
    )
    layout = Choice(["prefix", "routed", "auto"], required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs:
            raise serializers.ValidationError(
                {"body": [f"has to change at least one of {sorted(self.fields)} but changes none"]}
            )
        return attrs
