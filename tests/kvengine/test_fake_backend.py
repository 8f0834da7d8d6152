"""FakeKvBackend: torch-free, deterministic, and honest about what it compiled."""
from __future__ import annotations

import subprocess
import sys

import pytest

from kvengine import make_backend
from kvengine.errors import (
    ConfigError,
    ContextTooLongError,
    CorruptCartridgeError,
    EmptyInputError,
    IncompatibleCartridgeError,
)
from kvengine.fake import UNKNOWN, FakeKvBackend
from kvengine.format import read_header

MEMORIES = ["Alice lives in Lisbon.", "Bob works as a baker in Porto.", "The launch code is in the blue folder."]


def test_it_does_not_import_torch():
    code = "import sys, kvengine; kvengine.make_backend('fake').compile(['x y']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_it_answers_from_a_compiled_memory():
    fake = make_backend("fake")
    cart = fake.compile(MEMORIES, log_head=3)
    assert fake.answer(cart, "Where does Alice live?").text == "Alice lives in Lisbon."
    assert fake.answer(cart, "What does Bob work as?").mode == "cartridge"


def test_it_streams_an_answer_a_word_at_a_time():
    backend = FakeKvBackend()
    cartridge = backend.compile(["The spare key is under the blue flower pot by the back door."])
    *deltas, final = backend.answer_stream(cartridge, "Where is the spare key?")
    assert len(deltas) > 3 and "".join(deltas).strip() == final.text == backend.answer(cartridge, "Where is the spare key?").text


def test_it_cannot_answer_about_a_memory_it_was_not_compiled_with():
    fake = make_backend("fake")
    cart = fake.compile(MEMORIES[1:])
    assert fake.answer(cart, "Where does Alice live?").text == UNKNOWN
    assert fake.answer_from_text(MEMORIES, "Where does Alice live?").text == "Alice lives in Lisbon."


def test_it_gives_the_same_answer_from_cartridge_and_text():
    fake = make_backend("fake")
    cart = fake.compile(MEMORIES)
    for q in ["Where is the launch code?", "Who is a baker?", "What is the weather?"]:
        assert fake.answer(cart, q).text == fake.answer_from_text(MEMORIES, q).text
    report = fake.fidelity(cart, MEMORIES, ["Where is the launch code?", "Who is a baker?"])
    assert report.top1_agreement == 1.0 and report.answers_identical == 1.0 and report.max_kl < 1e-9


def test_its_fidelity_notices_a_missing_memory():
    fake = make_backend("fake")
    report = fake.fidelity(fake.compile(MEMORIES[1:]), MEMORIES, ["Where does Alice live?"])
    assert report.answers_identical == 0.0 and report.mean_kl > 0.1


def test_it_round_trips_through_bytes_deterministically():
    fake = make_backend("fake")
    data = fake.dumps(fake.compile(MEMORIES, log_head=9, labels={"scope": "a"}))
    assert data == fake.dumps(fake.compile(MEMORIES, log_head=9, labels={"scope": "a"}))
    header = read_header(data)
    assert header.log_head == 9 and header.num_tokens == fake.count_tokens(MEMORIES) and header.labels == {"scope": "a"}
    loaded = fake.loads(data)
    assert loaded.header == fake.compile(MEMORIES, log_head=9, labels={"scope": "a"}).header
    assert fake.answer(loaded, "Where does Alice live?").text == "Alice lives in Lisbon."


def test_it_keeps_memory_text_out_of_the_header():
    fake = make_backend("fake")
    data = fake.dumps(fake.compile(MEMORIES))
    head_len = int.from_bytes(data[:8], "little")
    assert b"Lisbon" not in data[: 8 + head_len]


def test_it_refuses_a_cartridge_of_another_model_or_quant():
    data = FakeKvBackend(model="a").dumps(FakeKvBackend(model="a").compile(MEMORIES))
    with pytest.raises(IncompatibleCartridgeError, match="model_id"):
        FakeKvBackend(model="b").loads(data)
    with pytest.raises(IncompatibleCartridgeError, match="quant"):
        FakeKvBackend(model="a", quant="q4").loads(data)
    with pytest.raises(IncompatibleCartridgeError, match="quant"):
        FakeKvBackend(model="a", quant="q4").answer(FakeKvBackend(model="a").compile(MEMORIES), "Alice?")


def test_it_refuses_corrupt_and_truncated_files():
    fake = make_backend("fake")
    data = fake.dumps(fake.compile(MEMORIES))
    with pytest.raises(CorruptCartridgeError):
        fake.loads(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[-1] ^= 1
    with pytest.raises(CorruptCartridgeError, match="sha256"):
        fake.loads(bytes(flipped))


def test_it_refuses_bad_input_with_clear_errors():
    fake = FakeKvBackend(max_context_tokens=20)
    with pytest.raises(EmptyInputError, match="texts"):
        fake.compile([])
    with pytest.raises(EmptyInputError, match="texts"):
        fake.compile(["  "])
    with pytest.raises(EmptyInputError, match="question"):
        fake.answer(fake.compile(["a b"]), "  ")
    with pytest.raises(ContextTooLongError) as err:
        fake.compile(["word " * 50])
    assert err.value.limit == 20 and err.value.num_tokens > 20 and "20" in str(err.value)
    with pytest.raises(ConfigError, match="quant"):
        FakeKvBackend(quant="q3")
    with pytest.raises(ConfigError, match="backend"):
        make_backend("nope")
