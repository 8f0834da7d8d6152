"""A conversation after the cartridge prefix, and decoding options (sampling, seed, stop, log-probs, a JSON
schema), on the real default model: the cartridge path and re-reading the whole prompt agree token for token."""
from __future__ import annotations

import json

import pytest

from kvengine.conversation import Conversation, Turn
from kvengine.decoding import Decoding, StopWatcher

MEMORIES = ["Lena is a nurse who lives in Porto.", "Lena has a dog named Biscuit.", "Marco works as a baker in Lyon."]
HISTORY = Conversation(turns=(Turn("user", "Tell me about Lena."),
                              Turn("assistant", "Lena is a nurse who lives in Porto and has a dog named Biscuit."),
                              Turn("user", "What is her dog's name?")),
                       system="You are a helpful assistant. Answer in one short sentence.")


@pytest.fixture(scope="module")
def cartridge(real_backend):
    return real_backend.compile(MEMORIES)


def test_it_renders_a_conversation_after_the_memories_prefix(real_backend):
    layout = real_backend.layout
    memories = layout.clean_memories(MEMORIES)
    prefix = layout.encode(layout.prefix_text(memories))
    full = layout.encode(layout.full_text(memories, HISTORY))
    assert full[: len(prefix)] == prefix and full[len(prefix):] == layout.encode(layout.suffix_text(HISTORY))
    suffix = layout.suffix_text(HISTORY)
    assert suffix.startswith("You are a helpful assistant. Answer in one short sentence.\n\nTell me about Lena.<|im_end|>")
    assert suffix.count("<|im_start|>assistant") == 2  # the earlier answer, then the generation prompt
    # one user turn and no system text is the plain question's prompt exactly
    assert layout.suffix_text(layout.clean_question(Conversation(turns=(Turn("user", " Where? "),)))) == layout.suffix_text("Where?")


@pytest.mark.model
def test_it_answers_a_follow_up_from_the_earlier_turn_and_agrees_with_rereading(real_backend, cartridge):
    from_cartridge = real_backend.answer(cartridge, HISTORY, max_new_tokens=16)
    from_text = real_backend.answer_from_text(MEMORIES, HISTORY, max_new_tokens=16)
    assert from_cartridge.token_ids == from_text.token_ids
    assert "Biscuit" in from_cartridge.text
    unbatched = real_backend.answer_unbatched(cartridge, HISTORY, max_new_tokens=16)
    assert unbatched.token_ids == from_cartridge.token_ids
    assert from_cartridge.num_prompt_tokens > 30  # the conversation was fed, not only the last question


@pytest.mark.model
def test_it_samples_the_same_answer_for_the_same_seed(real_backend, cartridge):
    question = "Where does Lena live?"
    sampled = [real_backend.answer(cartridge, question, max_new_tokens=12, decoding=Decoding(temperature=1.5, seed=seed))
               for seed in (7, 7, 8, 9, 10)]
    assert sampled[0].token_ids == sampled[1].token_ids
    assert len({a.token_ids for a in sampled}) > 1  # other seeds, other answers
    text = real_backend.answer_from_text(MEMORIES, question, max_new_tokens=12, decoding=Decoding(temperature=1.5, seed=7))
    assert text.token_ids == sampled[0].token_ids
    greedy = real_backend.answer(cartridge, question, max_new_tokens=12)
    nucleus = real_backend.answer(cartridge, question, max_new_tokens=12, decoding=Decoding(temperature=1.0, top_p=1e-6, seed=3))
    assert nucleus.token_ids == greedy.token_ids  # a vanishing nucleus is the argmax


@pytest.mark.model
def test_it_ends_at_a_stop_string_and_reports_logprobs(real_backend, cartridge):
    question = "Where does Lena live?"
    greedy = real_backend.answer(cartridge, question, max_new_tokens=12)
    word = greedy.text.split()[1]
    stopped = real_backend.answer(cartridge, question, max_new_tokens=12, decoding=Decoding(stop=(word,)))
    assert stopped.text == greedy.text[: greedy.text.index(word)].strip() and stopped.finish_reason == "stop"
    assert len(stopped.token_ids) < len(greedy.token_ids)
    streamed = list(real_backend.answer_stream(cartridge, question, max_new_tokens=12, decoding=Decoding(stop=(word,))))
    assert "".join(d for d in streamed[:-1]).strip() == stopped.text
    scored = real_backend.answer(cartridge, question, max_new_tokens=12, decoding=Decoding(logprobs=True, top_logprobs=3))
    assert scored.token_ids == greedy.token_ids  # log-probs change nothing of the greedy answer
    assert len(scored.logprobs) == len(scored.token_ids) and all(len(e.top) == 3 for e in scored.logprobs)
    assert all(e.logprob <= 0 and e.top[0][1] == pytest.approx(e.logprob, abs=1e-5) for e in scored.logprobs)  # greedy = top 1
    one = real_backend.answer(cartridge, question, max_new_tokens=1)
    assert len(one.token_ids) == 1 and one.finish_reason == "length"


@pytest.mark.model
def test_it_answers_json_matching_a_schema(real_backend, cartridge):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    answer = real_backend.answer(cartridge, "Where does Lena live? Answer in JSON.", max_new_tokens=24,
                                 decoding=Decoding(json_schema=json.dumps(schema)))
    assert answer.finish_reason == "stop", answer.text
    assert isinstance(json.loads(answer.text)["city"], str)


def test_a_stop_watcher_holds_back_a_possible_stop_and_cuts_at_it():
    watcher = StopWatcher(("END",))
    assert watcher.feed("abc E") == "abc " and watcher.feed("N") == "" and watcher.feed("D more") == ""
    assert watcher.hit and watcher.text == "abc "
    other = StopWatcher(("END",))
    assert other.feed("x E") == "x " and other.feed("gg") == "Egg" and other.flush() == "" and not other.hit


@pytest.mark.parametrize("schema", [{"nullable": 5}, {"x-enum-varnames": 5}, {"discriminator": 5}, {"type": 5}])
def test_a_schema_the_json_constraint_cannot_take_is_an_engine_refusal(schema):
    from kvengine.errors import ConfigError
    from kvengine.sampling import JsonConstraint

    with pytest.raises(ConfigError, match="json_schema"):  # an engine refusal (400), never an unmapped error (500)
        JsonConstraint(object(), json.dumps(schema), set())
