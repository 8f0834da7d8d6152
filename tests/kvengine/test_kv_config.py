"""The engine's vocabulary and KvConfig: one frozen type, one key (byte-stable: the database stores it)."""
from __future__ import annotations

import dataclasses

import pytest

import kvengine
from kvengine import ANSWER_MODES, BACKENDS, DTYPES, QUANTS, ConfigError, KvConfig


def test_the_vocabulary_is_defined_once_and_re_exported():
    from kvengine import base, config

    assert (BACKENDS, DTYPES, QUANTS, ANSWER_MODES) == (
        ("fake", "transformers"), ("f32", "bf16", "f16", "bf16r", "f32w8", "bf16w8"), ("none", "q8", "q4"), ("cartridge", "text"),
    )
    assert base.DTYPES is config.DTYPES and base.QUANTS is config.QUANTS  # older imports keep working


def test_its_key_is_the_stored_backend_model_dtype_quant_string():
    config = KvConfig(backend="transformers", model="smollm2-135m-instruct", dtype="f32", quant="q8")
    assert config.key == "transformers:smollm2-135m-instruct:f32:q8"
    assert config.as_tuple() == ("transformers", "smollm2-135m-instruct", "f32", "q8")
    assert KvConfig.from_key(config.key) == config


def test_a_model_with_colons_round_trips_through_its_key():
    config = KvConfig(backend="transformers", model="C:/models/qwen2:latest", dtype="bf16", quant="none")
    assert KvConfig.from_key(config.key) == config


def test_it_is_frozen_and_hashable():
    config = KvConfig(backend="fake", model="fake-model", dtype="f32", quant="none")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.quant = "q4"  # type: ignore[misc]
    assert {config: 1}[KvConfig.from_key("fake:fake-model:f32:none")] == 1


@pytest.mark.parametrize(("field", "value", "message"), [
    ("backend", "vllm", "`backend` has to be one of ['fake', 'transformers'] but got 'vllm'"),
    ("dtype", "f64", "`dtype` has to be one of ['f32', 'bf16', 'f16', 'bf16r', 'f32w8', 'bf16w8'] but got 'f64'"),
    ("quant", "q3", "`quant` has to be one of ['none', 'q8', 'q4'] but got 'q3'"),
    ("model", "", "`model` has to be a non-empty string but got ''"),
])
def test_it_names_the_field_the_allowed_values_and_what_it_got(field, value, message):
    options = {"backend": "fake", "model": "fake-model", "dtype": "f32", "quant": "none", field: value}
    with pytest.raises(ConfigError) as exc:
        KvConfig(**options)
    assert str(exc.value) == message


def test_it_refuses_a_key_without_four_fields():
    with pytest.raises(ConfigError, match="`key` has to look like 'backend:model:dtype:quant' but got 'fake:f32'"):
        KvConfig.from_key("fake:f32")
    with pytest.raises(ConfigError, match="`quant`"):
        KvConfig.from_key("fake:fake-model:f32:q3")


def test_a_backend_describes_its_configuration_and_make_backend_names_unknown_backends():
    backend = kvengine.make_backend("fake", model="fake-model", quant="q8")
    assert backend.describe().config.key == "fake:fake-model:f32:q8"
    with pytest.raises(ConfigError, match=r"`backend` has to be one of \['fake', 'transformers'\] but got 'vllm'"):
        kvengine.make_backend("vllm")
