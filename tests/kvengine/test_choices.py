"""The n sampled choices of one question, decoded together over the cartridge and the question computed once: each
choice is the answer of a single ask with seed + i, token for token, and every row ends on its own."""
from __future__ import annotations

import pytest

from kvengine import choices
from kvengine.decoding import Decoding, StopWatcher, TextStream
from kvengine.fake import FakeKvBackend

MEMORIES = ["Lena is a nurse who lives in Porto.", "Marco works as a baker in Lyon."]
STORY = "Tell me a short story about Lena."
# logits of a batched row and of its single ask agree to float rounding (two partial attentions and a merge instead
# of one attention, matmuls over several rows): measured at most a few 1e-5 on SmolLM2-135M in f32 (choices.py)
LOGIT_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def cartridge(real_backend):
    return real_backend.compile(MEMORIES)


def test_choice_i_takes_seed_plus_i_and_the_first_keeps_the_request():
    seeded = Decoding(temperature=0.8, seed=5)
    assert [seeded.for_choice(i).seed for i in range(3)] == [5, 6, 7] and seeded.for_choice(0) is seeded
    assert Decoding(temperature=0.8, seed=2**63 - 1).for_choice(1).seed == 0
    assert Decoding(temperature=0.8).for_choice(2).seed is None  # no seed: each choice its own random one


def test_the_text_stream_holds_a_split_character_and_ends_before_a_stop():
    class Bytes:  # a tokenizer whose tokens are single bytes
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode(errors="replace")

    ids: list[int] = []
    text = TextStream(Bytes(), ids, StopWatcher(("!",)))
    shown = [text.push(t) for t in "caf\u00e9".encode()]
    assert shown == ["c", "a", "f", "", "\u00e9"] and not text.stopped
    assert text.push(ord("!")) == "" and text.stopped and text.watcher.text == "caf\u00e9"


def test_the_fake_answers_each_choice_under_its_own_decoding():
    fake = FakeKvBackend()
    cartridge = fake.compile(MEMORIES)
    answers = fake.answer_choices(cartridge, "Where does Lena live?", num_choices=3, decoding=Decoding(temperature=0.5, seed=1))
    assert [a.text for a in answers] == [MEMORIES[0]] * 3


@pytest.mark.model
def test_the_batched_choices_are_the_single_seeded_asks_token_for_token(real_backend, cartridge, monkeypatch):
    decoding = Decoding(temperature=0.9, seed=7, logprobs=True)
    seen: dict[tuple[int, int], list] = {}  # (seed, step) -> the logits each sampler chose from, batched then single
    choose = choices.Sampler.choose

    def spy(self, logits):
        seen.setdefault((self.decoding.seed, len(self.generated)), []).append(logits.clone())
        return choose(self, logits)

    monkeypatch.setattr(choices.Sampler, "choose", spy)
    state = real_backend._payload(cartridge).state
    buffers = [k.data_ptr() for k in state.keys]

    batched = real_backend.answer_choices(cartridge, STORY, num_choices=3, max_new_tokens=8, decoding=decoding)
    single = [real_backend.answer(cartridge, STORY, max_new_tokens=8, decoding=decoding.for_choice(i)) for i in range(3)]

    assert [a.token_ids for a in batched] == [a.token_ids for a in single]
    assert [a.text for a in batched] == [a.text for a in single]
    assert len({a.token_ids for a in batched}) > 1  # three draws, not one answer copied
    for mine, theirs in zip(batched, single, strict=True):
        assert [e.token for e in mine.logprobs] == [e.token for e in theirs.logprobs]
        assert all(abs(a.logprob - b.logprob) < LOGIT_TOLERANCE for a, b in zip(mine.logprobs, theirs.logprobs, strict=True))
    pairs = [v for v in seen.values() if len(v) == 2]
    assert len(pairs) >= 3 * 2  # every row's steps were compared, not only the first
    first = [v for (_, step), v in seen.items() if step == 0]
    assert all(bool((a == b).all()) for a, b in first)  # the question's pass is the single ask's, bit for bit
    assert max(float((a - b).abs().max()) for a, b in pairs) < LOGIT_TOLERANCE
    # the cartridge was neither copied nor grown for the rows, and its scratch tail is free and back at its length
    assert [k.data_ptr() for k in state.keys] == buffers and state.lock.acquire(blocking=False)
    state.lock.release()
    assert real_backend.answer(cartridge, STORY, max_new_tokens=8, decoding=decoding).token_ids == single[0].token_ids


@pytest.mark.model
def test_each_row_ends_on_its_own_and_the_others_decode_on(real_backend, cartridge):
    decoding = Decoding(temperature=0.9, seed=7)
    free = real_backend.answer_choices(cartridge, STORY, num_choices=3, max_new_tokens=8, decoding=decoding)
    # a stop string that ends the first row early: the first word of its answer after its first token
    words = free[0].text.split()
    stop = next(w for w in words[1:-1] if not any(w in a.text for a in free[1:]))
    stopped = real_backend.answer_choices(cartridge, STORY, num_choices=3, max_new_tokens=8,
                                          decoding=Decoding(temperature=0.9, seed=7, stop=(stop,)))
    alone = [real_backend.answer(cartridge, STORY, max_new_tokens=8, decoding=Decoding(temperature=0.9, seed=7 + i, stop=(stop,)))
             for i in range(3)]
    assert [a.token_ids for a in stopped] == [a.token_ids for a in alone] and [a.text for a in stopped] == [a.text for a in alone]
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) < len(free[0].token_ids)
    assert stop not in stopped[0].text and stopped[0].text == free[0].text.split(stop)[0].strip()
    assert [a.token_ids for a in stopped[1:]] == [a.token_ids for a in free[1:]]  # the rows after it decoded on
    assert max(len(a.token_ids) for a in stopped[1:]) > len(stopped[0].token_ids)
