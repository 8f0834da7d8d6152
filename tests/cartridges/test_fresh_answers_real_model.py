"""A fresh answer on the real default model is the answer of the version the refresh will compile at the head."""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.selectors import active_configuration
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.services.serving import cartridge_serving

pytestmark = [pytest.mark.django_db, pytest.mark.model]

OLD = [
    "The office wifi password is tulip, and the guest network has no password at all.",
    "The team lunch is on Friday at noon in the small room on the second floor, next to the kitchen.",
    "Ada drinks green tea every morning before the stand-up meeting and black coffee after lunch.",
    "The printer on the third floor jams when it prints on both sides; use the one by the lifts instead.",
]
NEW = ["Dana's locker code is 4417.", "The car is parked on level 3 of the north garage."]
QUESTION = "What is Dana's locker code?"


def test_the_fresh_answer_is_token_for_token_the_answer_of_a_version_compiled_at_the_head(scope_a, append, real_engine, settings):
    settings.MNESIO_GATE_NUM_AUTO_PROBES = 2  # short decodes keep the gate cheap on a shared CPU
    settings.MNESIO_GATE_MAX_NEW_TOKENS = 8
    settings.MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = 4
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 12
    for text in OLD:
        append(scope_a, text)
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    for text in NEW:
        append(scope_a, text)

    config = active_configuration()
    serving = cartridge_serving(scope=scope_a, config=config)
    fresh = cartridge_answer(scope=scope_a, question=QUESTION)
    at_head = cartridge_compile(scope=scope_a)  # what the refresh compiles (not activated: the fresh path still runs)
    compiled, backend = engine.cartridge_load(version=at_head, config=config)

    assert serving.num_memories_after_version == 2 and serving.cartridge.stats["blocks_reused"] >= 1
    assert backend.dump_parts(serving.cartridge).digest == at_head.sha256  # the same bytes as the stored version
    expected = backend.answer(compiled, QUESTION, max_new_tokens=12)
    assert backend.answer(serving.cartridge, QUESTION, max_new_tokens=12).token_ids == expected.token_ids
    assert fresh.answer == expected.text and "4417" in fresh.answer, fresh.answer
    assert fresh.version_id == version.pk and fresh.num_memories_after_version == 2


def test_a_scope_without_a_version_answers_what_a_version_compiled_at_its_head_answers(scope_a, append, real_engine, settings):
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 12
    for text in NEW:
        append(scope_a, text)

    config = active_configuration()
    serving = cartridge_serving(scope=scope_a, config=config)
    fresh = cartridge_answer(scope=scope_a, question=QUESTION)
    at_head = cartridge_compile(scope=scope_a)  # what the first refresh compiles (not activated)
    compiled, backend = engine.cartridge_load(version=at_head, config=config)

    assert serving.version is None and serving.num_memories_after_version == 2
    assert backend.dump_parts(serving.cartridge).digest == at_head.sha256  # the same bytes as the stored version
    expected = backend.answer(compiled, QUESTION, max_new_tokens=12)
    assert fresh.answer == expected.text and "4417" in fresh.answer, fresh.answer
    assert fresh.version_id is None and fresh.num_memories_after_version == 2
