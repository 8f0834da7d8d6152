"""The memories API: every view resolves its scope with ``scope_get_for_user`` first (grant or 403/404)."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from core.api import validated
from core.pagination import BoundedLimitOffsetPagination
from memories.api.serializers import (
    ErasureRequestFileSerializer,
    ErasureRequestSerializer,
    HeadSerializer,
    MemoryAppendSerializer,
    OpenedMemorySerializer,
    ScopeSerializer,
)
from memories.jobs import erasure_request_enqueue
from memories.selectors import (
    as_of_validate,
    erasure_request_get,
    memories_open,
    memory_open,
    scope_erasure_requests,
    scope_get_for_user,
    scope_head,
    scope_memories,
    scope_memory_get,
    user_scopes,
)
from memories.services import erasure_request_file, memory_append


class ScopeListView(APIView):
    @extend_schema(responses=ScopeSerializer(many=True), summary="List the scopes you are granted")
    def get(self, request: Request) -> Response:
        return Response(ScopeSerializer(user_scopes(user=request.user), many=True).data)


class ScopeHeadView(APIView):
    @extend_schema(responses=HeadSerializer, summary="Read the log head")
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        # `head` is the scope's head too: the global head would tell a client how busy other scopes are
        head = scope_head(scope=scope_row)
        return Response({"scope": scope_row.name, "head": head, "scope_head": head})


class ScopeMemoriesView(APIView):
    # the schema documents the paginated body ({count, next, previous, results}) the view answers (drf-spectacular reads it)
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(
        parameters=[
            OpenApiParameter("as_of", int, description="Read as of this log head (default: the current head)."),
            OpenApiParameter("limit", int),
            OpenApiParameter("offset", int),
        ],
        responses=OpenedMemorySerializer(many=True),
        summary="List a scope's memories (erased ones have erased=true and no text)",
    )
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        raw = request.query_params.get("as_of")
        as_of = as_of_validate(raw, scope=scope_row) if raw is not None else scope_head(scope=scope_row)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(scope_memories(scope=scope_row, as_of=as_of), request, view=self)
        response = paginator.get_paginated_response(OpenedMemorySerializer(memories_open(page), many=True).data)
        # Pin the head in the page links so paging through a growing log stays one consistent view.
        for link in ("next", "previous"):
            if response.data.get(link):
                response.data[link] = replace_query_param(response.data[link], "as_of", as_of)
        response.data["as_of"] = as_of
        return response

    @extend_schema(
        request=MemoryAppendSerializer,
        responses={201: OpenedMemorySerializer, 200: OpenedMemorySerializer},
        summary="Append a memory (200 with the original row when the idempotency key was seen)",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        memory = memory_append(scope=scope_row, actor=request.user, **validated(MemoryAppendSerializer, request))
        body = OpenedMemorySerializer(memory_open(memory=memory)).data
        return Response(body, status=status.HTTP_201_CREATED if memory.appended else status.HTTP_200_OK)


class MemoryDetailView(APIView):
    @extend_schema(responses=OpenedMemorySerializer, summary="Read one memory of a scope")
    def get(self, request: Request, scope: str, seq: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(OpenedMemorySerializer(memory_open(memory=scope_memory_get(scope=scope_row, seq=seq))).data)


class ErasureRequestsView(APIView):
    # the schema documents the paginated body ({count, next, previous, results}) the view answers (drf-spectacular reads it)
    pagination_class = BoundedLimitOffsetPagination

    @extend_schema(responses=ErasureRequestSerializer(many=True), summary="List erasure requests filed through a scope")
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(scope_erasure_requests(scope=scope_row), request, view=self)
        return paginator.get_paginated_response(ErasureRequestSerializer(page, many=True).data)

    @extend_schema(
        request=ErasureRequestFileSerializer,
        responses={201: ErasureRequestSerializer},
        summary="File an erasure request for a subject with memories in this scope (processed asynchronously)",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(ErasureRequestFileSerializer, request)
        erasure_request = erasure_request_file(scope=scope_row, requested_by=request.user, **data)
        erasure_request_enqueue(erasure_request=erasure_request)
        return Response(ErasureRequestSerializer(erasure_request).data, status=status.HTTP_201_CREATED)


class ErasureRequestDetailView(APIView):
    @extend_schema(responses=ErasureRequestSerializer, summary="Read an erasure request and its status")
    def get(self, request: Request, scope: str, pk: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(ErasureRequestSerializer(erasure_request_get(scope=scope_row, pk=pk)).data)
