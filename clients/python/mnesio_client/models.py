"""The API's answers as frozen dataclasses, built from JSON with ``from_dict`` (fields the client does not know yet
are ignored, so a newer server's additions break nothing; times are parsed to aware ``datetime``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypedDict


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _time_or_none(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


class MemoryInput(TypedDict, total=False):
    """One memory to append (the body of a single append; ``content`` is required)."""

    content: str
    subject: str | None
    idempotency_key: str | None
    metadata: dict[str, Any] | None


class Turn(TypedDict):
    """An earlier turn of a conversation (oldest first, the first a user's)."""

    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class Scope:
    name: str
    description: str
    created_at: datetime

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scope:
        return cls(name=data["name"], description=data.get("description", ""), created_at=_time(data["created_at"]))


@dataclass(frozen=True)
class Memory:
    """One memory of a scope's log; ``content`` is None (and ``metadata`` empty) once it is erased."""

    seq: int
    subject: str | None
    content: str | None
    erased: bool
    created_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        return cls(seq=data["seq"], subject=data.get("subject"), content=data.get("content", data.get("text")),
                   erased=data.get("erased", False), created_at=_time(data["created_at"]),
                   metadata=data.get("metadata") or {})


@dataclass(frozen=True)
class MemoryPage:
    """One page of a scope's memories as of the head ``as_of`` (``next`` pins it, so paging stays consistent)."""

    count: int
    as_of: int
    results: list[Memory]
    next: str | None = None
    previous: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryPage:
        return cls(count=data["count"], as_of=data["as_of"], results=[Memory.from_dict(m) for m in data["results"]],
                   next=data.get("next"), previous=data.get("previous"))


@dataclass(frozen=True)
class BatchItem:
    index: int
    status: Literal["created", "existing"]  # existing: its idempotency key was seen before
    memory: Memory

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchItem:
        return cls(index=data["index"], status=data["status"], memory=Memory.from_dict(data["memory"]))


@dataclass(frozen=True)
class BatchResult:
    num_created: int
    num_existing: int
    items: list[BatchItem]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchResult:
        return cls(num_created=data["num_created"], num_existing=data["num_existing"],
                   items=[BatchItem.from_dict(i) for i in data["items"]])


@dataclass(frozen=True)
class SearchHit:
    seq: int
    subject: str | None
    content: str
    created_at: datetime
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchHit:
        return cls(seq=data["seq"], subject=data.get("subject"), content=data["content"],
                   created_at=_time(data["created_at"]), score=data["score"], metadata=data.get("metadata") or {})


@dataclass(frozen=True)
class SearchResult:
    """The hits, best first, of a search of the log as of the head ``as_of`` (pass it back to repeat it)."""

    scope: str
    as_of: int
    results: list[SearchHit]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchResult:
        return cls(scope=data["scope"], as_of=data["as_of"], results=[SearchHit.from_dict(h) for h in data["results"]])


@dataclass(frozen=True)
class ErasureEvent:
    status: str
    detail: str
    created_at: datetime

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErasureEvent:
        return cls(status=data["status"], detail=data.get("detail", ""), created_at=_time(data["created_at"]))


@dataclass(frozen=True)
class ErasureRequest:
    """What forgetting files: the key is shredded already; ``status`` moves on to ``views_rebuilt`` (or ``failed``)."""

    id: int
    kind: str  # subject, memory or scope
    status: str
    created_at: datetime
    subject: str | None = None
    seq: int | None = None
    reason: str = ""
    requested_by: str | None = None
    events: list[ErasureEvent] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErasureRequest:
        return cls(id=data["id"], kind=data["kind"], status=data["status"], created_at=_time(data["created_at"]),
                   subject=data.get("subject"), seq=data.get("seq"), reason=data.get("reason", ""),
                   requested_by=data.get("requested_by"),
                   events=[ErasureEvent.from_dict(e) for e in data.get("events", [])])


@dataclass(frozen=True)
class Answer:
    """An answer, the cartridge version it came from (None when re-read as text), its timings and token counts."""

    answer: str
    mode: str
    version_id: int | None
    ttft_s: float
    total_s: float
    num_context_tokens: int = 0
    num_prompt_tokens: int = 0
    note: str = ""
    layout: str | None = None
    memory_seqs: list[int] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole body, fields of newer servers too

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        return cls(answer=data["answer"], mode=data["mode"], version_id=data.get("version_id"),
                   ttft_s=data.get("ttft_s", 0.0), total_s=data.get("total_s", 0.0),
                   num_context_tokens=data.get("num_context_tokens", 0),
                   num_prompt_tokens=data.get("num_prompt_tokens", 0), note=data.get("note", ""),
                   layout=data.get("layout"), memory_seqs=data.get("memory_seqs"), raw=dict(data))


@dataclass(frozen=True)
class Token:
    """One of your API tokens (never its secret); ``scopes`` None: it reaches every scope you are granted."""

    id: str
    name: str
    scopes: list[str] | None
    created_at: datetime
    expires_at: datetime | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Token:
        return cls(id=data["id"], name=data.get("name", ""), scopes=data.get("scopes"),
                   created_at=_time(data["created_at"]), expires_at=_time_or_none(data.get("expires_at")))


@dataclass(frozen=True)
class NewToken(Token):
    """A token just created: ``token`` is its secret, shown only this once."""

    token: str = field(default="", repr=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NewToken:
        base = Token.from_dict(data)
        return cls(id=base.id, name=base.name, scopes=base.scopes, created_at=base.created_at,
                   expires_at=base.expires_at, token=data["token"])
