"""The routed layout on the Django side (fake engine): the layout setting, chunks compiled once and sealed under
their memory's key, asks over the window answered from retrieved chunks, every erasure kind destroying exactly
the erased memories' chunks, and another user or scope getting nothing of them."""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.chunk_cache import routed_chunk_cache_stats
from cartridges.models import Layout, RoutedChunk
from cartridges.selectors import scope_settings_get
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.services.routed_answer import scope_layout
from cartridges.services.routed_chunks import (
    chunk_aad,
    routed_chunks_compile,
    routed_chunks_open,
)
from cartridges.services.scope_settings import scope_settings_update
from core.errors import MnesioError
from kvengine.fake import FakeKvBackend
from memories import crypto
from memories.models import Memory
from memories.selectors import memory_own_keys, scope_memories
from memories.services import (
    erasure_request_file,
    erasure_request_process,
    memory_append,
    memory_forget_file,
    scope_delete_file,
)

pytestmark = pytest.mark.django_db

CONFIG = ("fake", "fake-model", "f32", "none")
MARKER = "quokka-vault-5521"


@pytest.fixture
def small_window(fake_engine):
    """The fake with a 60-token window, so a scope of a dozen memories passes it."""
    engine.register_backend(CONFIG, FakeKvBackend(max_context_tokens=60))
    yield CONFIG
    engine.register_backend(CONFIG, FakeKvBackend())  # backends outlive a test: the next one gets the default window


def _fill(scope, *, secret_subject: str | None = None) -> Memory:
    for i in range(6):
        memory_append(scope=scope, content=f"Locker {i} holds the spare item number {i * 7} today.")
    secret = memory_append(scope=scope, content=f"The vault code is {MARKER}.", subject=secret_subject)
    for i in range(6, 10):
        memory_append(scope=scope, content=f"Locker {i} holds the spare item number {i * 7} today.")
    return secret


def test_it_defaults_to_auto_and_changes_the_layout_as_a_new_settings_row(scope_a, fake_engine):
    assert scope_settings_get(scope=scope_a).layout == Layout.AUTO
    scope_settings_update(scope=scope_a, layout="routed")
    scope_settings_update(scope=scope_a, keep_previous_versions=2)  # another field keeps the layout
    assert scope_settings_get(scope=scope_a).layout == Layout.ROUTED
    with pytest.raises(MnesioError) as refused:
        scope_settings_update(scope=scope_a, layout="sideways")
    assert refused.value.extra == {"field": "layout"}


def test_it_answers_a_scope_over_the_window_from_its_chunks_when_auto(scope_a, small_window):
    secret = _fill(scope_a)
    assert scope_layout(scope=scope_a, config=CONFIG) == Layout.ROUTED  # no prefix cartridge can hold it
    result = cartridge_answer(scope=scope_a, question="What is the vault code?")
    assert MARKER in result.answer
    assert result.layout == "routed" and result.mode == "cartridge"
    assert secret.seq in result.memory_seqs and result.memory_seqs == sorted(result.memory_seqs)


def test_it_keeps_the_prefix_cartridge_while_it_serves_an_auto_scope(scope_a, fake_engine):
    memory_append(scope=scope_a, content=f"The vault code is {MARKER}.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    result = cartridge_answer(scope=scope_a, question="What is the vault code?")
    assert result.layout == "prefix" and result.version_id is not None
    assert not RoutedChunk.objects.filter(scope=scope_a).exists()


def test_it_compiles_each_chunk_once_and_an_append_adds_only_its_own(scope_a, fake_engine):
    scope_settings_update(scope=scope_a, layout="routed")
    _fill(scope_a)
    assert routed_chunks_compile(scope=scope_a, config=CONFIG) == 11
    before = {row.memory_id: bytes(row.sealed) for row in RoutedChunk.objects.filter(scope=scope_a)}
    assert routed_chunks_compile(scope=scope_a, config=CONFIG) == 0
    memory_append(scope=scope_a, content="The boat is called Marigold.")
    result = cartridge_answer(scope=scope_a, question="What is the boat called?")
    assert "Marigold" in result.answer
    after = {row.memory_id: bytes(row.sealed) for row in RoutedChunk.objects.filter(scope=scope_a)}
    assert len(after) == 12 and {k: after[k] for k in before} == before
    assert set(RoutedChunk.objects.filter(scope=scope_a).values_list("quant", flat=True)) == {"q8"}


def test_it_seals_a_chunk_under_its_memorys_key_and_its_place(scope_a, fake_engine):
    scope_settings_update(scope=scope_a, layout="routed")
    secret = _fill(scope_a)
    routed_chunks_compile(scope=scope_a, config=CONFIG)
    row = RoutedChunk.objects.get(memory=secret)
    assert MARKER.encode() not in bytes(row.sealed)
    key = memory_own_keys(scope_memories(scope=scope_a).filter(seq=secret.seq))[secret.seq]
    opened = crypto.open_box(key, row.sealed, aad=chunk_aad(seq=secret.seq, scope_id=scope_a.pk, config_key=row.config_key))
    assert MARKER.encode() in opened
    with pytest.raises(crypto.InvalidTag):  # the same bytes claimed for another memory do not open
        crypto.open_box(key, row.sealed, aad=chunk_aad(seq=secret.seq + 1, scope_id=scope_a.pk, config_key=row.config_key))


@pytest.mark.parametrize("kind", ["subject", "memory", "scope"])
def test_it_destroys_only_the_erased_memories_chunks_for_every_erasure_kind(scope_a, fake_engine, kind):
    scope_settings_update(scope=scope_a, layout="routed")
    secret = _fill(scope_a, secret_subject="dana" if kind == "subject" else None)
    routed_chunks_compile(scope=scope_a, config=CONFIG)
    seqs = list(scope_memories(scope=scope_a).values_list("seq", flat=True))
    assert secret.seq in routed_chunks_open(scope=scope_a, config=CONFIG, seqs=seqs)  # opened: held by the LRU
    held = routed_chunk_cache_stats()["size"]
    sealed = bytes(RoutedChunk.objects.get(memory=secret).sealed)
    others = {row.pk: bytes(row.sealed) for row in RoutedChunk.objects.filter(scope=scope_a).exclude(memory=secret)}

    if kind == "subject":
        request = erasure_request_file(subject="dana", scope=scope_a, requested_by=None, reason="asked")
    elif kind == "memory":
        request = memory_forget_file(scope=scope_a, seq=secret.seq, requested_by=None, reason="asked")
    else:
        request = scope_delete_file(scope=scope_a, requested_by=None, reason="retired")
    erasure_request_process(erasure_request=request)

    assert not RoutedChunk.objects.filter(memory=secret).exists()
    assert secret.seq not in memory_own_keys(scope_memories(scope=scope_a))  # the key the copied bytes need is gone
    assert MARKER.encode() not in sealed
    if kind == "scope":
        assert not RoutedChunk.objects.filter(scope=scope_a).exists()
        assert routed_chunk_cache_stats()["size"] == held - 11
    else:
        assert {row.pk: bytes(row.sealed) for row in RoutedChunk.objects.filter(scope=scope_a)} == others
        assert routed_chunk_cache_stats()["size"] == held - 1
        opened = routed_chunks_open(scope=scope_a, config=CONFIG, seqs=seqs)
        assert secret.seq not in opened and len(opened) == 10
        result = cartridge_answer(scope=scope_a, question="What is the vault code?")
        assert MARKER not in result.answer and secret.seq not in result.memory_seqs


def test_it_keys_chunk_ids_per_scope(scope_a, scope_c, fake_engine):
    for scope in (scope_a, scope_c):
        scope_settings_update(scope=scope, layout="routed")
        memory_append(scope=scope, content=f"The vault code is {MARKER}.")
        routed_chunks_compile(scope=scope, config=CONFIG)
    ids = [RoutedChunk.objects.get(scope=scope).chunk_id for scope in (scope_a, scope_c)]
    assert len(set(ids)) == 2 and all(len(i) == 64 for i in ids)


def test_it_never_opens_another_scopes_chunks(scope_a, scope_c, fake_engine):
    scope_settings_update(scope=scope_a, layout="routed")
    secret = _fill(scope_a)
    routed_chunks_compile(scope=scope_a, config=CONFIG)
    assert routed_chunks_open(scope=scope_c, config=CONFIG, seqs=[secret.seq]) == {}


def test_it_compiles_an_appended_memorys_chunk_after_the_append_commits(scope_a, fake_engine, eager_tasks, django_capture_on_commit_callbacks):
    scope_settings_update(scope=scope_a, layout="routed")
    with django_capture_on_commit_callbacks(execute=True):
        first = memory_append(scope=scope_a, content="The boat is called Marigold.")
    before = bytes(RoutedChunk.objects.get(memory=first).sealed)
    with django_capture_on_commit_callbacks(execute=True):
        second = memory_append(scope=scope_a, content="The kite is red.")
    assert RoutedChunk.objects.filter(scope=scope_a).count() == 2 and RoutedChunk.objects.filter(memory=second).exists()
    assert bytes(RoutedChunk.objects.get(memory=first).sealed) == before


def test_it_compiles_no_chunk_on_append_for_a_scope_not_set_to_routed(scope_a, fake_engine, eager_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        memory_append(scope=scope_a, content="The boat is called Marigold.")
    assert not RoutedChunk.objects.filter(scope=scope_a).exists()


def test_the_routed_gate_passes_the_fakes_exact_chunks_and_names_its_figures(scope_a, fake_engine):
    from cartridges.services import evaluation_case_add
    from cartridges.services.routed_gate import routed_gate_check

    scope_settings_update(scope=scope_a, layout="routed")
    _fill(scope_a)
    evaluation_case_add(scope=scope_a, question="What is the vault code?", answers=[MARKER])
    result = routed_gate_check(scope=scope_a, config=CONFIG)
    assert result.passed and result.repair == "full"
    assert result.figures["num_cases"] == 1 and result.figures["accuracy"] == {"routed": 1.0, "reread": 1.0}
    assert MARKER not in repr(result.figures)


def test_it_decides_auto_from_the_stored_chunks_without_opening_the_memories_once_they_pass_the_window(
    scope_a, small_window, monkeypatch
):
    from cartridges.services import routed_answer

    _fill(scope_a)
    routed_chunks_compile(scope=scope_a, config=CONFIG)

    def refuse(**_):
        raise AssertionError("every memory opened to count the scope's tokens")

    monkeypatch.setattr(routed_answer, "scope_memories_open", refuse)
    assert scope_layout(scope=scope_a, config=CONFIG) == Layout.ROUTED


def test_it_refuses_a_routed_question_with_no_word_naming_the_question(scope_a, fake_engine):
    from cartridges.services.errors import NothingToCompile

    scope_settings_update(scope=scope_a, layout="routed")
    _fill(scope_a)
    with pytest.raises(NothingToCompile) as refused:
        cartridge_answer(scope=scope_a, question="???")
    assert refused.value.extra == {"field": "question"}


def _erase(kind: str, scope, secret):
    if kind == "subject":
        request = erasure_request_file(subject="dana", scope=scope, requested_by=None, reason="asked")
    elif kind == "memory":
        request = memory_forget_file(scope=scope, seq=secret.seq, requested_by=None, reason="asked")
    else:
        request = scope_delete_file(scope=scope, requested_by=None, reason="retired")
    erasure_request_process(erasure_request=request)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["subject", "memory", "scope"])
def test_it_stores_no_chunk_of_a_memory_erased_while_its_chunk_compiles(scope_a, fake_engine, monkeypatch, kind):
    from cartridges.models import ScopeBlockSecret

    scope_settings_update(scope=scope_a, layout="routed")
    secret = _fill(scope_a, secret_subject="dana" if kind == "subject" else None)
    backend = engine.backend_for(CONFIG)
    compile_chunk = backend.compile_chunk
    erased = []

    def compile_then_erase(text):
        chunk = compile_chunk(text)
        if MARKER in text and not erased:  # the keys were read; the erasure commits and destroys no row yet
            erased.append(_erase(kind, scope_a, secret))
        return chunk

    monkeypatch.setattr(backend, "compile_chunk", compile_then_erase)
    routed_chunks_compile(scope=scope_a, config=CONFIG)
    assert erased
    assert not RoutedChunk.objects.filter(memory=secret).exists()
    if kind == "scope":  # nothing of a deleted scope is stored after its erasure, its block secret included
        assert not RoutedChunk.objects.filter(scope=scope_a).exists()
        monkeypatch.setattr(backend, "compile_chunk", compile_chunk)
        from cartridges.tasks import routed_chunks_compile_task

        assert routed_chunks_compile_task.run(scope_a.pk)["made"] == 0
        assert not ScopeBlockSecret.objects.filter(scope_id=scope_a.pk).exists()
    else:
        assert RoutedChunk.objects.filter(scope=scope_a).count() == 10
