"""Batched decoding (kvengine.batching) on the real model: batched answers are the one-at-a-time answers, rows
join and leave, a closed stream frees its row, and a full queue refuses with OverloadedError."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from kvengine.batching import Batcher, _Row
from kvengine.errors import OverloadedError
from kvengine.kvcache import CartridgeCache
from tests.support.batching import QUESTIONS, wait_until

SQUAD_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "squad_subset" / "squad_v1.1_dev_subset.json"


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
    (scope,) = build_scopes(load_squad(SQUAD_FIXTURE), 256, backend.count_tokens, num_articles=1)
    template = EvalConfig().question_template
    questions = [template.format(question=q.question) for q in scope.questions[:4]]
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
            wait_until(lambda: batcher.waiting() == 1)
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
    wait_until(lambda: batcher._in_flight == 0 and not batcher._rows)
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
        wait_until(lambda: batcher._in_flight == 0)
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
