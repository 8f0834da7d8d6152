"""Answering as the text is decoded: ``str`` deltas, then the recorded AnswerResult.

Decision: everything that can refuse before the first token (the question, the active version, loading
the cartridge) is checked when the stream is opened, so the API still answers those with their 4xx
status; what fails after the first byte (an engine refusal mid-decode) is the caller's to render as an
error event. The engine generator (``KvBackend.answer_stream``) is closed whenever the stream is closed
early: a client that goes away frees the engine's slot for the cartridge (the batcher's seat).

A generator cannot be closed while another thread runs it, so an AnswerStream is closed by the thread that
iterates it, or by the caller of ``close()`` when none does. Its slot does not wait for that: ``abandon()``
(the client went away, cartridges/api/sse.py) releases it at once, from any thread, without blocking, and
the items are closed after the step in progress (within one token), or in a thread of their own.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from kvengine.conversation import Prompt

from ..models import Layout
from ..selectors import active_configuration
from .answer import AnswerResult, answer_record, cartridge_answer, mode_validate, question_validate
from .ask import DEFAULT_OPTIONS, AskOptions
from .errors import context_too_long_as_422
from .routed_answer import scope_layout
from .serving import Serving, cartridge_serving

log = logging.getLogger("cartridges")

StreamItem = str | AnswerResult


class AnswerStream:
    """An answer being decoded: iterate for ``str`` deltas then one AnswerResult; ``close()`` ends it early.

    ``release`` runs exactly once, as soon as the stream ends, fails, is closed or abandoned, from whichever
    thread that happens in: it must not block (it gives back the ask's slot). ``on_close`` runs once after the
    items are closed, in the thread that closes them (it may touch the database).
    """

    def __init__(self, items: Iterator[StreamItem], *, release: Callable[[], None] | None = None,
                 on_close: Callable[[], None] | None = None):
        self._items = items
        self._release = release
        self._on_close = on_close
        self._lock = threading.Lock()
        self._closed = False  # no more items are handed out
        self._busy = False  # a thread is inside next(items): only it may close them
        self._released = False
        self._items_closed = False

    def __iter__(self) -> AnswerStream:
        return self

    def __next__(self) -> StreamItem:
        with self._lock:
            if self._closed:
                raise StopIteration
            self._busy = True
        try:
            item = next(self._items)
        except BaseException:  # exhausted or failed: free what it holds at once
            with self._lock:
                self._busy = False
            self.close()
            raise
        with self._lock:
            self._busy = False
            abandoned = self._closed
        if abandoned:  # abandoned while this thread decoded: it closes the items, now that nobody runs them
            self._items_close()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop decoding (closes the engine generator here unless another thread is inside it) and give back
        what the stream holds; safe to call twice, from any thread."""
        if self._stop():
            self._items_close()

    def abandon(self) -> None:
        """The client is gone: give the slot back now, never blocking (safe on an event loop, from any thread).

        The items are closed by the thread decoding them, or by a thread of their own when none is.
        """
        if self._stop():
            threading.Thread(target=self._items_close, kwargs={"own_thread": True},
                             name="mnesio-answer-abandon", daemon=True).start()

    def _stop(self) -> bool:
        """Hand out no more items and release; True when the items are open and no thread is inside next(items)
        (the caller closes them)."""
        with self._lock:
            self._closed = True
            busy = self._busy
            release, self._released = not self._released, True
            items_open = not busy and not self._items_closed
        if release and self._release is not None:
            self._release()
        return items_open

    def _items_close(self, own_thread: bool = False) -> None:
        with self._lock:
            if self._items_closed:
                return
            self._items_closed = True
        try:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()
        finally:
            try:
                if self._on_close is not None:
                    self._on_close()
            finally:
                if own_thread:
                    from django.db import connections

                    connections.close_all()  # this thread's connections end with it


def cartridge_answer_stream(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
                            options: AskOptions = DEFAULT_OPTIONS) -> AnswerStream:
    """Open a streamed answer of ``question`` for ``scope`` with this process's engine.

    mode="cartridge" yields a delta per decoded token (per word with the fake engine); mode="text" re-reads
    the memories, and a scope answered from its routed layout assembles its chunks: both yield the whole answer as
    one delta.
    """
    question = question_validate(question)
    mode = mode_validate(mode)
    config = active_configuration()
    if mode != "cartridge" or scope_layout(scope=scope, config=config) == Layout.ROUTED:  # answered whole: one delta
        result = cartridge_answer(scope=scope, question=question, mode=mode, actor=actor, options=options)
        return AnswerStream(iter([result.answer, result] if result.answer else [result]))
    serving = cartridge_serving(scope=scope, config=config)
    items = serving.backend.answer_stream(serving.cartridge, question, max_new_tokens=options.length(), **options.engine_kwargs())
    return AnswerStream(_recorded(items, scope=scope, serving=serving, actor=actor))


def _recorded(items, *, scope, serving: Serving, actor) -> Iterator[StreamItem]:
    """Pass the engine's deltas on; record its final Answer and yield it as the AnswerResult; close the engine."""
    try:
        with context_too_long_as_422():
            for item in items:
                if isinstance(item, str):
                    yield item
                else:
                    yield answer_record(scope=scope, version=serving.version, mode="cartridge", answer=item, actor=actor,
                                        serving=serving)
    finally:
        items.close()  # an early close (client gone) stops decoding here, not at the answer's end
