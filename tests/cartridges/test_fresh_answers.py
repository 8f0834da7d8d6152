"""Fresh answers: memories appended after the serving version are read on top of its blocks, in memory.

The fake engine answers with the memory that best matches the question, so an answer naming a memory appended
after the version shows it was read; the real model's token-for-token equality with a version compiled at the
head is in test_fresh_answers_real_model.py.
"""
from __future__ import annotations

import pytest

from cartridges.models import AnswerRecord, BlobKey, CartridgeBlock, CartridgeVersion
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.services.stream import cartridge_answer_stream
from memories.services import memories_append_batch, memory_forget_file

pytestmark = pytest.mark.django_db

KEY = "The spare key is under the blue flowerpot."
TEA = "Ada drinks green tea every morning."
CAR = "The car is parked on level 3."
CODE = "The vault code is 4417."


def _served(scope, texts):
    memories_append_batch(scope=scope, items=[{"content": t} for t in texts])
    version = cartridge_compile(scope=scope)
    cartridge_activate(version=version)
    return version


def test_it_reads_memories_appended_after_the_version_and_stores_nothing(scope_a, fake_engine, append):
    version = _served(scope_a, [KEY, TEA])
    stored = (CartridgeVersion.objects.count(), CartridgeBlock.objects.count(), BlobKey.objects.count())
    append(scope_a, CAR)
    append(scope_a, CODE)

    result = cartridge_answer(scope=scope_a, question="Where is the car parked?")

    assert result.answer == CAR and result.version_id == version.pk
    assert (result.num_memories_after_version, result.num_memories_unread) == (2, 0)
    assert "2 memories appended after version" in result.note
    assert (CartridgeVersion.objects.count(), CartridgeBlock.objects.count(), BlobKey.objects.count()) == stored
    assert AnswerRecord.objects.get().version_id == version.pk


def test_it_says_nothing_when_the_version_is_at_the_head(scope_a, fake_engine):
    _served(scope_a, [KEY, TEA])
    result = cartridge_answer(scope=scope_a, question="What does Ada drink?")
    assert result.answer == TEA and (result.num_memories_after_version, result.num_memories_unread) == (0, 0)
    assert result.note == ""


def test_past_the_bound_the_version_answers_alone_and_says_how_many_it_did_not_read(scope_a, fake_engine, append, settings):
    settings.MNESIO_FRESH_MAX_MEMORIES = 1
    version = _served(scope_a, [KEY, TEA])
    append(scope_a, CAR)
    append(scope_a, CODE)

    result = cartridge_answer(scope=scope_a, question="Where is the car parked?")

    assert result.answer != CAR and result.version_id == version.pk
    assert (result.num_memories_after_version, result.num_memories_unread) == (0, 2)
    assert "without the 2 memories appended after it" in result.note and "MNESIO_FRESH_MAX_MEMORIES=1" in result.note


def test_it_never_reads_a_forgotten_memory_appended_after_the_version(scope_a, fake_engine, append):
    _served(scope_a, [KEY, TEA])
    append(scope_a, CAR)
    secret = append(scope_a, CODE)
    memory_forget_file(scope=scope_a, seq=secret.seq, requested_by=None)  # shreds its key; no version holds it

    result = cartridge_answer(scope=scope_a, question="What is the vault code?")

    assert "4417" not in result.answer and result.num_memories_after_version == 1


def test_the_streamed_answer_reads_them_too(scope_a, fake_engine, append):
    version = _served(scope_a, [KEY, TEA])
    append(scope_a, CAR)
    items = list(cartridge_answer_stream(scope=scope_a, question="Where is the car parked?"))
    result = items[-1]
    assert "".join(items[:-1]).strip() == CAR == result.answer
    assert result.version_id == version.pk and result.num_memories_after_version == 1


def test_a_question_answered_by_a_worker_carries_the_count_through_its_sealed_answer(scope_a, fake_engine, append):
    from cartridges.services import answer_request_answer, answer_request_collect, answer_request_file

    _served(scope_a, [KEY, TEA])
    append(scope_a, CAR)
    request = answer_request_answer(answer_request=answer_request_file(scope=scope_a, question="Where is the car parked?"))
    result = answer_request_collect(answer_request=request)
    assert result.answer == CAR and result.num_memories_after_version == 1


def test_an_ask_that_finds_every_fresh_compile_slot_taken_is_answered_by_its_version_alone(scope_a, fake_engine, append):
    # each fresh compile holds a private KV copy for its whole answer: a burst of asks on a stale scope must not
    # make one copy each (MNESIO_FRESH_MAX_CONCURRENT, 1 by default)
    from cartridges.services import serving

    version = _served(scope_a, [KEY, TEA])
    append(scope_a, CAR)
    assert serving._fresh_slot_take()  # another ask's fresh compile is running
    try:
        result = cartridge_answer(scope=scope_a, question="Where is the car parked?")
    finally:
        serving._fresh_slot_give()
    assert result.version_id == version.pk and result.answer != CAR
    assert (result.num_memories_after_version, result.num_memories_unread) == (0, 1)
    assert "MNESIO_FRESH_MAX_CONCURRENT" in result.note
    again = cartridge_answer(scope=scope_a, question="Where is the car parked?")  # the slot is free again
    assert again.answer == CAR and again.num_memories_after_version == 1


def test_a_scope_without_a_version_is_read_whole_in_memory_and_stores_nothing(scope_a, fake_engine, append):
    append(scope_a, KEY)
    append(scope_a, CAR)

    result = cartridge_answer(scope=scope_a, question="Where is the car parked?")

    assert result.answer == CAR and result.version_id is None and result.mode == "cartridge"
    assert (result.num_memories_after_version, result.num_memories_unread) == (2, 0)
    assert (CartridgeVersion.objects.count(), CartridgeBlock.objects.count(), BlobKey.objects.count()) == (0, 0, 0)
    assert AnswerRecord.objects.get().version_id is None
    items = list(cartridge_answer_stream(scope=scope_a, question="Where is the spare key?"))
    assert "".join(items[:-1]).strip() == KEY == items[-1].answer and items[-1].num_memories_after_version == 2


def test_a_scope_without_a_version_never_reads_a_forgotten_memory(scope_a, fake_engine, append):
    from cartridges.services import NoActiveCartridge

    car = append(scope_a, CAR)
    secret = append(scope_a, CODE)
    memory_forget_file(scope=scope_a, seq=secret.seq, requested_by=None)

    result = cartridge_answer(scope=scope_a, question="What is the vault code?")

    assert "4417" not in result.answer and result.num_memories_after_version == 1
    memory_forget_file(scope=scope_a, seq=car.seq, requested_by=None)
    with pytest.raises(NoActiveCartridge) as caught:  # every memory forgotten: nothing to answer from
        cartridge_answer(scope=scope_a, question="Where is the car parked?")
    assert "forgotten" in caught.value.message and caught.value.status_code == 409


def test_a_scope_without_a_version_that_finds_the_fresh_slots_taken_is_told_to_retry(scope_a, fake_engine, append):
    from cartridges.services import serving

    append(scope_a, CAR)
    assert serving._fresh_slot_take()  # another ask's fresh compile is running; there is no version to fall back on
    try:
        with pytest.raises(serving.FreshCompilesBusy) as caught:
            cartridge_answer(scope=scope_a, question="Where is the car parked?")
    finally:
        serving._fresh_slot_give()
    assert caught.value.status_code == 429 and caught.value.retry_after_s >= 1
    assert "MNESIO_FRESH_MAX_CONCURRENT" in caught.value.message
    assert cartridge_answer(scope=scope_a, question="Where is the car parked?").answer == CAR  # the slot is free again
