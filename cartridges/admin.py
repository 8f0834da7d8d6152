"""Admin for the cartridge lifecycle: read-only versions with their history, actions that go through the
services (compile, evaluate, activate through the gate, roll back), the runtime configuration switch, and
the KV metrics panel on the admin index (templates/admin/index.html, cartridges.templatetags.kv_admin).

Nothing here edits a lifecycle row: every action is a service call with ``actor=request.user``, and a
failed gate is shown as an error message listing every reason. Memory text never appears.
"""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from cartridges import conf, selectors, services
from cartridges.api.views import task_actor_kwargs
from cartridges.models import (
    AnswerRecord,
    CartridgeActivation,
    CartridgeDestruction,
    CartridgeEvaluation,
    CartridgeVersion,
    EvaluationCase,
    KvConfiguration,
)
from cartridges.services.config import backends_allowed
from cartridges.services.errors import GateFailed
from cartridges.tasks import cartridge_compile_task, cartridge_evaluate_task
from core.errors import MnesioError
from kvengine import DTYPES, QUANTS
from memories.models import Scope
from memories.selectors import scope_head


def _queue(task: Any, request: HttpRequest, *args: Any) -> str:
    """Queue ``task`` and describe the outcome when it already ran (eager mode), else that it is queued."""
    result = task.apply_async(args=list(args), kwargs=task_actor_kwargs(task, request))
    if not result.ready():
        return f"queued (task {result.id})"
    outcome = result.get(propagate=True)
    if not outcome.get("ok"):
        return f"refused: {outcome.get('error')}"
    if "version" in outcome:
        return f"compiled version {outcome['version']}"
    return f"evaluation {outcome.get('evaluation')}: {'passed' if outcome.get('passed') else 'failed'}"


# Operator permissions (Meta.permissions of CartridgeVersion and KvConfiguration): every action and write
# form needs its own, not only is_staff (a view-only operator sees the history and changes nothing).
COMPILE_PERMISSION = "cartridges.compile_cartridge"
EVALUATE_PERMISSION = "cartridges.evaluate_cartridge"
ACTIVATE_PERMISSION = "cartridges.activate_cartridge"  # activate and roll back
SWITCH_PERMISSION = "cartridges.switch_kvconfiguration"


def _reasons_html(reasons: list[str]) -> str:
    return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((r,) for r in reasons)))


# ---------------------------------------------------------------------------
# Read-only history inlines
# ---------------------------------------------------------------------------
class ReadOnlyInline(admin.TabularInline):
    """Shows rows, never adds, edits or deletes them (they are immutable)."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
        return _reasons_html(obj.reasons) if obj.reasons else "–"


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

    @admin.display(description="state")
    def state(self, obj: CartridgeVersion) -> str:
        return selectors.version_state(version=obj)


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
        outcome = _queue(cartridge_compile_task, request, scope.pk, head, False)
        level = messages.ERROR if outcome.startswith("refused") else messages.SUCCESS
        modeladmin.message_user(request, f"Scope '{scope.name}' at log head {head}: {outcome}.", level)


@admin.action(description="Roll back the scope(s) to the previous version (through the gate)",
              permissions=["activate_cartridge"])
def rollback_scopes(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
    for scope in _scopes_of(queryset):
        try:
            activation = services.cartridge_rollback(scope=scope, actor=request.user)
        except GateFailed as exc:
            modeladmin.message_user(
                request, format_html("Scope '{}': {}{}", scope.name, exc.message, _reasons_html(exc.reasons)),
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
@admin.register(CartridgeVersion)
class CartridgeVersionAdmin(admin.ModelAdmin):
    """Versions are read-only; their history is the inlines; actions go through the services."""

    list_display = ["id", "scope", "state", "log_head", "num_memories", "num_tokens", "size_bytes", "dtype", "quant",
                    "configuration_label", "created_by", "created_at"]
    list_filter = ["scope", "quant", "dtype", "config_backend", "config_model"]
    list_select_related = ["scope", "created_by"]
    search_fields = ["=id", "scope__name", "sha256"]
    ordering = ["-id"]
    inlines = [EvaluationInline, ActivationInline, DestructionInline]
    actions = ["evaluate", "activate", compile_scopes, rollback_scopes]
    fields = ["scope", "state", "configuration_label", "log_head", "num_memories", "num_tokens", "size_bytes",
              "sha256", "payload_sha256", "stored_sha256", "storage_name", "manifest_digest", "manifest_summary",
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

    @admin.display(description="state")
    def state(self, obj: CartridgeVersion) -> str:
        return selectors.version_state(version=obj)

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
            outcome = _queue(cartridge_evaluate_task, request, version.pk)
            self.message_user(request, f"Version {version.pk}: {outcome}.",
                              messages.WARNING if "failed" in outcome else messages.SUCCESS)

    @admin.action(description="Activate the selected versions (through the gate)", permissions=["activate_cartridge"])
    def activate(self, request: HttpRequest, queryset: QuerySet) -> None:
        for version in queryset.select_related("scope").order_by("id"):
            try:
                services.cartridge_activate(version=version, actor=request.user)
            except GateFailed as exc:
                self.message_user(request, format_html("{}{}", exc.message, _reasons_html(exc.reasons)), messages.ERROR)
            except MnesioError as exc:
                self.message_user(request, f"Version {version.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(
                    request, f"Version {version.pk} now serves scope '{version.scope.name}'.", messages.SUCCESS
                )


# ---------------------------------------------------------------------------
# Runtime configuration switch
# ---------------------------------------------------------------------------
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
        # The switch is the service's (validation, recompiles of every scope); the form only collects input.
        row = services.kv_configuration_switch(
            backend=obj.backend, model=obj.model, dtype=obj.dtype, quant=obj.quant, actor=request.user
        )
        obj.pk, obj.created_at, obj.created_by = row.pk, row.created_at, row.created_by
        obj._state.adding = False
        self.message_user(request, "Cartridges of the previous configuration stop serving; recompiles of every scope "
                                   "are queued (compile, gate, activate).", messages.INFO)


# ---------------------------------------------------------------------------
# Evaluation cases and answer records
# ---------------------------------------------------------------------------
class EvaluationCaseForm(forms.ModelForm):
    question = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}))
    answers = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), help_text="One accepted answer per line.")
    subject_ids = forms.CharField(
        label="Subjects", required=False, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="External ids of the people this case concerns, one per line (subjects whose memories quote an "
                  "answer are linked automatically). Erasing any of them erases the case.",
    )

    class Meta:
        model = EvaluationCase
        fields = ["scope"]

    def clean_question(self) -> str:
        # The service's own validation (MNESIO_MAX_QUESTION_CHARS, not blank), as a form error instead of a 500.
        try:
            return services.question_validate(self.cleaned_data["question"])
        except MnesioError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_answers(self) -> list[str]:
        answers = [line.strip() for line in self.cleaned_data["answers"].splitlines() if line.strip()]
        if not answers:
            raise forms.ValidationError("Give at least one accepted answer.")
        return answers

    def clean_subject_ids(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["subject_ids"].splitlines() if line.strip()]

    def clean(self) -> dict[str, Any]:
        """Refuse subjects that are not in the scope (or erased) here, with the service's own message."""
        data = super().clean()
        if data.get("scope") is not None and data.get("subject_ids"):
            try:
                services.evaluation_case_subjects_resolve(scope=data["scope"], subjects=data["subject_ids"])
            except MnesioError as exc:
                self.add_error("subject_ids", exc.message)
        return data


@admin.register(EvaluationCase)
class EvaluationCaseAdmin(admin.ModelAdmin):
    """Operators attach cases for the gate here (through the service); cases are not edited afterwards.

    The question and answers are sealed: the list opens them (one key unwrap per row); an erased case shows
    as erased with no text.
    """

    form = EvaluationCaseForm
    list_display = ["id", "scope", "question_text", "answers_text", "subject_list", "erased_at", "created_by", "created_at"]
    list_filter = ["scope"]
    list_select_related = ["scope", "created_by"]
    _shown = ["scope", "question_text", "answers_text", "subject_list", "erased_at", "created_by", "created_at"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["scope", "question", "answers", "subject_ids"] if obj is None else self._shown

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [] if obj is None else self._shown

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="question")
    def question_text(self, obj: EvaluationCase) -> str:
        return selectors.evaluation_case_open(case=obj).question or "(erased)"

    @admin.display(description="answers")
    def answers_text(self, obj: EvaluationCase) -> str:
        answers = selectors.evaluation_case_open(case=obj).answers
        return "(erased)" if answers is None else "; ".join(answers)

    @admin.display(description="subjects")
    def subject_list(self, obj: EvaluationCase) -> str:
        return ", ".join(obj.subjects.values_list("external_id", flat=True))

    def save_model(self, request: HttpRequest, obj: EvaluationCase, form: forms.Form, change: bool) -> None:
        case = services.evaluation_case_add(
            scope=obj.scope, question=form.cleaned_data["question"], answers=form.cleaned_data["answers"],
            subjects=form.cleaned_data["subject_ids"] or None, actor=request.user,
        )
        obj.pk, obj.created_at, obj.created_by = case.pk, case.created_at, case.created_by
        obj._state.adding = False

    def save_related(self, request: HttpRequest, form: forms.Form, formsets: Any, change: bool) -> None:
        """The service linked the subjects already; the form has no model relation of its own to save."""


@admin.register(AnswerRecord)
class AnswerRecordAdmin(admin.ModelAdmin):
    """That a question was answered (version, mode, timings); the question and answer are never stored."""

    list_display = ["id", "scope", "mode", "version", "ttft_s", "total_s", "num_context_tokens", "actor", "created_at"]
    list_filter = ["scope", "mode"]
    list_select_related = ["scope", "actor"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# ---------------------------------------------------------------------------
# The memories app's Scope admin gains the compile and rollback actions and the versions inline
# (memories never imports cartridges; cartridges extends its admin from here).
# ---------------------------------------------------------------------------
def _extend_scope_admin() -> None:
    scope_admin = admin.site._registry.get(Scope)
    if scope_admin is None:  # memories registers it; keep working without it
        return
    scope_admin.actions = [*(scope_admin.actions or []), compile_scopes, rollback_scopes]
    # the permission checks its actions name (instance attributes: called with the request only)
    scope_admin.has_compile_cartridge_permission = lambda request: request.user.has_perm(COMPILE_PERMISSION)
    scope_admin.has_activate_cartridge_permission = lambda request: request.user.has_perm(ACTIVATE_PERMISSION)
    base_get_inlines = scope_admin.get_inlines

    def get_inlines(request: HttpRequest, obj: Any = None) -> list:
        # A scope being added has no versions: leaving the inline off the add form keeps its POST
        # free of this formset's management fields.
        inlines = list(base_get_inlines(request, obj))
        return [*inlines, ScopeVersionInline] if obj is not None else inlines

    scope_admin.get_inlines = get_inlines


_extend_scope_admin()
