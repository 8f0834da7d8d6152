"""Batched decoding of a lone question (kvengine.batching): the one-at-a-time passes on its cartridge's tail, then
its slot in the batch when others join, and the tail given back whatever ends the row."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from kvengine.batching import Batcher
from kvengine.kvcache import KvState
from tests.support.batching import QUESTIONS, wait_until


@dataclass
class _Lone:
    backend: object
    cartridge: object
    batcher: Batcher

    @property
    def state(self) -> KvState:
        return self.cartridge.payload.state

    def submit(self, question: str, max_new_tokens: int):
        prompt = self.backend.layout.encode(self.backend.layout.suffix_text(question))
        return self.batcher.submit(self.state, prompt, max_new_tokens=max_new_tokens, stop_at_eos=False)

    def one_at_a_time(self, question: str, max_new_tokens: int) -> list[int]:
        return list(self.backend.answer_unbatched(self.cartridge, question, max_new_tokens=max_new_tokens, stop_at_eos=False).token_ids)


def _tokens(events) -> list[int]:
    return [value for kind, value in events if kind == "token"]


@pytest.fixture
def lone(real_backend, cartridges):
    """A batcher of the test's own (4 rows, no gather wait) on the first cartridge, closed after the test."""
    wait_until(lambda: not cartridges[0].payload.state.lock.locked())  # an earlier test's lone row has given it back
    batcher = Batcher(real_backend.model, eos_ids=real_backend._eos_ids, device="cpu", max_batch=4, gather_s=0)
    yield _Lone(real_backend, cartridges[0], batcher)
    batcher.close()


def _hold_after_solo_pass(batcher: Batcher, passes: int) -> tuple[threading.Event, list]:
    """Make the worker wait, after its ``passes``-th lone pass, until the returned event is set; the list gets the row."""
    go, rows = threading.Event(), []
    emit_solo = batcher._emit_solo

    def held(row, ids, **kw):
        emit_solo(row, ids, **kw)
        rows.append(row)
        if len(rows) == passes:
            assert go.wait(60)

    batcher._emit_solo = held
    return go, rows


@pytest.mark.model
def test_a_lone_question_runs_the_one_at_a_time_passes_on_its_cartridges_tail(lone):
    batcher, state = lone.batcher, lone.state
    seen: list[tuple[bool, bool]] = []
    emit_solo = batcher._emit_solo
    batcher._emit_solo = lambda row, ids, **kw: (seen.append((row.solo is not None, state.lock.locked())), emit_solo(row, ids, **kw))[1]
    tokens = _tokens(lone.submit(QUESTIONS[0], 6).events())
    wait_until(lambda: not batcher._rows)
    assert seen == [(True, True)] * 6  # the prompt's pass and 5 decoding steps, each holding the tail
    assert batcher.steps == 6 and not state.lock.locked()  # given back at the end
    assert tokens == lone.one_at_a_time(QUESTIONS[0], 6)


@pytest.mark.model
def test_a_lone_row_moves_into_its_slot_when_another_question_joins_and_gives_the_tail_back(lone):
    batcher = lone.batcher
    moves: list[int | None] = []
    solo_end = batcher._solo_end

    def solo_end_spy(row, *, slot):
        cache = row.solo
        if cache is None:
            return solo_end(row, slot=slot)
        moves.append(slot)
        tail = [(layer.kbuf[0, :, cache.base_length : layer.length].clone(), layer.vbuf[0, :, cache.base_length : layer.length].clone())
                for layer in cache.layers]
        solo_end(row, slot=slot)
        assert all(k.shape[1] == row.length for k, _ in tail)  # the prompt and the answer so far, no more, no less
        for (k, v), kb, vb in zip(tail, batcher.kbuf, batcher.vbuf, strict=True):
            assert torch.equal(kb[slot, :, : row.length], k) and torch.equal(vb[slot, :, : row.length], v)

    batcher._solo_end = solo_end_spy
    go, held = _hold_after_solo_pass(batcher, 3)
    events = lone.submit(QUESTIONS[0], 16).events()
    # the first question runs alone before the second arrives: submitted before the worker took the first (a loaded
    # machine), both would start together and neither would run the one-at-a-time passes
    wait_until(lambda: len(held) == 3)
    second = lone.submit(QUESTIONS[1], 4)  # waits while the lone row is held after its prompt and two decoding steps
    wait_until(lambda: batcher.waiting() == 1)
    go.set()
    short = _tokens(second.events())
    # the long row went into its slot (0) at the first step it shared, and gave the tail back then
    assert moves == [0]
    got = _tokens(events)
    assert (got, short) == (lone.one_at_a_time(QUESTIONS[0], 16), lone.one_at_a_time(QUESTIONS[1], 4))


@pytest.mark.model
def test_a_lone_question_takes_the_cascade_path_when_the_one_at_a_time_path_holds_the_tail(lone):
    """No waiting on KvState.lock in the worker: a fidelity check holding it does not stall the batch (or deadlock a
    caller that holds it and asks a batched question)."""
    batcher = lone.batcher
    solo_passes: list[int] = []
    emit_solo = batcher._emit_solo
    batcher._emit_solo = lambda row, ids, **kw: (solo_passes.append(1), emit_solo(row, ids, **kw))[1]
    tokens: list[int] = []
    with lone.state.lock:
        request = lone.submit(QUESTIONS[2], 6)
        reader = threading.Thread(target=lambda: tokens.extend(_tokens(request.events())))
        reader.start()
        reader.join(timeout=120)  # the worker never waits for the lock: the answer comes while the test holds it
        assert not reader.is_alive()
    assert solo_passes == [] and tokens == lone.one_at_a_time(QUESTIONS[2], 6)


@pytest.mark.model
def test_an_error_in_a_lone_rows_pass_gives_the_tail_back(lone):
    batcher = lone.batcher
    emit_solo = batcher._emit_solo
    calls = []

    def failing(row, ids, **kw):
        calls.append(1)
        if len(calls) == 3:  # the prompt's pass and one step went through: the tail holds the row's scratch
            raise RuntimeError("boom")
        return emit_solo(row, ids, **kw)

    batcher._emit_solo = failing
    with pytest.raises(RuntimeError, match="boom"):
        list(lone.submit(QUESTIONS[0], 8).events())
    wait_until(lambda: not lone.state.lock.locked() and not batcher._rows)
    assert _tokens(lone.submit(QUESTIONS[0], 4).events()) == lone.one_at_a_time(QUESTIONS[0], 4)
    assert len(calls) == 3 + 4  # the next question took the lone passes again


@pytest.mark.model
@pytest.mark.parametrize("how", ["cancel", "close"])
def test_a_lone_row_that_is_cancelled_or_whose_batcher_closes_gives_the_tail_back(lone, how):
    request = lone.submit(QUESTIONS[0], 400)  # within the cartridge's spare room (kvcache.DEFAULT_ROOM)
    assert next(request.events())[0] == "token" and lone.state.lock.locked()
    request.cancel() if how == "cancel" else lone.batcher.close()
    wait_until(lambda: not lone.state.lock.locked())


@pytest.mark.model
def test_a_one_at_a_time_call_waits_one_step_for_a_lone_row_not_its_whole_answer(lone):
    """fidelity(), long questions and the gate take the tail through KvState.scratch(): the lone row holding it moves
    into its slot at its next step and goes on decoding there, with the same tokens."""
    batcher, state = lone.batcher, lone.state
    go, rows = _hold_after_solo_pass(batcher, 2)
    events = lone.submit(QUESTIONS[0], 24).events()
    seen: list[tuple[bool, int]] = []

    def one_at_a_time_call():
        with state.scratch():  # would wait for all 24 tokens if the lone row kept the tail
            seen.append((rows[-1].solo is None, rows[-1].num_out))

    caller = threading.Thread(target=one_at_a_time_call)
    wait_until(lambda: len(rows) == 2)  # the worker holds after the prompt's pass and one decoding step
    caller.start()
    wait_until(state.wanted)
    go.set()
    caller.join(timeout=60)
    assert not caller.is_alive() and seen and seen[0][0] and seen[0][1] <= 3  # moved at the next step, not at the 24th
    assert _tokens(events) == lone.one_at_a_time(QUESTIONS[0], 24)


@pytest.mark.model
def test_a_lone_question_past_the_cartridges_spare_room_takes_the_cascade_path_and_grows_nothing(lone):
    """The worker never copies a cartridge to make room: a lone question whose prompt and answer would not fit the
    KvState's spare positions is decoded on cascade attention, from its slot."""
    cartridge = lone.state
    state = KvState([cartridge.prefix(i)[0] for i in range(cartridge.num_layers)],
                    [cartridge.prefix(i)[1] for i in range(cartridge.num_layers)], room=32)  # a copy with 32 spare positions
    capacity, buffers = state.capacity, state.keys[0].data_ptr()
    prompt = lone.backend.layout.encode(lone.backend.layout.suffix_text(QUESTIONS[0]))
    request = lone.batcher.submit(state, prompt, max_new_tokens=32, stop_at_eos=False)
    assert next(request.events())[0] == "token"
    assert not state.lock.locked() and lone.batcher._rows[0].solo is None
    request.cancel()
    wait_until(lambda: not lone.batcher._rows)
    assert (state.capacity, state.keys[0].data_ptr()) == (capacity, buffers)
