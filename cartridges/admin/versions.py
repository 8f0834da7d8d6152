"""Cartridge versions: read-only rows with their history (inlines), state in a constant number of queries per
page (selectors.versions_with_state), and actions that go through jobs and services: compile and evaluate
(cartridges.jobs), activate through the gate and roll back (services).
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from cartridges import jobs, selectors, services
from cartridges.models import CartridgeActivation, CartridgeDestruction, CartridgeEvaluation, CartridgeVersion
from cartridges.services.errors import GateFailed
from core.errors import MnesioError
from memories.models import Scope
from memories.selectors import scope_head

from .common import (
    ACTIVATE_PERMISSION,
    COMPILE_PERMISSION,
    EVALUATE_PERMISSION,
    ReadOnlyInline,
    outcome_text,
    reasons_html,
)


class EvaluationInline(ReadOnlyInline):
    model = CartridgeEvaluation
    fields = ["created_at", "passed", "stage", "fidelity", "accuracy", "reasons_list", "config_key", "created_by"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    @admin.display(description="stage")
    def stage(self, obj: CartridgeEvaluation) -> str:
        return (obj.figures or {}).get("stage", "evaluate")

    @admin.display(description="fidelity (top-1)")
    def fidelity(self, obj: CartridgeEvaluation) -> Any:
        return ((obj.figures or {}).get("fidelity") or {}).get("top1_agreement", "–")

    @admin.display(description="accuracy cartridge / text / retrieval")
    def accuracy(self, obj: CartridgeEvaluation) -> str:
        acc = (obj.figures or {}).get("accuracy") or {}
        if not acc.get("num_cases"):
            return "no cases"
        return f"{acc.get('cartridge')} / {acc.get('text')} / {acc.get('retrieval')} on {acc['num_cases']} case(s)"

    @admin.display(description="reasons")
    def reasons_list(self, obj: CartridgeEvaluation) -> str:
        return reasons_html(obj.reasons) if obj.reasons else "–"


class ActivationInline(ReadOnlyInline):
    model = CartridgeActivation
    fk_name = "version"
    fields = ["created_at", "kind", "evaluation", "actor"]
    readonly_fields = fields
    ordering = ["created_at", "id"]


class DestructionInline(ReadOnlyInline):
    model = CartridgeDestruction
    fields = ["created_at", "reason", "erasure_request", "actor"]
    readonly_fields = fields


class ScopeVersionInline(ReadOnlyInline):
    """A scope's cartridge versions with their derived state (on the Scope admin page)."""

    model = CartridgeVersion
    fk_name = "scope"
    fields = ["link", "state", "log_head", "num_memories", "num_tokens", "size_bytes", "dtype", "quant", "created_at"]
    readonly_fields = fields
    ordering = ["-id"]
    verbose_name_plural = "cartridge versions"

    @admin.display(description="version")
    def link(self, obj: CartridgeVersion) -> str:
        return format_html('<a href="{}">#{}</a>', reverse("admin:cartridges_cartridgeversion_change", args=[obj.pk]), obj.pk)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return selectors.versions_with_state(super().get_queryset(request))

    @admin.display(description="state")
    def state(self, obj: CartridgeVersion) -> str:
        # annotated rows: only the scope's newest activation costs queries (the configuration, the erased check)
        return selectors.versions_states([obj])[obj.pk]


# ---------------------------------------------------------------------------
# Actions (module-level so the Scope admin of the memories app can offer them too)
# ---------------------------------------------------------------------------
def _scopes_of(queryset: QuerySet) -> list[Scope]:
    if queryset.model is Scope:
        return list(queryset.order_by("name"))
    return list(Scope.objects.filter(pk__in=queryset.values("scope_id")).order_by("name"))


@admin.action(description="Compile a cartridge of the scope(s) at their newest memory", permissions=["compile_cartridge"])
def compile_scopes(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for scope in _scopes_of(queryset):
        # the scope's own head, as the API's default: the version's head is shown to the scope's clients
        head = scope_head(scope=scope)
        if not head:
            modeladmin.message_user(request, f"Scope '{scope.name}': no memories to compile.", messages.WARNING)
            continue
        try:
            _, outcome = jobs.cartridge_compile_enqueue(scope=scope, log_head=head, actor_id=request.user.pk)
        except MnesioError as exc:
            modeladmin.message_user(request, f"Scope '{scope.name}': {exc.message}", messages.ERROR)
            continue
        level = messages.ERROR if outcome.refusal is not None else messages.SUCCESS
        modeladmin.message_user(request, f"Scope '{scope.name}' at log head {head}: {outcome_text(outcome)}.", level)


@admin.action(description="Roll back the scope(s) to the previous version (through the gate)",
              permissions=["activate_cartridge"])
def rollback_scopes(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for scope in _scopes_of(queryset):
        try:
            activation = services.cartridge_rollback(scope=scope, actor=request.user)
        except GateFailed as exc:
            modeladmin.message_user(
                request, format_html("Scope '{}': {}{}", scope.name, exc.message, reasons_html(exc.reasons)),
                messages.ERROR,
            )
        except MnesioError as exc:
            modeladmin.message_user(request, f"Scope '{scope.name}': {exc.message}", messages.ERROR)
        else:
            modeladmin.message_user(
                request, f"Scope '{scope.name}' rolled back to version {activation.version_id}.", messages.SUCCESS
            )


# ---------------------------------------------------------------------------
# Cartridge versions
# ---------------------------------------------------------------------------
class VersionChangeList(ChangeList):
    """The version list: every row's state is derived once for the page, in a fixed number of queries."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        return selectors.versions_with_state(super().get_queryset(request, exclude_parameters))

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        states = selectors.versions_states(self.result_list)  # evaluates the page once; the template reuses it
        for version in self.result_list:
            version.page_state = states[version.pk]


@admin.register(CartridgeVersion)
class CartridgeVersionAdmin(admin.ModelAdmin):
    """Versions are read-only; their history is the inlines; actions go through the services."""

    list_display = ["id", "scope", "state", "log_head", "num_memories", "num_tokens", "size_bytes", "dtype", "quant",
                    "configuration_label", "created_by", "created_at"]
    list_filter = ["scope", "quant", "dtype", "config_backend", "config_model"]
    list_select_related = ["scope", "created_by"]
    search_fields = ["=id", "scope__name"]
    ordering = ["-id"]
    inlines = [EvaluationInline, ActivationInline, DestructionInline]
    actions = ["evaluate", "activate", compile_scopes, rollback_scopes]
    fields = ["scope", "state", "configuration_label", "log_head", "num_memories", "num_tokens", "size_bytes",
              "stored_sha256", "storage_name", "manifest_digest", "manifest_summary",
              "backend", "model_id", "dtype", "quant", "rope_config", "weights_fingerprint", "tokenizer_fingerprint",
              "template_fingerprint", "key_digest", "format_version", "supersedes", "created_by", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # versions come from compiles (the action, the API or a task), never from a form

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # ``@admin.action(permissions=[name])`` asks ``has_<name>_permission``
    def has_compile_cartridge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(COMPILE_PERMISSION)

    def has_evaluate_cartridge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(EVALUATE_PERMISSION)

    def has_activate_cartridge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(ACTIVATE_PERMISSION)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Actions change state through services, not rows: offered to whoever may view versions AND holds the
        # action's own permission (super() drops the actions whose permissions the user lacks).
        actions = super().get_actions(request)
        return actions if self.has_view_permission(request) else {}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return VersionChangeList

    @admin.display(description="state")
    def state(self, obj: CartridgeVersion) -> str:
        # the list page derived it for the whole page (VersionChangeList); the change page reads one version
        return getattr(obj, "page_state", None) or selectors.version_state(version=obj)

    @admin.display(description="configuration")
    def configuration_label(self, obj: CartridgeVersion) -> str:
        return obj.config.key

    @admin.display(description="manifest")
    def manifest_summary(self, obj: CartridgeVersion) -> str:
        entries = (obj.manifest or {}).get("entries", [])
        subjects = sorted({s for _, s in entries if s})
        left_out = (obj.manifest or {}).get("left_out", [])
        return f"{len(entries)} memories (seqs {[seq for seq, _ in entries]}), subjects {subjects}, left out (erased) {left_out}"

    @admin.action(description="Evaluate (run the gate) the selected versions", permissions=["evaluate_cartridge"])
    def evaluate(self, request: HttpRequest, queryset: QuerySet) -> None:
        for version in queryset.order_by("id"):
            text = outcome_text(jobs.cartridge_evaluate_enqueue(version=version, actor_id=request.user.pk))
            self.message_user(request, f"Version {version.pk}: {text}.",
                              messages.WARNING if "failed" in text else messages.SUCCESS)

    @admin.action(description="Activate the selected versions (through the gate)", permissions=["activate_cartridge"])
    def activate(self, request: HttpRequest, queryset: QuerySet) -> None:
        for version in queryset.select_related("scope").order_by("id"):
            try:
                services.cartridge_activate(version=version, actor=request.user)
            except GateFailed as exc:
                self.message_user(request, format_html("{}{}", exc.message, reasons_html(exc.reasons)), messages.ERROR)
            except MnesioError as exc:
                self.message_user(request, f"Version {version.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(
                    request, f"Version {version.pk} now serves scope '{version.scope.name}'.", messages.SUCCESS
                )
