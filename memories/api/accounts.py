"""Self-service accounts: a user lists, creates and revokes their own API tokens; an operator invites users.

Token management needs a credential that reaches all the caller's scopes (a session, or an unlimited token): a
token limited to some scopes gets a 403, so a leaked limited token can neither mint a wider one nor revoke the
user's others. Another user's token id answers the same 404 as an unknown one.
"""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import validated
from core.permissions import staff_permission_check
from memories.api.serializers import (
    InvitedUserSerializer,
    NewTokenSerializer,
    TokenCreateSerializer,
    TokenSerializer,
    UserInviteSerializer,
)
from memories.selectors import user_tokens
from memories.services import api_token_create, api_token_revoke, user_invite

ERROR = OpenApiResponse(description='`{"code": ..., "message": ..., "extra": ...}` naming the field')


def _new_token(token, key: str) -> dict[str, Any]:
    return {**TokenSerializer(token).data, "token": key}


class TokenListView(APIView):
    @extend_schema(responses={200: TokenSerializer(many=True), 403: ERROR}, summary="List your live API tokens")
    def get(self, request: Request) -> Response:
        return Response(TokenSerializer(user_tokens(user=request.user), many=True).data)

    @extend_schema(
        request=TokenCreateSerializer,
        responses={201: NewTokenSerializer, 400: ERROR, 403: ERROR, 404: ERROR},
        summary="Create an API token for yourself, optionally limited to some of your scopes; its secret is "
        "shown only in this answer",
    )
    def post(self, request: Request) -> Response:
        token, key = api_token_create(user=request.user, **validated(TokenCreateSerializer, request))
        return Response(_new_token(token, key), status=status.HTTP_201_CREATED)


class TokenDetailView(APIView):
    @extend_schema(request=None, responses={204: None, 403: ERROR, 404: ERROR},
                   summary="Revoke one of your API tokens (it stops working at once)")
    def delete(self, request: Request, token_id: str) -> Response:
        api_token_revoke(user=request.user, token_id=token_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UserInviteView(APIView):
    @extend_schema(
        request=UserInviteSerializer,
        responses={201: InvitedUserSerializer, 400: ERROR, 403: ERROR, 404: ERROR, 409: ERROR},
        summary="Invite a user (staff with `auth.add_user`, an unlimited token, and `memories.add_scopegrant` plus "
        "`memories.grant_scope_to_self` to invite into scopes): the account, its grants and a first token, whose "
        "secret is shown only in this answer",
    )
    def post(self, request: Request) -> Response:
        staff_permission_check(user=request.user, permission="auth.add_user")
        data = validated(UserInviteSerializer, request)
        if data["scopes"]:
            staff_permission_check(user=request.user, permission="memories.add_scopegrant")
        user, token, key = user_invite(actor=request.user, **data)
        body = {"username": user.get_username(), "scopes": data["scopes"], "token": _new_token(token, key)}
        return Response(body, status=status.HTTP_201_CREATED)  # InvitedUserSerializer's shape (the schema's)
