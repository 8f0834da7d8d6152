"""Input and output shapes of the memories API (validation of shape only; rules live in services)."""
from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.serializers import StrictSerializer, TextField
from memories.selectors import MAX_SEARCH_METADATA_KEYS, MAX_SEARCH_QUERY_CHARS, MAX_SEARCH_TOP_K, TOKEN_ID_CHARS
from memories.services import MAX_BATCH_ITEMS, MAX_IDEMPOTENCY_KEY_CHARS, MAX_REASON_CHARS, MAX_SUBJECT_CHARS

METADATA_HELP = (
    "Optional small JSON object (at most MNESIO_MAX_METADATA_BYTES of canonical JSON, default 4 KiB, nested at "
    "most 4 levels), sealed with the memory under its own key; returned on reads, never stored in plaintext."
)

# A seq is a PostgreSQL bigint.
MAX_SEQ = 2**63 - 1


class MemoryAppendSerializer(StrictSerializer):
    # No trimming: the content is stored exactly as sent (the service rejects whitespace-only content).
    content = serializers.CharField(trim_whitespace=False)
    subject = serializers.CharField(required=False, allow_null=True, max_length=MAX_SUBJECT_CHARS, trim_whitespace=False)
    idempotency_key = serializers.CharField(
        required=False, allow_null=True, max_length=MAX_IDEMPOTENCY_KEY_CHARS, trim_whitespace=False
    )
    # shape only (an object); its limits are the service's (memories.services.metadata_validate)
    metadata = serializers.DictField(required=False, allow_null=True, help_text=METADATA_HELP)


class MemoryBatchAppendSerializer(StrictSerializer):
    # Items are checked by the service, which names each bad one by path (`items[3].content`) and writes nothing.
    items = serializers.ListField(
        child=serializers.DictField(), min_length=1, max_length=MAX_BATCH_ITEMS,
        help_text=f"1 to {MAX_BATCH_ITEMS} memories, each shaped like a single append's body "
        "(`content`, optional `subject`, `idempotency_key`, `metadata`).",
    )


class MemoryForgetSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, max_length=MAX_REASON_CHARS)


class OpenedMemorySerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    subject = serializers.CharField(allow_null=True)
    content = serializers.CharField(source="text", allow_null=True,
                                    help_text="The plaintext (the field appends take); null when the memory is erased.")
    text = serializers.CharField(allow_null=True, help_text="Deprecated alias of `content` (same value), kept for "
                                 "one release: read `content`.")
    erased = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    metadata = serializers.DictField(help_text="The memory's metadata ({} when none, or when erased).")


class BatchItemResultSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    # a CharField, not a ChoiceField: drf-spectacular would name its enum after `status` and collide with others
    status = serializers.CharField(
        help_text="`created`: a new row; `existing`: the idempotency key was seen (earlier, or earlier in this batch).",
    )
    memory = OpenedMemorySerializer()


class BatchAppendResultSerializer(serializers.Serializer):
    num_created = serializers.IntegerField()
    num_existing = serializers.IntegerField()
    items = BatchItemResultSerializer(many=True)


class ScopeSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()


class HeadSerializer(serializers.Serializer):
    scope = serializers.CharField()
    head = serializers.IntegerField(
        help_text="The scope's head (its newest seq; never the global head): pass it as `as_of` to read a stable view."
    )
    scope_head = serializers.IntegerField(help_text="The newest seq in this scope (0 when it has none).")


class ErasureRequestFileSerializer(StrictSerializer):
    subject = serializers.CharField(max_length=MAX_SUBJECT_CHARS, trim_whitespace=False)
    reason = serializers.CharField(max_length=MAX_REASON_CHARS)


class ErasureEventSerializer(serializers.Serializer):
    status = serializers.CharField()
    detail = serializers.CharField()
    created_at = serializers.DateTimeField()


class ErasureRequestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.CharField(help_text="`subject`, `memory` (one forgotten memory) or `scope` (a deleted scope).")
    subject = serializers.CharField(source="subject.external_id", default=None, allow_null=True)
    seq = serializers.IntegerField(source="memory_id", allow_null=True, help_text="The forgotten memory's seq.")
    reason = serializers.CharField()
    requested_by = serializers.CharField(source="requested_by.get_username", default=None)
    created_at = serializers.DateTimeField()
    status = serializers.SerializerMethodField()
    events = ErasureEventSerializer(many=True, source="events.all")

    def get_status(self, obj) -> str:
        events = list(obj.events.all())
        return events[-1].status if events else "requested"


@extend_schema_field(OpenApiTypes.INT)
class IntegerParam(serializers.Field):
    """A query parameter passed on as received (its reader parses it and names it in its error)."""

    def to_internal_value(self, data):
        return data

    def to_representation(self, value):
        return value


class JsonParamField(serializers.JSONField):
    """A query parameter holding JSON text; nesting too deep to parse is invalid JSON, not a RecursionError (a 500)."""

    def __init__(self, **kwargs):
        super().__init__(binary=True, **kwargs)

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except RecursionError:
            self.fail("invalid")


class MemoryListQuerySerializer(StrictSerializer):
    """The memories list's query parameters: the head, the page, and the filters (each optional, all combined)."""

    # read as sent: the view's as_of_validate and the paginator parse these, naming them in their errors
    as_of = IntegerParam(required=False, help_text="Read as of this log head (default: the current head).")
    limit = IntegerParam(required=False, help_text="Memories per page (at most 1000).")
    offset = IntegerParam(required=False, help_text="Memories to skip.")
    subject = serializers.CharField(
        required=False, max_length=MAX_SUBJECT_CHARS, trim_whitespace=False,
        help_text="Only memories about this subject (external id).",
    )
    since = serializers.DateTimeField(required=False, help_text="Only memories created at or after this time (ISO 8601).")
    until = serializers.DateTimeField(required=False, help_text="Only memories created before this time (ISO 8601).")
    metadata = JsonParamField(
        required=False,
        help_text=f"A JSON object: only memories whose metadata has each of its top-level keys with exactly that JSON "
        f'value (at most {MAX_SEARCH_METADATA_KEYS} keys), e.g. `{{"topic": "travel"}}`. Metadata is sealed: this '
        "filter opens the memories the other filters keep.",
    )

    def to_internal_value(self, data):
        # DRF reads `format` itself (?format=api: the browsable page): neither a filter nor documented here
        return super().to_internal_value({key: data[key] for key in data if key != "format"})

    def validate_metadata(self, value: object) -> dict:
        if not isinstance(value, dict):
            raise serializers.ValidationError(f"has to be a JSON object but got {type(value).__name__}")
        if len(value) > MAX_SEARCH_METADATA_KEYS:
            raise serializers.ValidationError(f"has to have at most {MAX_SEARCH_METADATA_KEYS} keys but got {len(value)}")
        return value


class MemorySearchSerializer(StrictSerializer):
    query = TextField(max_length=MAX_SEARCH_QUERY_CHARS, help_text="Words to look for (BM25 over the memories' text).")
    top_k = serializers.IntegerField(
        min_value=1, max_value=MAX_SEARCH_TOP_K, default=10, help_text="How many memories to return at most."
    )
    subject = TextField(
        required=False, allow_null=True, max_length=MAX_SUBJECT_CHARS, trim_whitespace=False,
        help_text="Only memories about this subject (external id).",
    )
    since = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Only memories created at or after this time (ISO 8601)."
    )
    until = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Only memories created before this time (ISO 8601)."
    )
    as_of = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_SEQ,
        help_text="Search the log as of this head (a seq; default: the scope's current head).",
    )
    metadata = serializers.DictField(
        child=serializers.JSONField(), required=False, allow_null=True,
        help_text=f"Only memories whose metadata has each of these top-level keys with exactly this JSON value "
        f"(at most {MAX_SEARCH_METADATA_KEYS} keys).",
    )

    def validate_metadata(self, value: dict | None) -> dict | None:
        if value is not None and len(value) > MAX_SEARCH_METADATA_KEYS:
            raise serializers.ValidationError(f"has to have at most {MAX_SEARCH_METADATA_KEYS} keys but got {len(value)}")
        return value


class SearchHitSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    subject = serializers.CharField(allow_null=True)
    content = serializers.CharField()
    created_at = serializers.DateTimeField()
    metadata = serializers.DictField(child=serializers.JSONField())
    score = serializers.FloatField(help_text="The BM25 score (higher is a better match; only matches, > 0), or under "
                                   "the `hybrid` retriever the fused reciprocal-rank score.")


class SearchResultSerializer(serializers.Serializer):
    scope = serializers.CharField()
    as_of = serializers.IntegerField(help_text="The head searched: pass it back as `as_of` to repeat the search.")
    retriever = serializers.CharField(help_text="What ranked the results: `bm25`, or `hybrid` (BM25 fused with "
                                      "all-MiniLM-L6-v2 similarity; MNESIO_SEARCH_RETRIEVER).")
    results = SearchHitSerializer(many=True, help_text="Best match first.")


class ScopeCreateSerializer(StrictSerializer):
    name = TextField(max_length=100, help_text="A slug: letters, digits, '-' and '_'.")
    description = TextField(required=False, default="", allow_blank=True, max_length=500)


class ScopeGrantCreateSerializer(StrictSerializer):
    user = TextField(max_length=150, help_text="The username of the client (the owner of its API tokens) to grant.")


class ScopeGrantSerializer(serializers.Serializer):
    scope = serializers.CharField(source="scope.name")
    user = serializers.CharField(source="user.get_username")
    created_at = serializers.DateTimeField()


# Scopes named in one token or invitation at most (a form body of more would pass Django's field limit too).
MAX_TOKEN_SCOPES = 100


class TokenCreateSerializer(StrictSerializer):
    name = TextField(required=False, default="", allow_blank=True, max_length=100,
                     help_text="A label for you (where the token is used).")
    scopes = serializers.ListField(
        child=TextField(max_length=100), required=False, allow_null=True, max_length=MAX_TOKEN_SCOPES,
        help_text="Limit the token to these of your scopes (absent or null: every scope you are granted, now and "
        "later). A limited token reaches only them and cannot manage tokens.",
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text="When it stops working (ISO 8601; default MNESIO_TOKEN_DEFAULT_TTL_DAYS from now, at most "
        "MNESIO_TOKEN_MAX_TTL_DAYS).",
    )


class TokenSerializer(serializers.Serializer):
    id = serializers.SerializerMethodField(help_text="The token's id (revoke it with DELETE /api/v1/tokens/<id>/).")
    name = serializers.SerializerMethodField()
    scopes = serializers.SerializerMethodField(help_text="The scopes it is limited to; null when it is not limited.")
    created_at = serializers.DateTimeField(source="created")
    expires_at = serializers.DateTimeField(source="expiry", allow_null=True)

    def get_id(self, obj) -> str:
        return obj.digest[:TOKEN_ID_CHARS]

    def _profile(self, obj):
        return getattr(obj, "mnesio_profile", None)  # a token made outside the API has none

    def get_name(self, obj) -> str:
        profile = self._profile(obj)
        return profile.name if profile is not None else ""

    def get_scopes(self, obj) -> list[str] | None:
        profile = self._profile(obj)
        if profile is None or not profile.restricted:
            return None
        return sorted(scope.name for scope in profile.scopes.all())


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(help_text="The secret: send it as `Authorization: Bearer <token>`. Shown only now.")


class UserInviteSerializer(StrictSerializer):
    username = TextField(max_length=150)
    email = serializers.EmailField(required=False, default="", allow_blank=True)
    scopes = serializers.ListField(child=TextField(max_length=100), required=False, default=list, max_length=MAX_TOKEN_SCOPES,
                                   help_text="Scopes to grant the new user (needs `memories.add_scopegrant`).")
    expires_at = serializers.DateTimeField(required=False, allow_null=True,
                                           help_text="When the first token stops working (default as for tokens).")


class InvitedUserSerializer(serializers.Serializer):
    username = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    token = NewTokenSerializer()
