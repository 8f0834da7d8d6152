"""Admin: the log and key state read-only (metadata only, never plaintext), erasure requests with a
"process" action, scopes and grants editable."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpRequest
from rest_framework.authtoken.models import TokenProxy

from core.errors import MnesioError
from memories.jobs import erasure_request_enqueue
from memories.models import (
    ErasureEvent,
    ErasureRequest,
    Memory,
    MemoryKey,
    Scope,
    ScopeGrant,
    ScopeGrantEvent,
    Subject,
)
from memories.selectors import erasure_request_status, subject_get
from memories.services import (
    MAX_REASON_CHARS,
    erasure_request_file,
    erasure_request_shred,
    scope_delete_file,
    scope_grant,
    scope_revoke,
)
from memories.services.scopes import SELF_GRANT_PERMISSION

# Operator permissions (Meta.permissions of ErasureRequest): each action needs its own, not only is_staff.
PROCESS_PERMISSION = "memories.process_erasurerequest"
EVERYWHERE_PERMISSION = "memories.erase_subject_everywhere"
ADD_PERMISSION = "memories.add_erasurerequest"


# API tokens are knox's (stored hashed). DRF's plaintext token table stays installed only for the migration
# that converts it (0003_api_tokens_hashed); its admin would let staff create plaintext tokens again.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete: rows are shown, never edited (the log is append-only)."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Memory)
class MemoryAdmin(ReadOnlyAdmin):
    # Metadata only: the admin never decrypts, so plaintext never reaches an operator's screen or logs.
    list_display = ["seq", "scope", "subject", "erased", "sealed_bytes", "idempotency_key", "created_at"]
    list_filter = ["scope"]
    search_fields = ["=seq", "subject__external_id", "scope__name"]
    list_select_related = ["scope", "subject"]
    fields = ["seq", "scope", "subject", "erased", "sealed_bytes", "idempotency_key", "created_at"]
    readonly_fields = fields
    ordering = ["-seq"]

    @admin.display(boolean=True, description="erased")
    def erased(self, obj: Memory) -> bool:
        # its subject erased, or its own key shredded (forgotten, or its scope deleted)
        own_key_shredded = MemoryKey.objects.filter(memory_id=obj.seq, shredded_at__isnull=False).exists()
        return bool(obj.subject_id and obj.subject.shredded_at) or own_key_shredded

    @admin.display(description="sealed size (bytes)")
    def sealed_bytes(self, obj: Memory) -> int:
        return len(obj.ciphertext)


@admin.register(Subject)
class SubjectAdmin(ReadOnlyAdmin):
    # subjects are per scope (legacy rows have none): the same id in two scopes is two rows
    list_display = ["external_id", "scope", "shredded", "shredded_at", "wrapped_by", "created_at"]
    list_filter = [("shredded_at", admin.EmptyFieldListFilter), "scope"]
    list_select_related = ["scope"]
    search_fields = ["external_id", "scope__name"]
    fields = ["external_id", "scope", "shredded", "shredded_at", "wrapped_by", "created_at"]
    readonly_fields = fields

    @admin.display(boolean=True, description="shredded")
    def shredded(self, obj: Subject) -> bool:
        return obj.shredded_at is not None


class ErasureEventInline(admin.TabularInline):
    model = ErasureEvent
    fields = ["status", "detail", "actor", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class ErasureRequestForm(forms.ModelForm):
    """Collects subject, reason and scope; a request without a scope (every scope) needs its own permission."""

    user: Any = None  # set by ErasureRequestAdmin.get_form (the requesting operator)

    class Meta:
        model = ErasureRequest
        fields = ["subject", "reason", "scope"]
        help_texts = {"scope": "Leave empty to erase the subject in every scope (needs the permission "
                               "'Can file an erasure of a subject in every scope')."}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if "subject" in self.fields:
            # operators file subject erasures here; one memory's or a scope's come from the API or the scope action
            self.fields["subject"].required = True

    def clean_reason(self) -> str:
        # The service's limit, as a form error: a longer reason would otherwise reach the service and answer 500.
        reason = self.cleaned_data["reason"]
        if len(reason) > MAX_REASON_CHARS:
            raise forms.ValidationError(
                f"`reason` has to be at most {MAX_REASON_CHARS} characters but got {len(reason)}"
            )
        return reason

    def clean_scope(self) -> Scope | None:
        scope = self.cleaned_data.get("scope")
        if scope is None and not self.user.has_perm(EVERYWHERE_PERMISSION):
            raise forms.ValidationError(
                "`scope` is required: erasing a subject in every scope needs the permission "
                f"`{EVERYWHERE_PERMISSION}`; choose the scope to erase the subject in"
            )
        if scope is not None and not self.user.has_perm(ADD_PERMISSION):
            raise forms.ValidationError(
                f"`scope` has to be empty: you may only file erasures in every scope (`{EVERYWHERE_PERMISSION}`), "
                f"filing one for a scope needs `{ADD_PERMISSION}`"
            )
        return scope

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        subject, scope = cleaned.get("subject"), cleaned.get("scope")
        if subject is not None and scope is not None:
            try:  # the service's own check (the subject has memories in that scope), as a form error
                subject_get(external_id=subject.external_id, scope=scope)
            except MnesioError as exc:
                self.add_error("subject", exc.message)
        return cleaned


@admin.register(ErasureRequest)
class ErasureRequestAdmin(admin.ModelAdmin):
    """Operators file requests here (add form) and process them with the "process" action; nothing is edited."""

    form = ErasureRequestForm
    list_display = ["id", "kind", "subject", "memory", "status", "requested_by", "scope", "created_at"]
    list_select_related = ["subject", "requested_by", "scope"]
    search_fields = ["subject__external_id"]
    fields = ["subject", "reason", "scope"]
    autocomplete_fields = ["subject"]
    inlines = [ErasureEventInline]
    actions = ["process"]

    def get_inlines(self, request: HttpRequest, obj=None) -> list:
        return self.inlines if obj else []  # the add form has no events yet

    def get_readonly_fields(self, request: HttpRequest, obj=None) -> list[str]:
        return ["kind", "subject", "memory", "reason", "scope", "requested_by", "created_at"] if obj else []

    def get_fields(self, request: HttpRequest, obj=None) -> list[str]:
        if obj:
            return ["kind", "subject", "memory", "reason", "scope", "requested_by", "created_at"]
        return ["subject", "reason", "scope"]

    def get_form(self, request: HttpRequest, obj=None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change=change, **kwargs)  # a new class per call
        form.user = request.user
        return form

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Filing for one scope (add) or for every scope (its own permission); the form checks which.
        return request.user.has_perm(ADD_PERMISSION) or request.user.has_perm(EVERYWHERE_PERMISSION)

    def has_process_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PROCESS_PERMISSION)

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        # Viewing is allowed (the change page renders read-only); saving an existing request is not.
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.display(description="status")
    def status(self, obj: ErasureRequest) -> str:
        return erasure_request_status(erasure_request=obj)

    def save_model(self, request: HttpRequest, obj: ErasureRequest, form, change: bool) -> None:
        # Filing goes through the service (the `requested` event, validation); the form only collects input.
        created = erasure_request_file(
            subject=obj.subject.external_id, requested_by=request.user, reason=obj.reason, scope=obj.scope
        )
        obj.pk = created.pk
        obj.created_at = created.created_at

    def save_related(self, request: HttpRequest, form, formsets, change: bool) -> None:
        """Nothing related is saved from the form (events are written by the service)."""

    @admin.action(description="Process (shred keys now, rebuild views in the background)", permissions=["process"])
    def process(self, request: HttpRequest, queryset) -> None:
        with transaction.atomic():
            for erasure_request in queryset:
                # the shred in the request: it never waits behind answers and compiles on the gpu queue
                erasure_request_shred(erasure_request=erasure_request, actor=request.user)
                erasure_request_enqueue(erasure_request=erasure_request)
        self.message_user(request, f"Queued {queryset.count()} erasure request(s) for processing.", messages.SUCCESS)


class ScopeGrantForm(forms.ModelForm):
    """Refuses a grant to the signed-in user without the self-grant permission (as the API does)."""

    request: HttpRequest | None = None

    class Meta:
        model = ScopeGrant
        fields = ["scope", "user"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        actor = self.request.user if self.request is not None else None
        user = data.get("user")
        if actor is not None and user is not None and user.pk == actor.pk and not actor.has_perm(SELF_GRANT_PERMISSION):
            raise forms.ValidationError(f"Granting a scope to yourself needs the permission `{SELF_GRANT_PERMISSION}`.")
        return data


class ScopeGrantInline(admin.TabularInline):
    """The scope's grants: added and removed through the services (ScopeAdmin.save_formset), so the self-grant
    permission is checked and each act is a ScopeGrantEvent; an existing grant is not edited (remove and add)."""

    model = ScopeGrant
    form = ScopeGrantForm
    extra = 1
    autocomplete_fields = ["user"]

    def get_formset(self, request: HttpRequest, obj=None, **kwargs: Any):
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = type(formset.form.__name__, (formset.form,), {"request": request})
        return formset

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Scope)
class ScopeAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "created_at", "deleted_at"]
    list_filter = [("deleted_at", admin.EmptyFieldListFilter)]
    search_fields = ["name"]
    inlines = [ScopeGrantInline]
    actions = ["delete_scopes"]

    def save_formset(self, request: HttpRequest, form, formset, change: bool) -> None:
        if formset.model is not ScopeGrant:
            return super().save_formset(request, form, formset, change)
        added = formset.save(commit=False)  # nothing saved yet: the services write (and audit) each change
        for grant in formset.deleted_objects:
            scope_revoke(scope=form.instance, user=grant.user, actor=request.user)
        for grant in added:
            scope_grant(scope=form.instance, user=grant.user, actor=request.user)

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # a scope with memories is deleted by shredding its keys, not its row
        return actions

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        # a deleted scope's row is frozen in the database (memories.models.Scope's triggers): shown, never saved
        return super().has_change_permission(request, obj) and (obj is None or obj.deleted_at is None)

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        # an empty scope (a typo) may be removed as a row; one with memories only through the action
        return super().has_delete_permission(request, obj) and (
            obj is None or (obj.deleted_at is None and not obj.memories.exists())
        )

    def has_delete_scope_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("memories.delete_scope")

    @admin.action(description="Delete (shred every key of its memories, destroy its cartridges)",
                  permissions=["delete_scope"])
    def delete_scopes(self, request: HttpRequest, queryset) -> None:
        for scope in queryset:
            erasure_request = scope_delete_file(scope=scope, requested_by=request.user, reason="deleted in the admin")
            erasure_request_enqueue(erasure_request=erasure_request)
        self.message_user(request, f"Deleted {queryset.count()} scope(s); their cartridges are being destroyed.",
                          messages.SUCCESS)


@admin.register(ScopeGrant)
class ScopeGrantAdmin(admin.ModelAdmin):
    """Grants are made and revoked through the services: the self-grant permission is checked and each act is
    a ScopeGrantEvent. A grant is never edited (revoke it and grant again)."""

    list_display = ["scope", "user", "created_at"]
    list_select_related = ["scope", "user"]
    list_filter = ["scope"]
    autocomplete_fields = ["user", "scope"]
    form = ScopeGrantForm

    def get_form(self, request: HttpRequest, obj=None, change: bool = False, **kwargs: Any):
        form = super().get_form(request, obj, change=change, **kwargs)
        return type(form.__name__, (form,), {"request": request})

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return super().has_change_permission(request, obj) and obj is None

    def save_model(self, request: HttpRequest, obj: ScopeGrant, form, change: bool) -> None:
        grant = scope_grant(scope=obj.scope, user=obj.user, actor=request.user)
        obj.pk = grant.pk

    def delete_model(self, request: HttpRequest, obj: ScopeGrant) -> None:
        scope_revoke(scope=obj.scope, user=obj.user, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset) -> None:
        for grant in queryset.select_related("scope", "user"):
            scope_revoke(scope=grant.scope, user=grant.user, actor=request.user)


@admin.register(ScopeGrantEvent)
class ScopeGrantEventAdmin(ReadOnlyAdmin):
    """The audit trail of grants: who gave or took away whom a scope, and when."""

    list_display = ["created_at", "action", "scope_name", "username", "actor_username", "to_self"]
    list_filter = ["action"]
    search_fields = ["scope_name", "username", "actor_username"]

    @admin.display(boolean=True, description="to self")
    def to_self(self, obj: ScopeGrantEvent) -> bool:
        return obj.to_self
