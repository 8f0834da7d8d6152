"""Answering as the text is decoded: ``str`` deltas, then the recorded AnswerResult.

Decision: everything that can refuse before the first token (the question, the active version, loading
the cartridge) is checked when the stream is opened, so the API still answers those with their 4xx
status; what fails after the first byte (an engine refusal mid-decode) is the caller's to render as an
error event. The engine generator (``KvBackend.answer_stream``) is closed whenever the stream is closed
early: a client that goes away frees the engine's slot for the cartridge (the batcher's seat).

AnswerStream is iterated and closed by one thread at a time (a generator cannot be closed while another
thread runs it): the ASGI view pumps it in a thread of its own and closes it there (cartridges/api/sse.py).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from .. import conf, engine
from ..selectors import active_configuration
from .answer import (
    AnswerResult,
    _context_too_long_as_422,
    active_version_for_answer,
    answer_record,
    cartridge_answer,
    mode_validate,
    question_validate,
)

log = logging.getLogger("cartridges")

StreamItem = str | AnswerResult


class AnswerStream:
    """An answer being decoded: iterate for ``str`` deltas then one AnswerResult; ``close()`` ends it early.

    ``on_close`` runs exactly once, when the stream ends, fails or is closed (it gives back the ask's slot).
    """

    def __init__(self, items: Iterator[StreamItem], *, on_close: Callable[[], None] | None = None):
        self._items = items
        self._on_close = on_close
        self._closed = False

    def __iter__(self) -> AnswerStream:
        return self

    def __next__(self) -> StreamItem:
        if self._closed:
            raise StopIteration
        try:
            return next(self._items)
        except BaseException:  # exhausted or failed: free what it holds at once
            self.close()
            raise

    def close(self) -> None:
        """Stop decoding (closes the engine generator) and give back what the stream holds; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()
        finally:
            if self._on_close is not None:
                self._on_close()


def cartridge_answer_stream(*, scope, question: str, mode: str = "cartridge", actor=None) -> AnswerStream:
    """Open a streamed answer of ``question`` for ``scope`` with this process's engine.

    mode="cartridge" yields a delta per decoded token (per word with the fake engine); mode="text" re-reads
    the memories and yields the whole answer as one delta.
    """
    question = question_validate(question)
    mode = mode_validate(mode)
    if mode != "cartridge":
        result = cartridge_answer(scope=scope, question=question, mode=mode, actor=actor)
        return AnswerStream(iter([result.answer, result] if result.answer else [result]))
    config = active_configuration()
    version = active_version_for_answer(scope=scope, config=config)
    cartridge, backend = engine.cartridge_load(version=version, config=config)
    items = backend.answer_stream(cartridge, question, max_new_tokens=conf.answer_max_new_tokens())
    return AnswerStream(_recorded(items, scope=scope, version=version, actor=actor))


def _recorded(items, *, scope, version, actor) -> Iterator[StreamItem]:
    """Pass the engine's deltas on; record its final Answer and yield it as the AnswerResult; close the engine."""
    try:
        with _context_too_long_as_422():
            for item in items:
                if isinstance(item, str):
                    yield item
                else:
                    yield answer_record(scope=scope, version=version, mode="cartridge", answer=item, actor=actor)
    finally:
        items.close()  # an early close (client gone) stops decoding here, not at the answer's end
