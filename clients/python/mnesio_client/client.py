"""``MnesioClient``: mnesio's ``/api/v1/`` over httpx (sync), with ``Authorization: Bearer <token>``.

Every method is one request (``iter_memories`` pages through several); a non-2xx answer raises ``MnesioError``
with the API's stable ``code``. A streamed ask reads the server-sent events of ``/ask/`` with ``"stream": true``
(``event: delta`` ``{text}`` per token, then ``event: done`` with the answer, or ``event: error``).
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from .errors import MnesioError
from .models import (
    Answer,
    BatchResult,
    ErasureRequest,
    Memory,
    MemoryInput,
    MemoryPage,
    NewToken,
    Scope,
    SearchResult,
    Token,
    Turn,
)

# Long enough for an ask that waits on a gpu worker (the server's MNESIO_REMOTE_ANSWER_TIMEOUT_S is 120 s).
DEFAULT_TIMEOUT = httpx.Timeout(180.0, connect=10.0)
Mode = Literal["cartridge", "text"]


def _seg(value: str | int) -> str:
    return quote(str(value), safe="")


def _time_param(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _drop_none(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body without the fields left unset, so the server applies its own defaults."""
    return {k: v for k, v in body.items() if v is not None}


def _turns(history: Sequence[Turn | tuple[str, str]] | None) -> list[dict[str, str]] | None:
    if history is None:
        return None
    return [{"role": t[0], "content": t[1]} if isinstance(t, tuple) else dict(t) for t in history]


class MnesioClient:
    """A client of one mnesio server for one API token.

    ``base_url`` is the server's root (``http://127.0.0.1:8000``); the client adds ``/api/v1/``. Pass
    ``http_client`` (an ``httpx.Client``, closed by you; its own timeout then applies, not ``timeout``) or
    ``transport`` to control the connection, e.g. in tests.
    """

    def __init__(self, base_url: str, token: str, *, timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
                 http_client: httpx.Client | None = None, transport: httpx.BaseTransport | None = None):
        if http_client is not None and transport is not None:
            raise ValueError("pass `http_client` or `transport`, not both")
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        """Close the connection pool (not an ``http_client`` passed in)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> MnesioClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _url(self, *segments: str | int) -> str:
        return f"{self.base_url}/api/v1/" + "".join(f"{_seg(s)}/" for s in segments)

    def _request(self, method: str, *segments: str | int, json_body: Any = None,
                 params: Mapping[str, Any] | None = None) -> Any:
        """The JSON of a 2xx answer (None for 204); a ``MnesioError`` otherwise."""
        response = self._http.request(method, self._url(*segments), json=json_body, headers=self._headers,
                                      params=_drop_none(params) if params else None)
        if response.is_error:
            raise MnesioError.from_response(response)
        return response.json() if response.status_code != 204 and response.content else None

    # -- scopes and memories ----------------------------------------------------------------------------------

    def scopes(self) -> list[Scope]:
        """The scopes this token can reach."""
        return [Scope.from_dict(s) for s in self._request("GET", "scopes")]

    def append(self, scope: str, content: str, *, subject: str | None = None, idempotency_key: str | None = None,
               metadata: Mapping[str, Any] | None = None) -> Memory:
        """Append one memory; with an ``idempotency_key`` seen before, the original memory comes back instead."""
        body = _drop_none({"content": content, "subject": subject, "idempotency_key": idempotency_key,
                           "metadata": dict(metadata) if metadata is not None else None})
        return Memory.from_dict(self._request("POST", "scopes", scope, "memories", json_body=body))

    def append_batch(self, scope: str, items: Iterable[MemoryInput | Mapping[str, Any]]) -> BatchResult:
        """Append 1 to 1,000 memories in one transaction, all or nothing (a bad item names itself: ``items[3].content``)."""
        body = {"items": [_drop_none(item) for item in items]}
        return BatchResult.from_dict(self._request("POST", "scopes", scope, "memories", "batch", json_body=body))

    def list_memories(self, scope: str, *, as_of: int | None = None, limit: int | None = None,
                      offset: int | None = None) -> MemoryPage:
        """One page of the scope's memories, oldest first, as of the head ``as_of`` (default: the current one)."""
        params = {"as_of": as_of, "limit": limit, "offset": offset}
        return MemoryPage.from_dict(self._request("GET", "scopes", scope, "memories", params=params))

    def iter_memories(self, scope: str, *, as_of: int | None = None, page_size: int = 100) -> Iterator[Memory]:
        """Every memory as of one head (the first page's, unless given), page after page."""
        offset = 0
        while True:
            page = self.list_memories(scope, as_of=as_of, limit=page_size, offset=offset)
            as_of = page.as_of  # pinned: appends while paging do not shift the pages
            yield from page.results
            offset += len(page.results)
            if page.next is None or not page.results:
                return

    def get_memory(self, scope: str, seq: int) -> Memory:
        """One memory of the scope by its seq."""
        return Memory.from_dict(self._request("GET", "scopes", scope, "memories", seq))

    def forget(self, scope: str, seq: int, *, reason: str | None = None) -> ErasureRequest:
        """Forget one memory: its key is shredded before this returns; its cartridges are rebuilt after."""
        body = _drop_none({"reason": reason}) or None
        return ErasureRequest.from_dict(self._request("DELETE", "scopes", scope, "memories", seq, json_body=body))

    def search(self, scope: str, query: str, *, top_k: int | None = None, subject: str | None = None,
               since: datetime | str | None = None, until: datetime | str | None = None, as_of: int | None = None,
               metadata: Mapping[str, Any] | None = None) -> SearchResult:
        """The scope's memories that match ``query``, best first, filtered by subject, time, head and metadata."""
        body = _drop_none({"query": query, "top_k": top_k, "subject": subject, "since": _time_param(since),
                           "until": _time_param(until), "as_of": as_of,
                           "metadata": dict(metadata) if metadata is not None else None})
        return SearchResult.from_dict(self._request("POST", "scopes", scope, "search", json_body=body))

    # -- asking -----------------------------------------------------------------------------------------------

    def _ask_body(self, question: str, mode: Mode | None, system: str | None,
                  history: Sequence[Turn | tuple[str, str]] | None) -> dict[str, Any]:
        return _drop_none({"question": question, "mode": mode, "system": system, "history": _turns(history)})

    def ask(self, scope: str, question: str, *, mode: Mode | None = None, system: str | None = None,
            history: Sequence[Turn | tuple[str, str]] | None = None) -> Answer:
        """Ask the scope (its cartridge by default; ``mode="text"`` re-reads the memories), after ``history``."""
        body = self._ask_body(question, mode, system, history)
        return Answer.from_dict(self._request("POST", "scopes", scope, "ask", json_body=body))

    def ask_stream(self, scope: str, question: str, *, mode: Mode | None = None, system: str | None = None,
                   history: Sequence[Turn | tuple[str, str]] | None = None) -> AnswerStream:
        """Ask as ``ask`` does, the answer streamed: iterate the result for its text deltas, token by token.

        An error before the stream starts (a bad question, a scope not found) is raised here; one during it is
        raised by the iteration. The stream's ``answer`` is the whole ``Answer`` once it is read to the end.
        """
        body = {**self._ask_body(question, mode, system, history), "stream": True}
        request = self._http.build_request("POST", self._url("scopes", scope, "ask"), json=body,
                                           # DRF's negotiation answers a bare text/event-stream with a 406: the JSON it knows comes first
                                           headers={**self._headers, "Accept": "application/json, text/event-stream"})
        response = self._http.send(request, stream=True)
        if response.is_error:
            try:
                response.read()
            finally:
                response.close()
            raise MnesioError.from_response(response)
        return AnswerStream(response)

    # -- tokens -----------------------------------------------------------------------------------------------

    def create_token(self, *, name: str | None = None, scopes: Sequence[str] | None = None,
                     expires_at: datetime | str | None = None) -> NewToken:
        """A new token of yours, limited to ``scopes`` of yours if given; its secret (``.token``) is shown only now."""
        body = _drop_none({"name": name, "scopes": list(scopes) if scopes is not None else None,
                           "expires_at": _time_param(expires_at)})
        return NewToken.from_dict(self._request("POST", "tokens", json_body=body))

    def list_tokens(self) -> list[Token]:
        """Your live tokens (never their secrets)."""
        return [Token.from_dict(t) for t in self._request("GET", "tokens")]

    def revoke_token(self, token_id: str) -> None:
        """Revoke one of your tokens by its id; it stops working at once."""
        self._request("DELETE", "tokens", token_id)


class AnswerStream:
    """The text deltas of a streamed answer, as the server sends them; ``answer`` is set once the stream is done.

    Iterate it once (``for text in stream``), or call ``result()`` to read it to the end. Closing it (or leaving a
    ``with`` block) early drops the connection, and the server stops decoding.
    """

    def __init__(self, response: httpx.Response):
        self._response = response
        self.answer: Answer | None = None
        self.text = ""  # the deltas so far, joined

    def __iter__(self) -> Iterator[str]:
        try:
            for event, data in _sse_events(self._response):
                if event == "delta":
                    delta = json.loads(data)["text"]
                    self.text += delta
                    yield delta
                elif event == "done":
                    self.answer = Answer.from_dict(json.loads(data))
                elif event == "error":
                    body = json.loads(data)
                    status = (body.get("extra") or {}).get("status", 500) if isinstance(body, dict) else 500
                    raise MnesioError.from_body(body, status_code=status)
        finally:
            self.close()
        if self.answer is None:
            raise MnesioError(code="error", message="the stream ended before its answer", status_code=200)

    def result(self) -> Answer:
        """Read the rest of the stream and return the whole answer."""
        for _ in self:
            pass
        assert self.answer is not None  # __iter__ raises when the stream ends without one
        return self.answer

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> AnswerStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _sse_events(response: httpx.Response) -> Iterator[tuple[str | None, str]]:
    """(event, data) of each server-sent event of ``response``, as it arrives (comments and ids are skipped)."""
    event: str | None = None
    data: list[str] = []
    for line in response.iter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)
