"""What each MCP tool does, for one authenticated user: plain sync functions over the apps' services and
selectors (the ones the API's views call), returning JSON-ready dicts and raising the API's errors."""
from __future__ import annotations

from typing import Any

from core.errors import MnesioError
from memories.jobs import erasure_request_enqueue
from memories.selectors import memories_open, memories_search, memory_open, scope_get_for_user, user_scopes
from memories.services import MAX_BATCH_ITEMS, memories_append_batch, memory_append, memory_forget_file

from .. import asking


def list_scopes(*, user) -> dict[str, Any]:
    """The scopes this credential reaches."""
    scopes = [{"name": s.name, "description": s.description} for s in user_scopes(user=user)]
    return {"scopes": scopes}


def _memory(opened) -> dict[str, Any]:
    return {"seq": opened.seq, "subject": opened.subject, "content": opened.text, "erased": opened.erased,
            "created_at": opened.created_at.isoformat(), "metadata": opened.metadata}


def remember(*, user, scope: str, content: str | None = None, subject: str | None = None,
             metadata: dict | None = None, idempotency_key: str | None = None,
             items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Append one memory (``content``) or many (``items``, all or nothing)."""
    if (content is None) == (items is None):
        raise MnesioError("give either `content` (one memory) or `items` (many), not both and not neither",
                          extra={"field": "content"})
    scope_row = scope_get_for_user(user=user, name=scope)
    if items is None:
        memory = memory_append(scope=scope_row, content=content, subject=subject, metadata=metadata,
                               idempotency_key=idempotency_key, actor=user)
        return {"scope": scope_row.name, "num_created": int(memory.appended), "memories": [_memory(memory_open(memory=memory))]}
    if not 1 <= len(items) <= MAX_BATCH_ITEMS:
        raise MnesioError(f"`items` has to hold 1 to {MAX_BATCH_ITEMS} memories but got {len(items)}",
                          extra={"field": "items"})
    outcomes = memories_append_batch(scope=scope_row, items=items, actor=user)
    memories = [_memory(m) for m in memories_open([o.memory for o in outcomes])]
    return {"scope": scope_row.name, "num_created": sum(o.created for o in outcomes), "memories": memories}


def recall(*, user, scope: str, query: str, top_k: int = 10, subject: str | None = None) -> dict[str, Any]:
    """Search the scope's memories, best match first."""
    scope_row = scope_get_for_user(user=user, name=scope)
    result = memories_search(scope=scope_row, query=query, top_k=top_k, subject=subject)
    hits = [{"seq": h.seq, "subject": h.subject, "content": h.content, "score": h.score,
             "created_at": h.created_at.isoformat(), "metadata": h.metadata} for h in result.hits]
    return {"scope": scope_row.name, "as_of": result.as_of, "results": hits}


def ask(*, user, scope: str, question: str, mode: str = "cartridge") -> dict[str, Any]:
    """Answer from the scope's cartridge (or, mode=text, by re-reading its memories), through the API's front door."""
    scope_row = scope_get_for_user(user=user, name=scope)
    result = asking.answer_ask(scope=scope_row, question=question, mode=mode, actor=user)
    return {"scope": scope_row.name, "answer": result.answer, "mode": result.mode, "version_id": result.version_id,
            "note": result.note, "total_s": round(result.total_s, 4)}


def forget(*, user, scope: str, seq: int, reason: str | None = None) -> dict[str, Any]:
    """Forget one memory: its key is shredded now; the cartridges holding it are rebuilt after."""
    scope_row = scope_get_for_user(user=user, name=scope)
    extra = {"reason": reason} if reason else {}
    erasure_request = memory_forget_file(scope=scope_row, seq=seq, requested_by=user, **extra)
    erasure_request_enqueue(erasure_request=erasure_request, background=True)  # the answer never waits for the rebuild
    return {"scope": scope_row.name, "seq": seq, "erasure_request": erasure_request.pk, "forgotten": True}
