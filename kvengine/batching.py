"""Continuous batching of cartridge questions: one worker thread per model decodes every question in flight.

Callers ``submit()`` a question on a cartridge and read its ``Request``'s events (a token at a time). Between
steps the worker admits waiting questions (a burst gathered into one prefill pass, prefill before the next
decoding step) and drops finished or cancelled rows; each step is one forward pass over every row, its
attention computed over each cartridge's shared prefix by kvengine.cascade. A lone question runs the
one-at-a-time path's very passes on its cartridge's scratch tail; long questions are not batched; past
``max_waiting`` submit() raises OverloadedError.

Design, with the thread-safety rules: docs/design/batching.md.
"""
from __future__ import annotations

import collections
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .cascade import CascadeStep
from .errors import OverloadedError
from .kvcache import CartridgeCache, KvState

DEFAULT_MAX_BATCH = 16  # rows decoded together
DEFAULT_MAX_WAITING = 64  # questions waiting for a row before OverloadedError
# An idle worker woken by a question waits until no other question has come for this long (at most GATHER_CAP times
# it), so a burst shares its first pass. 5 ms is CPython's default GIL switch interval: a thread that is ready to
# submit may wait that long to run. A lone question pays it once (0.005 s of a 0.2 s first token at 8k).
DEFAULT_GATHER_S = 0.005
GATHER_CAP = 8
# Prefill passes run in a row before the rows already decoding get their next token (prefill first, below): a
# burst split at a pass boundary gets its second pass at once, and no decoding row waits more than two passes.
MAX_PREFILLS_IN_A_ROW = 2
INITIAL_ROOM = 128  # per-row scratch positions; grown (one copy) when a question needs more
# The most scratch positions (prompt + answer) a question may take in a batch row. Every row slot has the
# room of the longest, so one long question would make all max_batch slots long (16 x 4k positions are 2.9 GB
# in f32 on SmolLM2); longer questions take the one-at-a-time path instead (TransformersKvBackend).
MAX_ROW_ROOM = 1024


# -- requests and rows ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Request:
    """One submitted question; the caller reads ``events()``; ``cancel()`` frees its row (or its queue place)."""

    state: KvState
    prompt: list[int]  # the question suffix's token ids (run on top of the cartridge)
    max_new_tokens: int
    stop_at_eos: bool
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    _events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    _batcher: Batcher | None = None

    def events(self) -> Iterator[tuple[str, object]]:
        """``("token", id)`` per decoded token, then ``("end", None)``; an ``("error", exc)`` is raised here."""
        while True:
            kind, value = self._events.get()
            if kind == "error":
                raise value
            yield kind, value
            if kind == "end":
                return

    def cancel(self) -> None:
        """Stop decoding this question (idempotent): it leaves the queue now, or its row at the next step."""
        self.cancelled = True
        if self._batcher is not None:
            self._batcher._forget(self)

    def _put(self, kind: str, value: object = None) -> None:
        self._events.put((kind, value))


@dataclass(eq=False)
class _Row:
    request: Request
    length: int = 0  # positions of the row's scratch written so far
    pending: int | None = None  # the token to feed at the next decode step
    num_out: int = 0
    done: bool = False
    # A row alone in the batch runs as the one-at-a-time path does (docs/design/batching.md, "A lone question"): its scratch
    # is this cache over its cartridge's own tail, whose lock the row holds until it moves to its slot or ends.
    solo: CartridgeCache | None = None


# -- the batcher ---------------------------------------------------------------------------------------
class Batcher:
    """Decodes concurrently submitted questions of one model together (module docstring)."""

    def __init__(self, model: torch.nn.Module, *, eos_ids: set[int], device: str, max_batch: int = DEFAULT_MAX_BATCH,
                 max_waiting: int = DEFAULT_MAX_WAITING, gather_s: float = DEFAULT_GATHER_S, step=None, prompt=None):
        if max_batch < 1 or max_waiting < 0 or not gather_s >= 0:
            raise ValueError(f"max_batch has to be >= 1, max_waiting >= 0 and gather_s >= 0 but got {max_batch}, {max_waiting} and {gather_s}")
        self.model, self.eos_ids, self.device = model, set(eos_ids), torch.device(device)
        self.step = model if step is None else step  # a lone row's single-token steps (the backend's compiled step, kvengine.compiled)
        self.prompt = model if prompt is None else prompt  # a lone row's prompt pass (kvengine.native_pass)
        self.max_batch, self.max_waiting, self.gather_s = max_batch, max_waiting, gather_s
        self.base = getattr(model, "base_model", None)  # the decoder stack, without the LM head
        self.lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        self.kbuf: list[torch.Tensor] = []
        self.vbuf: list[torch.Tensor] = []
        self.room = 0
        self._waiting: collections.deque[Request] = collections.deque()
        self._rows: list[_Row] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._in_flight = 0  # rows admitted and not yet dropped (guarded by _cond)
        self._seconds_per_question = 1.0  # moving average of recent total answer times (retry hint)
        self.steps = 0  # forward passes run (decode steps and prefill passes), for tests and benches
        self.max_rows_seen = 0

    # -- callers' side --------------------------------------------------------------------------------
    def submit(self, state: KvState, prompt: list[int], *, max_new_tokens: int, stop_at_eos: bool = True) -> Request:
        """Queue a question; raise OverloadedError when ``max_waiting`` questions already wait for a row."""
        if len(prompt) + max_new_tokens > MAX_ROW_ROOM:
            raise ValueError(f"a batched question takes at most {MAX_ROW_ROOM} positions (prompt + answer); answer it alone")
        request = Request(state=state, prompt=list(prompt), max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        request._batcher = self
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            free_rows = self.max_batch - self._in_flight  # the worker admits these at its next step boundary
            if len(self._waiting) >= self.max_waiting + max(0, free_rows):
                waiting = len(self._waiting)
                retry = max(1.0, math.ceil((waiting / self.max_batch + 1) * self._seconds_per_question))
                raise OverloadedError(waiting=waiting, limit=self.max_waiting, retry_after_s=float(retry))
            self._waiting.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvengine-batcher", daemon=True)
                self._thread.start()
            self._cond.notify()
        return request

    def waiting(self) -> int:
        """Questions submitted and not yet in the batch."""
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        """Stop the worker after the current step; questions still waiting get an error."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _forget(self, request: Request) -> None:
        with self._cond:
            try:
                self._waiting.remove(request)
            except ValueError:
                pass  # already in the batch: the worker drops its row at the next step

    # -- the worker -------------------------------------------------------------------------------------
    def _can_admit(self) -> bool:
        """Whether a question waits and a row is free for it."""
        with self._cond:
            return bool(self._waiting) and len(self._rows) < self.max_batch

    def _gather(self) -> None:
        """Idle and woken: wait (holding ``_cond``'s lock only between waits) until no question came for gather_s."""
        deadline = time.monotonic() + GATHER_CAP * self.gather_s
        while self.gather_s and not self._closed and len(self._waiting) < self.max_batch:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            seen = len(self._waiting)
            self._cond.wait(min(self.gather_s, left))  # submit() notifies: a new question restarts the quiet period
            if len(self._waiting) <= seen:  # none came (a cancelled one leaves the queue: no reason to wait on)
                return

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # no pass caught it: the worker is gone, so every caller hears, and none waits on
            with self._cond:
                self._closed = True
                stranded = [*self._waiting, *(row.request for row in self._rows)]
                self._waiting.clear()
            for request in stranded:
                request._put("error", exc)
            raise
        finally:  # however the worker ends, no cartridge tail stays taken
            for row in self._rows:
                self._solo_end(row, slot=None)

    def _serve(self) -> None:
        prefills_in_a_row = 0  # prefill passes since the last decoding step (at most MAX_PREFILLS_IN_A_ROW)
        idle = True  # the worker starts with the first question, nothing in flight
        with torch.inference_mode():
            while True:
                with self._cond:
                    idle = idle or (not self._waiting and not self._rows)
                    while not self._closed and not self._waiting and not self._rows:
                        self._cond.wait()
                    if idle and not self._rows:  # woken from idle (or just started): let the rest of a burst arrive
                        self._gather()
                    idle = False
                    if self._closed:
                        for row in self._rows:
                            self._solo_end(row, slot=None)
                        for request in [*self._waiting, *(row.request for row in self._rows)]:
                            request._put("error", RuntimeError("the batcher was closed"))
                        self._waiting.clear()
                        self._rows.clear()
                        self._in_flight = 0
                        return
                    admitted = []
                    while self._waiting and len(self._rows) + len(admitted) < self.max_batch:
                        request = self._waiting.popleft()
                        if not request.cancelled:
                            admitted.append(request)
                    self._in_flight += len(admitted)
                new_rows = [_Row(request) for request in admitted]
                try:
                    self._drop_finished()
                    if new_rows:
                        self._prefill(new_rows)
                        self._drop_finished()
                        prefills_in_a_row += 1
                        if prefills_in_a_row < MAX_PREFILLS_IN_A_ROW and self._can_admit():
                            continue  # prefill first: questions that came during the pass get a first token before the next step
                    prefills_in_a_row = 0
                    if self._rows and any(row.pending is not None for row in self._rows):
                        self._decode()
                        self._drop_finished()
                except Exception as exc:  # noqa: BLE001 - delivered to every caller of the failed pass
                    failed = {id(row): row for row in [*self._rows, *new_rows]}
                    for row in failed.values():
                        self._solo_end(row, slot=None)
                        row.request._put("error", exc)
                    self._rows.clear()
                    prefills_in_a_row = 0
                    with self._cond:
                        self._in_flight = 0

    def _ensure_buffers(self, state: KvState, room: int) -> None:
        """Allocate (or grow, keeping the rows' contents) the per-row scratch buffers to ``room`` positions."""
        if room <= self.room:
            return
        room = max(room, INITIAL_ROOM, 2 * self.room)
        new_k, new_v = [], []
        for layer in range(state.num_layers):
            _, kv_heads, _, dim = state.keys[layer].shape
            kb = torch.zeros((self.max_batch, kv_heads, room, dim), dtype=state.keys[layer].dtype, device=self.device)
            vb = torch.zeros((self.max_batch, kv_heads, room, state.values[layer].shape[-1]), dtype=state.values[layer].dtype, device=self.device)
            if self.room:
                kb[:, :, : self.room].copy_(self.kbuf[layer])
                vb[:, :, : self.room].copy_(self.vbuf[layer])
            new_k.append(kb)
            new_v.append(vb)
        self.kbuf, self.vbuf, self.room = new_k, new_v, room

    def _logits_pass(self, start: int, rows: list[_Row], input_ids: torch.Tensor, last: torch.Tensor) -> list[int]:
        """One forward pass for rows in slots ``start:start+len(rows)``: greedy token at each row's ``last`` index."""
        return self._forward_logits(start, rows, input_ids, last).argmax(dim=-1).tolist()

    def _forward_logits(self, start: int, rows: list[_Row], input_ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The pass itself: float32 logits ``[b, vocab]`` at each row's ``last`` input index."""
        step = CascadeStep(self, start, rows, input_ids.shape[1])
        offsets = torch.tensor([row.request.state.num_tokens for row in rows], device=self.device).unsqueeze(1)
        position_ids = offsets + step.write_pos  # [b, n]: the cartridge's length + the row's own position
        hidden = self.base(input_ids=input_ids, position_ids=position_ids, use_cache=False, mnesio_cascade=step).last_hidden_state
        hidden = hidden[torch.arange(len(rows), device=self.device), last]  # [b, hidden]
        self.steps += 1
        return self.lm_head(hidden).float()

    def _prefill(self, new_rows: list[_Row]) -> None:
        """Run the newly admitted questions' prompts (one padded pass), take their first tokens, join the batch."""
        self._ensure_buffers(new_rows[0].request.state, max(len(r.request.prompt) + r.request.max_new_tokens for r in new_rows))
        start = len(self._rows)
        self._rows.extend(new_rows)
        self.max_rows_seen = max(self.max_rows_seen, len(self._rows))
        if start == 0 and len(new_rows) == 1 and self._solo_begin(new_rows[0]):
            row = new_rows[0]
            self._emit_solo(row, torch.tensor([row.request.prompt], device=self.device), logits_to_keep=1)
            return
        longest = max(len(row.request.prompt) for row in new_rows)
        padded = [row.request.prompt + [row.request.prompt[-1]] * (longest - len(row.request.prompt)) for row in new_rows]
        input_ids = torch.tensor(padded, device=self.device)  # [k, longest]; padding is masked out, then overwritten
        last = torch.tensor([len(row.request.prompt) - 1 for row in new_rows], device=self.device)
        tokens = self._logits_pass(start, new_rows, input_ids, last)
        for row, token in zip(new_rows, tokens, strict=True):
            row.length = len(row.request.prompt)
            self._emit(row, token)

    def _decode(self) -> None:
        """One decoding step for every row in flight: feed each row's pending token, take its next one."""
        rows = self._rows
        if len(rows) == 1 and rows[0].solo is not None and not rows[0].request.state.wanted():
            self._emit_solo(rows[0], torch.tensor([[rows[0].pending]], device=self.device))
            return
        for slot, row in enumerate(rows):
            if row.solo is not None:  # no longer alone, or a one-at-a-time call waits for the tail: into its slot
                self._solo_end(row, slot=slot)
        input_ids = torch.tensor([[row.pending] for row in rows], device=self.device)  # [b, 1]
        tokens = self._logits_pass(0, rows, input_ids, torch.zeros(len(rows), dtype=torch.long, device=self.device))
        for row, token in zip(rows, tokens, strict=True):
            row.length += 1
            self._emit(row, token)

    # -- a lone question: the one-at-a-time path's passes ------------------------------------------------------
    def _solo_begin(self, row: _Row) -> bool:
        """Take the row's cartridge tail for it if nobody holds it (KvState.lock, not waited for)."""
        state = row.request.state
        if state.num_tokens + len(row.request.prompt) + row.request.max_new_tokens > state.capacity:
            return False  # the tail has no room for it: growing it would copy the whole cartridge on the worker
        if state.wanted() or not state.lock.acquire(blocking=False):
            return False  # the one-at-a-time path is using it or waits for it (a fidelity check, a long question)
        row.solo = CartridgeCache(state)
        return True

    def _emit_solo(self, row: _Row, input_ids: torch.Tensor, **kwargs) -> None:
        """One pass of the lone row over its cartridge tail, exactly as TransformersKvBackend._greedy_tokens runs it."""
        forward = self.step if input_ids.shape[1] == 1 and not kwargs else self.prompt
        logits = forward(input_ids=input_ids, cache=row.solo, use_cache=True, **kwargs).logits[0, -1].float()
        self.steps += 1
        row.length += input_ids.shape[1]
        self._emit(row, int(logits.argmax()))

    def _solo_end(self, row: _Row, *, slot: int | None) -> None:
        """Give the cartridge tail back; with ``slot``, first copy the row's scratch into its slot buffers."""
        cache, row.solo = row.solo, None
        if cache is None:
            return
        state = row.request.state
        try:
            if slot is not None:
                begin = cache.base_length
                for layer, kb, vb in zip(cache.layers, self.kbuf, self.vbuf, strict=True):
                    assert layer.length == begin + row.length, "a lone row's scratch is its cache's tail"
                    kb[slot, :, : row.length].copy_(layer.kbuf[0, :, begin : layer.length])
                    vb[slot, :, : row.length].copy_(layer.vbuf[0, :, begin : layer.length])
        finally:
            cache.crop_back()
            state.lock.release()

    def _emit(self, row: _Row, token: int) -> None:
        """The greedy loop's bookkeeping, as TransformersKvBackend._greedy_tokens does it for one question."""
        request = row.request
        row.pending = None
        if request.stop_at_eos and token in self.eos_ids:
            row.done = True
            return
        request._put("token", token)
        row.num_out += 1
        if row.num_out >= request.max_new_tokens:
            row.done = True
        else:
            row.pending = token

    def _drop_finished(self) -> None:
        """Remove finished and cancelled rows, moving the last rows' scratch into the freed slots."""
        slot = 0
        while slot < len(self._rows):
            row = self._rows[slot]
            if not (row.done or row.request.cancelled):
                slot += 1
                continue
            self._solo_end(row, slot=None)
            if row.done and not row.request.cancelled:
                row.request._put("end", None)
                elapsed = time.perf_counter() - row.request.submitted
                self._seconds_per_question = 0.8 * self._seconds_per_question + 0.2 * elapsed
            last = len(self._rows) - 1
            if slot != last:
                moved = self._rows[last]
                if moved.solo is None:  # (only slot 0 is ever solo) a solo row's scratch is in its cartridge's tail
                    for kb, vb in zip(self.kbuf, self.vbuf, strict=True):
                        kb[slot, :, : moved.length].copy_(kb[last, :, : moved.length])
                        vb[slot, :, : moved.length].copy_(vb[last, :, : moved.length])
                self._rows[slot] = moved
            self._rows.pop()
            with self._cond:
                self._in_flight -= 1
