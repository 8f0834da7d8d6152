"""The runtime KV configuration: validated switches; old cartridges stop serving; recompiles are queued."""
from __future__ import annotations

import pytest

from cartridges.jobs import kv_configuration_switch_enqueue
from cartridges.models import AnswerRecord, KvConfiguration
from cartridges.selectors import active_configuration, active_version, version_state
from cartridges.services import (
    NoActiveCartridge,
    cartridge_activate,
    cartridge_answer,
    cartridge_compile,
    kv_configuration_switch,
)
from core.errors import MnesioError

pytestmark = pytest.mark.django_db


def test_it_takes_the_configuration_from_settings_when_no_row_exists(fake_engine, settings):
    config = active_configuration()
    assert config.row is None and config.config.as_tuple() == fake_engine
    settings.MNESIO_KV_QUANT = "q8"
    assert active_configuration().quant == "q8"


@pytest.mark.parametrize(
    ("field", "value"),
    [("backend", "onnx"), ("model", "gpt-17"), ("dtype", "f64"), ("quant", "q3")],
)
def test_it_refuses_an_unknown_configuration_value_naming_the_field(db, field, value):
    values = {"backend": "fake", "model": "fake-model", "dtype": "f32", "quant": "none", field: value}
    with pytest.raises(MnesioError) as exc:
        kv_configuration_switch(**values, actor=None)
    assert exc.value.status_code == 400 and exc.value.extra["field"] == field
    assert f"`{field}` has to be one of" in exc.value.message and repr(value) in exc.value.message
    assert not KvConfiguration.objects.exists()


def test_it_stops_old_cartridges_and_queues_recompiles_on_a_switch(
    scope_a, scope_c, append, fake_engine, eager_tasks, django_capture_on_commit_callbacks, settings
):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_c, "The cat is called Miso.")
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        row = kv_configuration_switch_enqueue(backend="fake", model="fake-model", dtype="bf16", quant="q8", actor=None)
    assert active_configuration().row == row
    # the old cartridge no longer serves, before any recompile ran: the scope is read in memory under the new one
    assert active_version(scope=scope_a) is None and version_state(version=old) == "superseded"
    fresh = cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert fresh.version_id is None and fresh.num_memories_after_version == 1 and "flowerpot" in fresh.answer
    settings.MNESIO_FRESH_MAX_MEMORIES = 0  # no reading in memory: nothing serves until the recompile
    with pytest.raises(NoActiveCartridge) as exc:
        cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert "fake:fake-model:bf16:q8" in exc.value.message and exc.value.status_code == 409
    # the queued recompiles (compile -> evaluate -> activate on the gpu queue) run in-process here
    assert len(callbacks) == 2  # one compile per scope with memories, sent after the switch commits
    with django_capture_on_commit_callbacks(execute=True):
        for callback in callbacks:
            callback()
    for scope in (scope_a, scope_c):
        new = active_version(scope=scope)
        assert new is not None and (new.dtype, new.quant, new.configuration_id) == ("bf16", "q8", row.pk)
    answer = cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert "flowerpot" in answer.answer and answer.version_id == active_version(scope=scope_a).pk


def test_it_routes_compile_and_evaluate_to_the_gpu_queue():
    from cartridges.tasks import cartridge_activate_task, cartridge_compile_task, cartridge_evaluate_task
    from mnesio_site.celery import app

    def queue(task) -> str:
        return app.amqp.router.route({}, task.name, (), {}, task)["queue"].name

    assert queue(cartridge_compile_task) == "gpu" and queue(cartridge_evaluate_task) == "gpu"
    assert queue(cartridge_activate_task) == "default"
    assert cartridge_compile_task.acks_late and cartridge_compile_task.reject_on_worker_lost


def test_it_answers_by_re_reading_only_when_asked_and_says_so(scope_a, append, fake_engine):
    with pytest.raises(NoActiveCartridge):  # nothing to answer from
        cartridge_answer(scope=scope_a, question="Where is the spare key?")
    append(scope_a, "The spare key is under the blue flowerpot.")
    result = cartridge_answer(scope=scope_a, question="Where is the spare key?", mode="text")
    assert result.mode == "text" and result.version_id is None and "re-reading" in result.note
    assert "flowerpot" in result.answer
    record = AnswerRecord.objects.get()
    assert record.mode == "text" and record.version is None and record.total_s >= 0
    stored = [str(getattr(record, f.attname)) for f in AnswerRecord._meta.concrete_fields]
    assert not any("flowerpot" in v or "spare key" in v for v in stored)


@pytest.mark.parametrize(("kwargs", "field"), [({"question": "  "}, "question"), ({"mode": "psychic"}, "mode")])
def test_it_refuses_bad_answer_input_naming_the_field(scope_a, fake_engine, kwargs, field):
    values = {"question": "Where?", **kwargs}
    with pytest.raises(MnesioError) as exc:
        cartridge_answer(scope=scope_a, **values)
    assert exc.value.extra["field"] == field


def test_it_keeps_a_bounded_lru_of_loaded_cartridges(scope_a, append, fake_engine, settings):
    from cartridges import engine

    settings.MNESIO_CARTRIDGE_CACHE_SIZE = 1
    append(scope_a, "The spare key is under the blue flowerpot.")
    v1 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v1)
    cartridge_answer(scope=scope_a, question="Where is the spare key?")
    cartridge_answer(scope=scope_a, question="Where is the spare key?")
    info = engine.cache_info()
    assert info["cartridges_loaded"] == 1 and info["hits"] >= 1
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v2)
    cartridge_answer(scope=scope_a, question="Where is the car?")
    assert engine.cache_info()["cartridges_loaded"] == 1 and engine.cache_info()["evictions"] >= 1


def test_it_answers_a_sealed_request_through_the_task_and_forgets_it(scope_a, append, fake_engine, eager_tasks):
    from django.db import connection

    from cartridges.models import AnswerRequest
    from cartridges.services import answer_request_collect, answer_request_file
    from cartridges.tasks import cartridge_answer_task

    append(scope_a, "The spare key is under the blue flowerpot.")
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    request = answer_request_file(scope=scope_a, question="Where is the spare key hidden?")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {AnswerRequest._meta.db_table}")
        raw = repr(cursor.fetchall())
    assert "spare key" not in raw and "hidden" not in raw  # sealed at rest; the task gets only the id
    assert cartridge_answer_task.delay(request.pk).get()["ok"]
    result = answer_request_collect(answer_request=request)
    assert "flowerpot" in result.answer and result.version_id is not None
    assert not AnswerRequest.objects.exists()
    with pytest.raises(MnesioError) as exc:
        answer_request_collect(answer_request=request)
    assert exc.value.status_code == 404


def test_the_block_size_setting_reaches_every_transformers_backend_it_loads(monkeypatch, settings):
    """MNESIO_KV_BLOCK_SIZE is what a worker's engine cuts cartridges by (no model is loaded: make_backend is caught)."""
    from cartridges import engine
    from kvengine import KvConfig

    calls: list[tuple[str, dict]] = []

    def caught(name, **options):
        calls.append((name, options))
        return object()

    monkeypatch.setattr(engine, "make_backend", caught)
    monkeypatch.setattr(engine, "_backends", {})
    monkeypatch.setattr(engine, "_stats", dict(engine._stats))  # the two caught loads do not count as this process's
    settings.MNESIO_KV_BLOCK_SIZE = 256
    engine.backend_for(KvConfig("transformers", "some-model", "f32", "none"))
    engine.backend_for(KvConfig("fake", "fake-model", "f32", "none"))
    assert calls[0][0] == "transformers" and calls[0][1]["block_size"] == 256
    assert calls[1][0] == "fake" and "block_size" not in calls[1][1]  # the fake keeps its own
