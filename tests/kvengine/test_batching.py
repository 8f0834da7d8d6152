"""Batched decoding (kvengine.batching): cascade attention is exact, batched answers are the one-at-a-time answers,
rows join and leave, a closed stream frees its row, and a full queue refuses with OverloadedError."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvengine.attention import packed_gqa_sdpa
from kvengine.batching import Batcher, _Row
from kvengine.cascade import CascadeStep, merge_states, plain_attention_lse, prefix_attention_lse
from kvengine.errors import OverloadedError
from kvengine.kvcache import CartridgeCache, KvState

MEMORIES = [
    "Alice Moreau lives in Lisbon and works as a baker at the corner shop on Rua Augusta.",
    "Bob Tanaka keeps the spare key to the office under the blue flower pot by the back door.",
    "The quarterly review meeting with Carol is on Friday at three in the afternoon, in room 4B.",
    "Eva prefers her coffee black with no sugar, and she is allergic to peanuts.",
]
OTHER_MEMORIES = [
    "Farid drives a green 2009 Volvo estate and parks it in space number 17.",
    "The company's annual retreat will take place in Porto from the 12th to the 14th of June.",
]
QUESTIONS = ["Where does Alice live?", "Where is the spare key?", "When is the meeting with Carol?", "What is Eva allergic to?",
             "Who is Bob?", "What does Alice do?"]
SQUAD_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"


def _wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- the attention math (no model) ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_prefix_kernel_returns_the_attention_and_its_log_sum_exp(dtype):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 3, 12, 64, generator=gen).to(dtype)
    buf = torch.randn(1, 3, 700, 64, generator=gen).to(dtype)  # a strided view, as a KvState prefix is
    k, v = buf[:, :, :500], buf[:, :, 200:]
    out, lse = prefix_attention_lse(q, k, v[:, :, :500], 0.125)
    want_out, want_lse = plain_attention_lse(q.float(), k.float(), v[:, :, :500].float(), 0.125)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert lse.dtype == torch.float32 and lse.shape == (1, 3, 12)
    torch.testing.assert_close(out.float(), want_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=tol)


def test_merging_prefix_and_suffix_partials_is_attention_over_both():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 5, 64, generator=gen)
    k, v = torch.randn(2, 3, 400, 64, generator=gen), torch.randn(2, 3, 400, 64, generator=gen)
    out_a, lse_a = plain_attention_lse(q, k[:, :, :371], v[:, :, :371], 0.125)
    out_b, lse_b = plain_attention_lse(q, k[:, :, 371:], v[:, :, 371:], 0.125)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.125)
    torch.testing.assert_close(merge_states(out_a, lse_a, out_b, lse_b), whole, atol=1e-6, rtol=1e-5)


class _Layer(torch.nn.Module):
    def __init__(self, layer_idx: int, groups: int):
        super().__init__()
        self.layer_idx, self.num_key_value_groups = layer_idx, groups


def test_cascade_attention_equals_attention_over_each_rows_whole_sequence_without_copying_the_prefix():
    """Three rows (two on cartridge A, one on B), mid-answer, GQA 9 query heads on 3 kv heads."""
    gen = torch.Generator().manual_seed(3)
    kv, groups, dim = 3, 3, 64
    states = [KvState([torch.randn(1, kv, n, dim, generator=gen)], [torch.randn(1, kv, n, dim, generator=gen)], room=8) for n in (300, 170)]
    batcher = Batcher(torch.nn.Linear(1, 1), eos_ids=set(), device="cpu", max_batch=4)  # attention only: no model pass
    batcher._ensure_buffers(states[0], 40)
    rows = []
    for state, length in ((states[0], 9), (states[1], 4), (states[0], 17)):
        row = _Row(request=type("R", (), {"state": state})())
        row.length = length
        rows.append(row)
        batcher.kbuf[0][len(rows) - 1].normal_(generator=gen)
        batcher.vbuf[0][len(rows) - 1].normal_(generator=gen)
    for n in (1, 3):  # a decoding step and a multi-token (prefill-like) pass
        step = CascadeStep(batcher, 0, rows, n)
        query = torch.randn(3, kv * groups, n, dim, generator=gen)
        key, value = torch.randn(3, kv, n, dim, generator=gen), torch.randn(3, kv, n, dim, generator=gen)
        prefix_ptr = states[0].keys[0].data_ptr()
        out = step.attend(_Layer(0, groups), query, key, value, 0.125)  # [b, n, heads, d]
        assert states[0].keys[0].data_ptr() == prefix_ptr
        for i, row in enumerate(rows):
            pk, pv = row.request.state.prefix(0)
            end = row.length + n
            whole_k = torch.cat([pk, batcher.kbuf[0][i : i + 1, :, :end]], dim=2)
            whole_v = torch.cat([pv, batcher.vbuf[0][i : i + 1, :, :end]], dim=2)
            assert torch.equal(batcher.kbuf[0][i, :, row.length : end], key[i])  # the new keys were written
            mask = torch.ones(1, 1, n, whole_k.shape[2], dtype=torch.bool).tril(whole_k.shape[2] - n)
            want, _ = packed_gqa_sdpa(_Layer(0, groups), query[i : i + 1], whole_k, whole_v, mask, scaling=0.125)
            torch.testing.assert_close(out[i : i + 1], want, atol=2e-6, rtol=1e-5)  # both [1, n, heads, d]


# -- the real model ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cartridges(real_backend):
    return real_backend.compile(MEMORIES), real_backend.compile(OTHER_MEMORIES)


def _concurrently(calls):
    results, errors = [None] * len(calls), []
    barrier = threading.Barrier(len(calls))

    def run(i, call):
        try:
            barrier.wait()
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    return results


@pytest.mark.model
def test_the_batched_pass_gives_the_one_at_a_time_logits_to_float_rounding(real_backend, cartridges):
    """Same prompts, same positions: the first-token logits of a batched pass (rows of two cartridges, padded
    prompts) and of the single-question path differ by float rounding only."""
    backend = real_backend
    batcher = Batcher(backend.model, eos_ids=backend._eos_ids, device="cpu", max_batch=4)  # never started: driven here
    layout = backend.layout
    pairs = [(cartridges[0], QUESTIONS[0]), (cartridges[1], "Where is the retreat this year?"), (cartridges[0], QUESTIONS[3])]
    prompts = [layout.encode(layout.suffix_text(q)) for _, q in pairs]
    rows = [_Row(request=type("R", (), {"state": c.payload.state})()) for c, _ in pairs]
    batcher._ensure_buffers(rows[0].request.state, 64)
    longest = max(map(len, prompts))
    input_ids = torch.tensor([p + [p[-1]] * (longest - len(p)) for p in prompts])
    with torch.inference_mode():
        batched = batcher._forward_logits(0, rows, input_ids, torch.tensor([len(p) - 1 for p in prompts]))
        for i, ((cartridge, _), prompt) in enumerate(zip(pairs, prompts, strict=True)):
            state = cartridge.payload.state
            with state.lock:
                cache = CartridgeCache(state)
                try:
                    alone = backend.model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
                finally:
                    cache.crop_back()
            assert (batched[i] - alone).abs().max() < 1e-3 * alone.abs().max(), i
            assert int(batched[i].argmax()) == int(alone.argmax())


@pytest.mark.model
def test_concurrent_questions_are_decoded_together_and_answer_as_one_at_a_time(real_backend, cartridges):
    backend = real_backend
    pairs = [(cartridges[i % 2 if i < 2 else 0], q) for i, q in enumerate(QUESTIONS)]
    want = [backend.answer_unbatched(c, q, max_new_tokens=12).token_ids for c, q in pairs]
    batcher = backend.batcher()
    steps_before = batcher.steps
    got = _concurrently([lambda c=c, q=q: backend.answer(c, q, max_new_tokens=12) for c, q in pairs])
    assert [a.token_ids for a in got] == want
    assert all(a.text and a.mode == "cartridge" and 0 < a.ttft_s <= a.total_s for a in got)
    # one forward pass per step for the whole batch: far fewer passes than tokens decoded one at a time
    decoded = sum(len(a.token_ids) for a in got)
    assert batcher.max_rows_seen >= 2
    assert batcher.steps - steps_before < decoded


@pytest.mark.model
def test_greedy_batched_answers_equal_one_at_a_time_answers_on_kveval_questions(real_backend):
    from kvengine.kveval.data import build_scopes, load_squad
    from kvengine.kveval.runner import EvalConfig

    backend = real_backend
    (scope,) = build_scopes(load_squad(SQUAD_FIXTURE), 512, backend.count_tokens, num_articles=1)
    template = EvalConfig().question_template
    questions = [template.format(question=q.question) for q in scope.questions[:8]]
    assert len(questions) >= 4
    cartridge = backend.compile(list(scope.paragraphs))
    want = [backend.answer_unbatched(cartridge, q, max_new_tokens=16).token_ids for q in questions]
    got = _concurrently([lambda q=q: backend.answer(cartridge, q, max_new_tokens=16) for q in questions])
    assert [a.token_ids for a in got] == want


@pytest.mark.model
def test_rows_join_a_running_batch_and_streams_match(real_backend, cartridges):
    backend = real_backend
    cartridge = cartridges[0]
    long_one = backend.answer_stream(cartridge, "Tell me everything about Alice.", max_new_tokens=40, stop_at_eos=False)
    deltas = [next(long_one), next(long_one)]  # the long answer is decoding when the next questions arrive
    joined = _concurrently([lambda q=q: backend.answer(cartridge, q, max_new_tokens=8) for q in QUESTIONS[:3]])
    *rest, final = list(long_one)
    assert len(final.token_ids) == 40
    assert "".join(deltas + rest).strip() == final.text
    assert final.token_ids == backend.answer_unbatched(cartridge, "Tell me everything about Alice.", max_new_tokens=40, stop_at_eos=False).token_ids
    assert [a.token_ids for a in joined] == [backend.answer_unbatched(cartridge, q, max_new_tokens=8).token_ids for q in QUESTIONS[:3]]


@pytest.mark.model
def test_a_question_that_arrives_during_a_prefill_is_prefilled_before_the_next_decoding_step(real_backend, cartridges, monkeypatch):
    """Prefill first: the late arrival of a burst waits for one pass, not for a pass and a decoding step; but at most
    MAX_PREFILLS_IN_A_ROW passes run before the rows already decoding get their next token."""
    from kvengine.batching import MAX_PREFILLS_IN_A_ROW

    assert MAX_PREFILLS_IN_A_ROW == 2
    backend, cartridge = real_backend, cartridges[0]
    batcher = backend.batcher()
    passes: list[str] = []
    threads: list[threading.Thread] = []
    late: dict[int, object] = {}
    prefill, decode = batcher._prefill, batcher._decode

    def prefill_spy(rows):
        passes.append("prefill")
        if len(threads) < 2:  # another question comes during each of the first two passes
            i = len(threads) + 1
            threads.append(threading.Thread(target=lambda: late.__setitem__(i, backend.answer(cartridge, QUESTIONS[i], max_new_tokens=4))))
            threads[-1].start()
            _wait_until(lambda: batcher.waiting() == 1)
        return prefill(rows)

    def decode_spy():
        passes.append("decode")
        return decode()

    monkeypatch.setattr(batcher, "_prefill", prefill_spy)
    monkeypatch.setattr(batcher, "_decode", decode_spy)
    first = backend.answer(cartridge, QUESTIONS[0], max_new_tokens=4)
    for thread in threads:
        thread.join(timeout=60)
    # the second question is prefilled at once; the third waits for the decoding step of the rows in flight
    assert passes[:4] == ["prefill", "prefill", "decode", "prefill"], passes
    answers = [first, late[1], late[2]]
    assert [a.token_ids for a in answers] == [backend.answer_unbatched(cartridge, q, max_new_tokens=4).token_ids for q in QUESTIONS[:3]]


@pytest.mark.model
def test_an_idle_batcher_gathers_a_burst_into_one_first_pass(real_backend, cartridges):
    """Questions sent one after another, each within the quiet period of the one before, share the first pass."""
    backend = real_backend
    state = cartridges[0].payload.state
    prompts = [backend.layout.encode(backend.layout.suffix_text(q)) for q in QUESTIONS[:3]]
    with pytest.raises(ValueError, match="gather_s"):
        Batcher(backend.model, eos_ids=backend._eos_ids, device="cpu", gather_s=-1)
    batcher = Batcher(backend.model, eos_ids=backend._eos_ids, device="cpu", max_batch=4, gather_s=0.5)
    sizes: list[int] = []
    prefill = batcher._prefill
    batcher._prefill = lambda rows: (sizes.append(len(rows)), prefill(rows))[1]
    try:
        requests = []
        for prompt in prompts:
            requests.append(batcher.submit(state, prompt, max_new_tokens=3))
            time.sleep(0.02)
        answers = [[value for kind, value in request.events() if kind == "token"] for request in requests]
        assert sizes[0] == 3, sizes
        want = [list(backend.answer_unbatched(cartridges[0], q, max_new_tokens=3).token_ids) for q in QUESTIONS[:3]]
        assert answers == want
    finally:
        batcher.close()


@pytest.mark.model
def test_a_stream_closed_early_frees_its_row(real_backend, cartridges):
    backend = real_backend
    batcher = backend.batcher()
    stream = backend.answer_stream(cartridges[0], QUESTIONS[0], max_new_tokens=200, stop_at_eos=False)
    next(stream)
    assert batcher._in_flight == 1
    stream.close()
    _wait_until(lambda: batcher._in_flight == 0 and not batcher._rows)
    assert backend.answer(cartridges[0], QUESTIONS[0], max_new_tokens=8).token_ids == backend.answer_unbatched(cartridges[0], QUESTIONS[0], max_new_tokens=8).token_ids


@pytest.mark.model
def test_past_max_waiting_questions_it_refuses_with_overloaded_error(real_backend, cartridges):
    backend = real_backend
    batcher = Batcher(backend.model, eos_ids=backend._eos_ids, device="cpu", max_batch=1, max_waiting=1)
    state = cartridges[0].payload.state
    prompt = backend.layout.encode(backend.layout.suffix_text(QUESTIONS[0]))
    try:
        busy = batcher.submit(state, prompt, max_new_tokens=500, stop_at_eos=False)
        events = busy.events()
        assert next(events)[0] == "token"  # admitted: the only row is taken
        waiting = batcher.submit(state, prompt, max_new_tokens=4)
        assert batcher.waiting() == 1
        with pytest.raises(OverloadedError) as refused:
            batcher.submit(state, prompt, max_new_tokens=4)
        assert (refused.value.waiting, refused.value.limit) == (1, 1) and refused.value.retry_after_s >= 1
        assert "limit is 1" in str(refused.value)
        # a waiting question that is cancelled leaves the queue at once, making room
        waiting.cancel()
        assert batcher.waiting() == 0
        again = batcher.submit(state, prompt, max_new_tokens=4)
        busy.cancel()  # the row frees; the waiting question gets it and completes
        kinds = [kind for kind, _ in again.events()]
        assert kinds[-1] == "end" and kinds.count("token") >= 1
        _wait_until(lambda: batcher._in_flight == 0)
        assert batcher.submit(state, prompt, max_new_tokens=2) is not None
    finally:
        batcher.close()


@pytest.mark.model
def test_a_failed_pass_reaches_its_callers_and_the_batcher_carries_on(real_backend, cartridges):
    backend = real_backend
    batcher = Batcher(backend.model, eos_ids=backend._eos_ids, device="cpu", max_batch=4)
    state = cartridges[0].payload.state
    prompt = backend.layout.encode(backend.layout.suffix_text(QUESTIONS[0]))
    try:
        bad = batcher.submit(state, [backend.model.config.vocab_size + 5], max_new_tokens=4)  # an id past the vocabulary
        with pytest.raises(IndexError):
            list(bad.events())
        kinds = [kind for kind, _ in batcher.submit(state, prompt, max_new_tokens=4).events()]
        assert kinds[-1] == "end" and "token" in kinds
    finally:
        batcher.close()


@pytest.mark.model
def test_a_question_too_long_for_a_batch_row_is_answered_alone(real_backend, cartridges):
    from kvengine.batching import MAX_ROW_ROOM

    backend = real_backend
    batcher = backend.batcher()
    steps = batcher.steps
    long_budget = MAX_ROW_ROOM + 1  # prompt + answer room past what a row may take; the answer itself stops at EOS
    answer = backend.answer(cartridges[0], QUESTIONS[0], max_new_tokens=long_budget)
    assert batcher.steps == steps  # not batched: the row slots keep their size
    assert answer.token_ids == backend.answer_unbatched(cartridges[0], QUESTIONS[0], max_new_tokens=long_budget).token_ids
    with pytest.raises(ValueError, match="at most"):
        batcher.submit(cartridges[0].payload.state, [1, 2, 3], max_new_tokens=MAX_ROW_ROOM)


# -- a lone question: the one-at-a-time passes, then its slot when others join ------------------------------
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
    _wait_until(lambda: not cartridges[0].payload.state.lock.locked())  # an earlier test's lone row has given it back
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
    _wait_until(lambda: not batcher._rows)
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
    _wait_until(lambda: len(held) == 3)
    second = lone.submit(QUESTIONS[1], 4)  # waits while the lone row is held after its prompt and two decoding steps
    _wait_until(lambda: batcher.waiting() == 1)
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
    _wait_until(lambda: not lone.state.lock.locked() and not batcher._rows)
    assert _tokens(lone.submit(QUESTIONS[0], 4).events()) == lone.one_at_a_time(QUESTIONS[0], 4)
    assert len(calls) == 3 + 4  # the next question took the lone passes again


@pytest.mark.model
@pytest.mark.parametrize("how", ["cancel", "close"])
def test_a_lone_row_that_is_cancelled_or_whose_batcher_closes_gives_the_tail_back(lone, how):
    request = lone.submit(QUESTIONS[0], 400)  # within the cartridge's spare room (kvcache.DEFAULT_ROOM)
    assert next(request.events())[0] == "token" and lone.state.lock.locked()
    request.cancel() if how == "cancel" else lone.batcher.close()
    _wait_until(lambda: not lone.state.lock.locked())


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
    _wait_until(lambda: len(rows) == 2)  # the worker holds after the prompt's pass and one decoding step
    caller.start()
    _wait_until(state.wanted)
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
    _wait_until(lambda: not lone.batcher._rows)
    assert (state.capacity, state.keys[0].data_ptr()) == (capacity, buffers)
