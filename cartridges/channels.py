"""The Redis pub/sub channel of an AnswerRequest: how a gpu worker hands a model-free web process the deltas of
a streamed answer, and says "answered" without the web polling the database.

Only sealed bytes travel: each delta is sealed with the request's own key (services.answer, associated data
naming the request and the delta's position), so Redis never holds answer text. A message is JSON:
``{"seq": n, "sealed": base64}`` for a delta, ``{"done": true}`` once the answer (or its error) is sealed
into the row. Pub/sub keeps nothing: a web process subscribes before it sends the task, and when it is gone
a publish reaches nobody (``publish`` returns 0), which tells the worker to stop decoding.
"""
from __future__ import annotations

import base64
import json
from typing import Any

from django.conf import settings


def answer_channel(request_id: int) -> str:
    """The channel name of AnswerRequest ``request_id``. Pub/sub channels are shared by every db of a Redis server
    (SELECT does not scope them), so the name carries REDIS_URL's db: deployments on two dbs of one server, whose
    request ids repeat, never read each other's deltas."""
    return f"{answer_channel_prefix()}{int(request_id)}"


def answer_channel_prefix() -> str:
    """What every answer channel of this deployment's Redis db starts with."""
    from urllib.parse import urlsplit

    db = urlsplit(getattr(settings, "REDIS_URL", "") or "").path.strip("/") or "0"
    return f"mnesio:{db}:answer-request:"


def redis_client() -> Any | None:
    """A Redis client on REDIS_URL, or None in the embedded default (no Redis: answers are waited for in the DB)."""
    url = getattr(settings, "REDIS_URL", "")
    if not url:
        return None
    import redis

    return redis.Redis.from_url(url)


def delta_message(seq: int, sealed: bytes) -> str:
    """A delta's message: its position and its sealed bytes."""
    return json.dumps({"seq": seq, "sealed": base64.b64encode(sealed).decode()})


DONE_MESSAGE = json.dumps({"done": True})


def message_read(data: bytes | str) -> dict[str, Any]:
    """Parse a channel message: ``{"seq", "sealed": bytes}`` or ``{"done": True}`` (anything else: {})."""
    try:
        body = json.loads(data)
    except (TypeError, ValueError):
        return {}
    if not isinstance(body, dict):
        return {}
    if body.get("done") is True:
        return {"done": True}
    if isinstance(body.get("seq"), int) and isinstance(body.get("sealed"), str):
        return {"seq": body["seq"], "sealed": base64.b64decode(body["sealed"])}
    return {}
