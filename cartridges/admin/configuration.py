"""The runtime KV configuration switch: each row is one operator switch, made through the service."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from cartridges import conf, jobs, selectors
from cartridges.models import KvConfiguration
from cartridges.services.config import backends_allowed
from kvengine import DTYPES, QUANTS

from .common import SWITCH_PERMISSION


class KvConfigurationForm(forms.ModelForm):
    """Switch the engine: a known backend, model, precision and quant (validated before the service runs)."""

    backend = forms.ChoiceField(choices=())
    model = forms.ChoiceField(choices=())
    dtype = forms.ChoiceField(choices=[(d, d) for d in DTYPES], label="precision (dtype)")
    quant = forms.ChoiceField(choices=[(q, q) for q in QUANTS])

    class Meta:
        model = KvConfiguration
        fields = ["backend", "model", "dtype", "quant"]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [(m, m) for m in conf.allowed_models()]  # read now: tests override it
        self.fields["backend"].choices = [(b, b) for b in backends_allowed()]  # no 'fake' unless allowed
        active = selectors.active_configuration()
        for name in self.Meta.fields:
            self.fields[name].initial = getattr(active, name)


@admin.register(KvConfiguration)
class KvConfigurationAdmin(admin.ModelAdmin):
    """Each row is one operator switch; the newest is active. Adding one switches (and queues recompiles)."""

    form = KvConfigurationForm
    list_display = ["id", "active", "backend", "model", "dtype", "quant", "created_by", "created_at"]
    ordering = ["-created_at", "-id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(SWITCH_PERMISSION)  # adding a row IS the switch

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(boolean=True, description="active")
    def active(self, obj: KvConfiguration) -> bool:
        row = selectors.active_configuration().row
        return row is not None and row.pk == obj.pk

    def save_model(self, request: HttpRequest, obj: KvConfiguration, form: forms.Form, change: bool) -> None:
        # The switch (validation) and the recompiles of every scope (cartridges.jobs); the form only collects input.
        row = jobs.kv_configuration_switch_enqueue(
            backend=obj.backend, model=obj.model, dtype=obj.dtype, quant=obj.quant, actor=request.user
        )
        obj.pk, obj.created_at, obj.created_by = row.pk, row.created_at, row.created_by
        obj._state.adding = False
        self.message_user(request, "Cartridges of the previous configuration stop serving; recompiles of every scope "
                                   "are queued (compile, gate, activate).", messages.INFO)
