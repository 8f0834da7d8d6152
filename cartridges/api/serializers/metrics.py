"""Serializers of the KV metrics (cartridges.metrics): per scope, the gate, latencies, counts and asks."""
from __future__ import annotations

from rest_framework import serializers

from .configuration import KvConfigurationSerializer


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
