"""The memories API: every view resolves its scope with ``scope_get_for_user`` first (grant or 403/404); the staff
views (create a scope, grant, revoke) check their permission through ``core.permissions`` / ``scope_get_for_staff``."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from core.api import validated
from core.pagination import BoundedLimitOffsetPagination
from core.permissions import staff_permission_check
from memories.api.serializers import (
    BatchAppendResultSerializer,
    ErasureRequestFileSerializer,
    ErasureRequestSerializer,
    HeadSerializer,
    MemoryAppendSerializer,
    MemoryBatchAppendSerializer,
    MemoryForgetSerializer,
    MemoryListQuerySerializer,
    MemorySearchSerializer,
    OpenedMemorySerializer,
    ScopeCreateSerializer,
    ScopeGrantCreateSerializer,
    ScopeGrantSerializer,
    ScopeSerializer,
    SearchResultSerializer,
)
from memories.jobs import erasure_request_enqueue
from memories.selectors import (
    as_of_validate,
    erasure_request_get,
    memories_open,
    memories_search,
    memory_open,
    scope_erasure_requests,
    scope_get_for_staff,
    scope_get_for_user,
    scope_head,
    scope_memories_filtered,
    scope_memory_get,
    user_get,
    user_scopes,
)
from memories.services import (
    erasure_request_file,
    erasure_request_shred,
    memories_append_batch,
    memory_append,
    memory_forget_file,
    scope_create,
    scope_delete_file,
    scope_grant,
    scope_revoke,
)

ERROR = OpenApiResponse(description='`{"message": ..., "extra": ...}` naming the field or the missing permission')


class ScopeListView(APIView):
    @extend_schema(responses=ScopeSerializer(many=True), summary="List the scopes you are granted")
    def get(self, request: Request) -> Response:
        return Response(ScopeSerializer(user_scopes(user=request.user), many=True).data)

    @extend_schema(
        request=ScopeCreateSerializer,
        responses={201: ScopeSerializer, 400: ERROR, 403: ERROR, 409: ERROR},
        summary="Create a scope (staff with `memories.add_scope`; grant clients to it next)",
    )
    def post(self, request: Request) -> Response:
        staff_permission_check(user=request.user, permission="memories.add_scope")
        scope_row = scope_create(actor=request.user, **validated(ScopeCreateSerializer, request))
        return Response(ScopeSerializer(scope_row).data, status=status.HTTP_201_CREATED)


class ScopeGrantsView(APIView):
    @extend_schema(
        request=ScopeGrantCreateSerializer,
        responses={201: ScopeGrantSerializer, 200: ScopeGrantSerializer, 400: ERROR, 403: ERROR, 404: ERROR},
        summary="Grant a client (a user, the owner of its tokens) the use of a scope "
        "(staff with `memories.add_scopegrant`; 200 when it was granted already)",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_staff(user=request.user, name=scope, permission="memories.add_scopegrant")
        user = user_get(username=validated(ScopeGrantCreateSerializer, request)["user"])
        grant = scope_grant(scope=scope_row, user=user, actor=request.user)
        return Response(ScopeGrantSerializer(grant).data, status=status.HTTP_201_CREATED if grant.created else status.HTTP_200_OK)


class ScopeGrantDetailView(APIView):
    @extend_schema(
        request=None,
        responses={204: None, 403: ERROR, 404: ERROR},
        summary="Revoke a client's grant of a scope (staff with `memories.delete_scopegrant`)",
    )
    def delete(self, request: Request, scope: str, username: str) -> Response:
        scope_row = scope_get_for_staff(user=request.user, name=scope, permission="memories.delete_scopegrant")
        scope_revoke(scope=scope_row, user=user_get(username=username), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScopeDeleteView(APIView):
    @extend_schema(
        request=MemoryForgetSerializer,
        responses={202: ErasureRequestSerializer},
        summary="Delete a scope (staff permission `memories.delete_scope`): every key of its memories is shredded "
        "now, its cartridges are destroyed by the erasure it files; the scope then answers 404 to everyone",
    )
    def delete(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(MemoryForgetSerializer, request) if request.body else {}
        erasure_request = scope_delete_file(scope=scope_row, requested_by=request.user, **data)
        erasure_request_enqueue(erasure_request=erasure_request)
        return Response(ErasureRequestSerializer(erasure_request).data, status=status.HTTP_202_ACCEPTED)


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
        parameters=[MemoryListQuerySerializer],
        responses={200: OpenedMemorySerializer(many=True), 400: ERROR, 404: ERROR},
        summary="List a scope's memories in log order, optionally filtered by subject, creation time and metadata "
        "(erased ones have erased=true and no text)",
    )
    def get(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        query = MemoryListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters = {name: query.validated_data[name] for name in ("subject", "since", "until", "metadata")
                   if name in query.validated_data}
        raw = request.query_params.get("as_of")
        as_of = as_of_validate(raw, scope=scope_row) if raw is not None else scope_head(scope=scope_row)
        paginator = BoundedLimitOffsetPagination()
        rows = scope_memories_filtered(scope=scope_row, as_of=as_of, **filters)
        page = paginator.paginate_queryset(rows, request, view=self)
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


class ScopeMemoriesBatchView(APIView):
    @extend_schema(
        request=MemoryBatchAppendSerializer,
        responses={201: BatchAppendResultSerializer, 200: BatchAppendResultSerializer},
        summary="Append up to 1,000 memories in one transaction, all or nothing: any bad item refuses the batch "
        "(400/409 naming each bad item as `items[i].field` in `extra.errors`); 201 when any was created",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        items = validated(MemoryBatchAppendSerializer, request)["items"]
        outcomes = memories_append_batch(scope=scope_row, items=items, actor=request.user)
        opened = memories_open([o.memory for o in outcomes])
        results = [
            {"index": i, "status": "created" if o.created else "existing", "memory": m}
            for i, (o, m) in enumerate(zip(outcomes, opened, strict=True))
        ]
        num_created = sum(o.created for o in outcomes)
        body = BatchAppendResultSerializer(
            {"num_created": num_created, "num_existing": len(outcomes) - num_created, "items": results}
        ).data
        return Response(body, status=status.HTTP_201_CREATED if num_created else status.HTTP_200_OK)


class MemoryDetailView(APIView):
    @extend_schema(responses=OpenedMemorySerializer, summary="Read one memory of a scope")
    def get(self, request: Request, scope: str, seq: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(OpenedMemorySerializer(memory_open(memory=scope_memory_get(scope=scope_row, seq=seq))).data)

    @extend_schema(
        request=MemoryForgetSerializer,
        responses={202: ErasureRequestSerializer},
        summary="Forget one memory: its own key is shredded now (reads show it erased), and the cartridges holding "
        "it are rebuilt without it by the erasure request this files (repeating returns the same request)",
    )
    def delete(self, request: Request, scope: str, seq: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(MemoryForgetSerializer, request) if request.body else {}
        erasure_request = memory_forget_file(scope=scope_row, seq=seq, requested_by=request.user, **data)
        # the shred is done (reads show it erased): the 202 never waits for the rebuild, with a broker or without
        erasure_request_enqueue(erasure_request=erasure_request, background=True)
        return Response(ErasureRequestSerializer(erasure_request).data, status=status.HTTP_202_ACCEPTED)


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
        summary="File an erasure request for a subject with memories in this scope: its key is shredded now (its "
        "memories read as erased, search and answers no longer find them); the cartridges holding it are rebuilt "
        "asynchronously",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        data = validated(ErasureRequestFileSerializer, request)
        erasure_request = erasure_request_file(scope=scope_row, requested_by=request.user, **data)
        # in the request, as forgetting a memory and deleting a scope do: the shred never waits behind answers
        # and compiles on the gpu queue; the task then only rebuilds
        erasure_request_shred(erasure_request=erasure_request, actor=request.user)
        erasure_request_enqueue(erasure_request=erasure_request)
        return Response(ErasureRequestSerializer(erasure_request).data, status=status.HTTP_201_CREATED)


class ErasureRequestDetailView(APIView):
    @extend_schema(responses=ErasureRequestSerializer, summary="Read an erasure request and its status")
    def get(self, request: Request, scope: str, pk: int) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        return Response(ErasureRequestSerializer(erasure_request_get(scope=scope_row, pk=pk)).data)


class MemorySearchView(APIView):
    @extend_schema(
        request=MemorySearchSerializer,
        responses={200: SearchResultSerializer, 400: ERROR, 404: ERROR},
        summary="Search a scope's memories by BM25 (or BM25 fused with dense similarity: MNESIO_SEARCH_RETRIEVER=hybrid), "
        "best match first (erased and forgotten memories never appear)",
    )
    def post(self, request: Request, scope: str) -> Response:
        scope_row = scope_get_for_user(user=request.user, name=scope)
        result = memories_search(scope=scope_row, **validated(MemorySearchSerializer, request))
        body = {"scope": scope_row.name, "as_of": result.as_of, "retriever": result.retriever, "results": result.hits}
        return Response(SearchResultSerializer(body).data)
