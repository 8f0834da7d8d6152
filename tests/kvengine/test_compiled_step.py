"""The decoding step compiled (kvengine.compiled, MNESIO_KV_COMPILE_STEP) on a tiny Qwen2 model: it decodes the tokens
the eager step decodes, a cartridge answers as re-reading does through it, and no cartridge length recompiles it."""
from __future__ import annotations

import pytest
from torch._dynamo.utils import counters

from kvengine import make_backend
from kvengine.decoding import Decoding

MEMORIES = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot."]
MORE_MEMORIES = [*MEMORIES, "The meeting with Carol is on Friday at three in the afternoon.", "Eva drinks black coffee."]
QUESTIONS = ["Where does Alice live?", "Where is the key?"]
LOGPROBS = Decoding(logprobs=True)  # the one-at-a-time step path (sampling.decode_steps)


@pytest.fixture(scope="module")
def backends(tiny_model_dir):
    path = tiny_model_dir("qwen2")
    eager = make_backend("transformers", model=path, dtype="f32", device="cpu")
    compiled = make_backend("transformers", model=path, dtype="f32", device="cpu", compile_step=True)  # compiles here
    return eager, compiled


def test_the_compiled_step_answers_as_eager_and_as_re_reading_without_recompiling(backends):
    eager, compiled = backends
    assert compiled._decode_step is not compiled.model and eager._decode_step is eager.model
    graphs = counters["stats"]["unique_graphs"]
    for memories in (MEMORIES, MORE_MEMORIES):  # two cartridge lengths, the cache growing token by token in each
        cartridge = compiled.compile(memories)
        for question in QUESTIONS:
            answer = compiled.answer(cartridge, question, max_new_tokens=12, stop_at_eos=False)  # the batcher's lone row
            assert len(answer.token_ids) == 12
            assert answer.token_ids == eager.answer(cartridge, question, max_new_tokens=12, stop_at_eos=False).token_ids
            assert answer.token_ids == compiled.answer_from_text(memories, question, max_new_tokens=12, stop_at_eos=False).token_ids
            stepped = compiled.answer(cartridge, question, max_new_tokens=12, decoding=LOGPROBS)  # up to the end of turn
            assert stepped.token_ids == answer.token_ids[: len(stepped.token_ids)]
            assert stepped.token_ids == compiled.answer_from_text(memories, question, max_new_tokens=12, decoding=LOGPROBS).token_ids
    assert counters["stats"]["unique_graphs"] == graphs  # warmed up once as it loaded: nothing compiled since
