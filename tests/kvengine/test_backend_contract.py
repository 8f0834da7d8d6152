"""Both backends implement the whole KvBackend contract with its signatures, so callers never probe them."""
from __future__ import annotations

import inspect

import pytest

from kvengine import KvBackend
from kvengine.fake import FakeKvBackend

CONTRACT = sorted(
    name for name, member in vars(KvBackend).items() if callable(member) and not name.startswith("_")
)


def _concrete_backends() -> list[type[KvBackend]]:
    from kvengine.transformers_backend import TransformersKvBackend

    return [FakeKvBackend, TransformersKvBackend]


def test_the_contract_declares_every_method_the_apps_call():
    assert CONTRACT == sorted([
        "answer", "answer_choices", "answer_from_text", "answer_stream", "compile", "count_tokens", "describe", "dump_parts", "dumps", "fidelity", "load_parts",
        "loads", "variant", "verify_extension",
    ])
    fidelity = inspect.signature(KvBackend.fidelity).parameters["max_new_tokens"]
    assert fidelity.kind is inspect.Parameter.KEYWORD_ONLY and fidelity.default is None
    variant = inspect.signature(KvBackend.variant)
    assert [p.kind for p in list(variant.parameters.values())[1:]] == [inspect.Parameter.KEYWORD_ONLY] * 2
    assert KvBackend.variant(FakeKvBackend()) is None  # the default: cannot share weights, load a new backend


@pytest.mark.parametrize("backend_class", _concrete_backends(), ids=lambda cls: cls.__name__)
def test_each_backend_implements_the_contract_with_its_signatures(backend_class):
    assert not inspect.isabstract(backend_class)
    for name in CONTRACT:
        assert getattr(backend_class, name) is not getattr(KvBackend, name), f"{backend_class.__name__} lacks {name}"
        declared = list(inspect.signature(getattr(KvBackend, name)).parameters.values())
        implemented = list(inspect.signature(getattr(backend_class, name)).parameters.values())
        # the contract's parameters first, as declared (name, kind, default, annotation) ...
        assert implemented[: len(declared)] == declared, f"{backend_class.__name__}.{name}"
        # ... then only optional keyword-only extras (e.g. stop_at_eos), which no contract caller passes
        for extra in implemented[len(declared):]:
            assert extra.kind is inspect.Parameter.KEYWORD_ONLY and extra.default is not inspect.Parameter.empty, (
                f"{backend_class.__name__}.{name} adds the required parameter {extra.name!r}"
            )


def test_the_fake_makes_variants_and_honours_the_fidelity_length():
    fake = FakeKvBackend(model="fake-model")
    q8 = fake.variant(quant="q8")
    assert q8.describe().config.key == "fake:fake-model:f32:q8" and fake.describe().quant == "none"
    memories = ["Alice lives in Lisbon and bakes bread.", "Alice lives in Porto now and paints."]
    cartridge = fake.compile(memories[:1])
    # cartridge and text pick different memories that share their first three words
    assert fake.fidelity(cartridge, memories, ["Where does Alice live now?"]).answers_identical == 0.0
    assert fake.fidelity(cartridge, memories, ["Where does Alice live now?"], max_new_tokens=3).answers_identical == 1.0
