"""The cartridge API: versions and their history, compile, evaluate, activate, rollback, ask, evaluation
cases, the KV configuration switch and the KV metrics.

Every scoped view resolves its scope with ``memories.selectors.scope_get_for_user`` first (grant, else
403/404), validates its body with a serializer that rejects unknown fields, calls one service or selector
with ``actor=request.user``, and returns. Errors are MnesioErrors rendered as ``{"message", "extra"}``.
"""
from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import permissions, renderers, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cartridges import asking, jobs, metrics, prometheus, selectors, services
from cartridges.api import serializers as s
from cartridges.api import sse
from cartridges.models import CartridgeVersion
from core.api import validated
from core.errors import MnesioError
from core.pagination import BoundedLimitOffsetPagination
from memories.models import Scope
from memories.selectors import scope_get_for_staff, scope_get_for_user, token_is_limited, user_scopes

ERROR = OpenApiResponse(description='`{"code": ..., "message": ..., "extra": ...}` naming the field or reason')


class VersionPagination(BoundedLimitOffsetPagination):
    # A page is read in a fixed number of queries (selectors.versions_read); its bodies (history) are long.
    default_limit = 20
    max_limit = 100


def _version_to_act_on(request: Request, scope: str, pk: int) -> tuple[Scope, CartridgeVersion]:
    """The scope (grant or 403/404), after refusing any body field (400), and its version ``pk`` (or 404)."""
    scope_row = scope_get_for_user(user=request.user, name=scope)
    validated(s.EmptyRequestSerializer, request)
    return scope_row, selectors.version_get(scope=scope_row, pk=pk)


class CartridgeVersionListView(APIView):
    @extend_schema(
        summary="List a scope's cartridge versions, newest first, with state and history",
        operation_id="api_scopes_cartridges_list",  # the id it had while documented as a list: clients keep their name
        parameters=[OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses={200: s.VersionPageSerializer, 403: ERROR, 404: ERROR},
    )
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        paginator = VersionPagination()
        versions = selectors.versions_for_display(selectors.scope_versions(scope=scope_row))
        page = paginator.paginate_queryset(versions, request, view=self)
        active = selectors.active_version(scope=scope_row)
        body = {"count": paginator.count, "next": paginator.get_next_link(), "previous": paginator.get_previous_link(),
                "results": selectors.versions_read(page), "active_version": active.pk if active else None}
        return Response(s.VersionPageSerializer(body).data)


class CartridgeVersionDetailView(APIView):
    @extend_schema(
        summary="Read one cartridge version: key, manifest, state and history",
        responses={200: s.VersionDetailSerializer, 403: ERROR, 404: ERROR},
    )
    def get(self, request: Request, scope: str, pk: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(s.VersionDetailSerializer(selectors.version_read(scope=scope_row, pk=pk)).data)


class CartridgeCompileView(APIView):
    @extend_schema(
        summary="Request a compile of the scope at a log head (queued on the gpu queue)",
        request=s.CompileRequestSerializer,
        responses={202: s.CompileAcceptedSerializer, 400: ERROR, 403: ERROR, 404: ERROR, 422: ERROR},
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(s.CompileRequestSerializer, request)
        activate = data.get("activate", False)
        head, outcome = jobs.cartridge_compile_enqueue(
            scope=scope_row, log_head=data.get("log_head"), activate=activate, actor_id=request.user.pk
        )
        accepted = s.CompileAccepted.of(outcome.raise_for_refusal(), scope=scope_row, log_head=head, activate=activate)
        return Response(s.CompileAcceptedSerializer(accepted).data, status=status.HTTP_202_ACCEPTED)


class CartridgeEvaluateView(APIView):
    @extend_schema(
        summary="Request a gate evaluation of a version (queued on the gpu queue)",
        request=s.EmptyRequestSerializer,
        responses={202: s.EvaluateAcceptedSerializer, 400: ERROR, 403: ERROR, 404: ERROR},
    )
    def post(self, request: Request, scope: str, pk: int) -> Response:
        scope_row, version = _version_to_act_on(request, scope, pk)
        outcome = jobs.cartridge_evaluate_enqueue(version=version, actor_id=request.user.pk).raise_for_refusal()
        accepted = s.EvaluateAccepted.of(outcome, scope=scope_row, version=version)
        return Response(s.EvaluateAcceptedSerializer(accepted).data, status=status.HTTP_202_ACCEPTED)


class CartridgeActivateView(APIView):
    @extend_schema(
        summary="Activate a version through the gate (409 with every reason when it fails)",
        request=s.EmptyRequestSerializer,
        responses={200: s.ActivationSerializer, 403: ERROR, 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request, scope: str, pk: int) -> Response:
        _, version = _version_to_act_on(request, scope, pk)
        activation = services.cartridge_activate(version=version, actor=request.user)
        return Response(s.ActivationSerializer(activation).data)


class CartridgeRollbackView(APIView):
    @extend_schema(
        summary="Roll back: activate the previous still-existing version, through the gate again",
        request=s.EmptyRequestSerializer,
        responses={200: s.ActivationSerializer, 403: ERROR, 404: ERROR, 409: ERROR},
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        validated(s.EmptyRequestSerializer, request)
        activation = services.cartridge_rollback(scope=scope_row, actor=request.user)
        return Response(s.ActivationSerializer(activation).data)


class AskView(APIView):
    renderer_classes = [renderers.JSONRenderer, renderers.BrowsableAPIRenderer, sse.EventStreamRenderer]

    def get_renderers(self):
        # the schema declares the stream by hand (extend_schema below): left to drf-spectacular, the event-stream
        # renderer would add a `?format=` parameter and an event-stream body to every error status
        found = super().get_renderers()
        if getattr(self, "swagger_fake_view", False):
            return [r for r in found if not isinstance(r, sse.EventStreamRenderer)]
        return found

    @extend_schema(
        summary="Ask a scope a question (mode=cartridge by default; mode=text re-reads the memories); "
                "stream=true answers text/event-stream, async=true answers 202 with a Location to collect",
        request=s.AskSerializer,
        responses={
            (200, "application/json"): s.AnswerSerializer,
            (200, "text/event-stream"): OpenApiResponse(
                inline_serializer("AnswerStreamEvent", fields={
                    "event": serializers.CharField(help_text="`delta`, `done` or `error`"),
                    "data": serializers.CharField(help_text="one line of JSON: `{text}`, the answer, or the error"),
                }),
                description="with stream=true: `event: delta` `{text}` per token, then `event: done` (the JSON answer "
                "above) or `event: error` `{code, message, extra}`",
            ),
            202: s.AnswerAcceptedSerializer, 400: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 429: ERROR, 504: ERROR,
        },
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(s.AskSerializer, request)
        question = services.prompt_build(question=data["question"], system=data["system"],
                                history=[(turn["role"], turn["content"]) for turn in data["history"]])
        ask = {"scope": scope_row, "question": question, "mode": data["mode"], "actor": request.user}
        if data["stream"]:
            return sse.streaming_response(request, asking.answer_ask_stream(**ask))
        if data["async"]:
            filed = asking.answer_ask_async(**ask)
            return _pending(scope_row, filed.pk)
        return Response(s.AnswerSerializer(asking.answer_ask(**ask)).data)


def _pending(scope_row: Scope, pk: int) -> Response:
    """202 naming where to collect the answer of request ``pk`` (body and Location header)."""
    location = reverse("answer-request", kwargs={"scope": scope_row.name, "pk": pk})
    body = {"answer_request": pk, "location": location, "status": "pending"}
    return Response(s.AnswerAcceptedSerializer(body).data, status=status.HTTP_202_ACCEPTED,
                    headers={"Location": location, "Retry-After": "1"})


class AnswerRequestView(APIView):
    @extend_schema(
        summary="Collect the answer of an async ask once (202 while pending; 404 once collected, or for "
                "another user's or another scope's request)",
        responses={200: s.AnswerSerializer, 202: s.AnswerAcceptedSerializer, 403: ERROR, 404: ERROR},
    )
    def get(self, request: Request, scope: str, pk: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        result = asking.answer_request_collect_for(scope=scope_row, pk=pk, user=request.user)
        if result is None:
            return _pending(scope_row, pk)
        return Response(s.AnswerSerializer(result).data)


class EvaluationCaseListView(APIView):
    # the schema documents the paginated body ({count, next, previous, results}) the view answers (drf-spectacular reads it)
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(summary="List a scope's evaluation cases",
                   responses={200: s.EvaluationCaseSerializer(many=True), 403: ERROR, 404: ERROR})
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(selectors.scope_evaluation_cases(scope=scope_row), request, view=self)
        opened = [selectors.evaluation_case_open(case=case) for case in page]
        return paginator.get_paginated_response(s.EvaluationCaseSerializer(opened, many=True).data)

    @extend_schema(summary="Attach an evaluation case (a question and its accepted answers) for the gate",
                   request=s.EvaluationCaseSerializer,
                   responses={201: s.EvaluationCaseSerializer, 400: ERROR, 403: ERROR, 404: ERROR})
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(s.EvaluationCaseSerializer, request)
        case = services.evaluation_case_add(scope=scope_row, question=data["question"], answers=data["answers"],
                                            subjects=data.get("subjects"), actor=request.user)
        return Response(s.EvaluationCaseSerializer(selectors.evaluation_case_open(case=case)).data,
                        status=status.HTTP_201_CREATED)


class IsOperatorForWrites(permissions.BasePermission):
    """Anyone authenticated reads; only a staff user holding ``cartridges.switch_kvconfiguration`` switches."""

    permission = "cartridges.switch_kvconfiguration"
    message = (
        "switching the KV configuration needs an operator (staff) account with the permission "
        "`cartridges.switch_kvconfiguration`"
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(user.is_staff and user.has_perm(self.permission))


class KvConfigurationView(APIView):
    permission_classes = [IsOperatorForWrites]

    @extend_schema(summary="Read the active KV configuration",
                   responses={200: s.KvConfigurationSerializer})
    def get(self, request: Request) -> Response:
        return Response(metrics.configuration_summary())

    @extend_schema(
        summary="Switch the active KV configuration (operators only); old cartridges stop serving, "
                "recompiles are queued for every scope",
        request=s.KvConfigurationSwitchSerializer,
        responses={201: s.KvConfigurationSerializer, 400: ERROR, 403: ERROR},
    )
    def post(self, request: Request) -> Response:
        data = validated(s.KvConfigurationSwitchSerializer, request)
        jobs.kv_configuration_switch_enqueue(**data, actor=request.user)
        return Response(metrics.configuration_summary(), status=status.HTTP_201_CREATED)


class PrometheusRenderer(renderers.BaseRenderer):
    """Render the KV metrics and the answer-latency histograms (or an error) as Prometheus text."""

    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        response = (renderer_context or {}).get("response")
        if response is not None:
            response["Content-Type"] = prometheus.CONTENT_TYPE
        if response is not None and response.status_code >= 400:
            message = data.get("message", "error") if isinstance(data, dict) else str(data)
            return f"# error: {message}\n".encode()
        request = (renderer_context or {}).get("request")
        # the same line KvMetricsView draws: who sees every scope sees the process-wide histograms too
        return prometheus.render(data, histograms=bool(request is not None and sees_every_scope(request.user)))


METRICS_PERMISSION = "cartridges.view_kv_metrics"


def sees_every_scope(user: Any) -> bool:
    """Whether ``user``'s KV metrics cover every scope: staff holding ``cartridges.view_kv_metrics`` with a credential
    that reaches all their scopes (else their grants', a limited token's only its scopes)."""
    return bool(user and user.is_active and user.is_staff and user.has_perm(METRICS_PERMISSION)
                and not token_is_limited(user=user))


class KvMetricsView(APIView):
    renderer_classes = [renderers.JSONRenderer, renderers.BrowsableAPIRenderer, PrometheusRenderer]

    @extend_schema(
        summary="KV metrics: configuration, per-scope cartridges and lag, gate outcomes, latency, counts, "
                "erasures, this process's asks (?format=prometheus for Prometheus text). Staff with "
                "`cartridges.view_kv_metrics` see every scope (a token limited to some scopes: only those); everyone "
                "else (staff included) the scopes granted to them.",
        parameters=[OpenApiParameter("format", str, enum=["json", "prometheus"])],
        responses={200: s.KvMetricsSerializer},
    )
    def get(self, request: Request) -> Response:
        unknown = sorted(set(request.query_params) - {"format"})
        if unknown:
            raise MnesioError(f"unknown query parameter(s) {unknown}; the accepted one is ['format']",
                              extra={"fields": unknown})
        scopes = None if sees_every_scope(request.user) else list(user_scopes(user=request.user))
        return Response(metrics.kv_metrics(scopes=scopes))


class ScopeSettingsView(APIView):
    """A scope's cartridge settings: its clients read them; staff with `cartridges.change_scope_settings` change them."""

    @extend_schema(summary="Read a scope's cartridge settings (auto-refresh, retention)",
                   responses={200: s.ScopeSettingsSerializer, 404: ERROR})
    def get(self, request: Request, scope: str) -> Response:
        if request.user.is_staff and request.user.has_perm("cartridges.view_scopesettings"):
            scope_row = scope_get_for_staff(user=request.user, name=scope, permission="cartridges.view_scopesettings")
        else:
            scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(s.ScopeSettingsSerializer(selectors.scope_settings_get(scope=scope_row)).data)

    @extend_schema(
        summary="Change some of a scope's cartridge settings (staff with `cartridges.change_scope_settings`)",
        request=s.ScopeSettingsChangeSerializer,
        responses={200: s.ScopeSettingsSerializer, 400: ERROR, 403: ERROR, 404: ERROR},
    )
    def patch(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_staff(user=request.user, name=scope, permission="cartridges.change_scope_settings")
        services.scope_settings_update(scope=scope_row, actor=request.user, **validated(s.ScopeSettingsChangeSerializer, request))
        return Response(s.ScopeSettingsSerializer(selectors.scope_settings_get(scope=scope_row)).data)
