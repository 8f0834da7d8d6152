"""Serializers of the KV configuration (the active one and a switch) and of a scope's settings."""
from __future__ import annotations

from typing import Any

from rest_framework import serializers

from cartridges import conf
from cartridges.models import MAX_DEBOUNCE_S, MAX_KEEP_PREVIOUS_VERSIONS
from core.serializers import Choice, StrictSerializer, TextField
from kvengine import BACKENDS, DTYPES, QUANTS


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


class ScopeSettingsSerializer(serializers.Serializer):
    scope = serializers.CharField()
    auto_refresh = serializers.ChoiceField(
        choices=["manual", "on_append"],
        help_text="`manual` (default): compile when asked; `on_append`: compile, gate and activate after appends, once "
        "per debounce window (docs/api.md, Cartridges).",
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
