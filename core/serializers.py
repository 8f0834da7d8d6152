"""The strict serializer and the strict fields every API body goes through (DRF's defaults are lenient)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class StrictSerializer(serializers.Serializer):
    """Rejects request keys it does not accept for writing, naming each one: a typo (`contnet`) is a 400, not a drop."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = sorted(name for name, field in self.fields.items() if not field.read_only)
            unknown = sorted(str(key) for key in data if key not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {key: [f"unknown field; the accepted fields are {writable}"] for key in unknown}
                )
        return super().to_internal_value(data)


class TextField(serializers.CharField):
    """A CharField that accepts only JSON strings (DRF's own turns numbers into text silently)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class Choice(serializers.ChoiceField):
    """A ChoiceField whose error lists the allowed values and what was received."""

    def __init__(self, choices: Any, **kwargs: Any):
        super().__init__(choices, **kwargs)
        self.error_messages["invalid_choice"] = f"has to be one of {list(self.choices)} but got {{input!r}}"
