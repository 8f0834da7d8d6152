"""Block ids compiled through the Django services on the transformers backend are keyed by the scope's secret.

The fake backend's oracle test (test_block_id_oracle.py) cannot see the transformers backend: its compile and
verify_extension take ``block_secret`` with an empty default (the engine's public ids, for benches and pinned bytes),
so a service that stopped passing it would store plain sha256 ids again without any fake-backend test noticing.
A tiny random-weight Qwen2 model (tests/kvengine/conftest.py builds it, offline) cut into 16-token blocks makes
the real backend's ids.
"""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.models import CartridgeVersionBlock
from cartridges.services import cartridge_activate, cartridge_compile, cartridge_evaluate
from cartridges.services.blocksecret import scope_block_secret
from kvengine import make_backend
from kvengine.blocks import chain, key_digest
from memories.services import memory_append
from tests.support.tiny_models import build_tiny

pytestmark = pytest.mark.django_db

MEMORIES = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot.",
            "The meeting with Carol is on Friday at three in the afternoon."]


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory):
    return make_backend("transformers", model=build_tiny(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2"), dtype="f32",
                        device="cpu", block_size=16)


@pytest.fixture
def tiny_engine(settings, tiny_backend):
    """The tiny model as the settings-default configuration (no operator switch row)."""
    config = ("transformers", tiny_backend.describe().model_id, "f32", "none")
    settings.MNESIO_KV_BACKEND, settings.MNESIO_KV_MODEL, settings.MNESIO_KV_DTYPE, settings.MNESIO_KV_QUANT = config
    engine.register_backend(config, tiny_backend)
    return tiny_backend


def _ids(version) -> list[str]:
    return [link.block.block_id for link in CartridgeVersionBlock.objects.filter(version=version).order_by("index").select_related("block")]


def _chain(backend, texts, *, secret: bytes) -> list[str]:
    layout = backend.layout
    ids = layout.encode(layout.prefix_text(layout.clean_memories(texts)))
    num_blocks = (len(ids) - len(layout.encode(layout.closing_text()))) // backend.block_size
    key = key_digest(backend.describe().compat_key())
    return [link for link, _ in chain(ids, num_blocks=num_blocks, block_size=backend.block_size, key=key, secret=secret)]


def test_it_keys_the_block_ids_it_compiles_by_the_scopes_secret(scope_a, scope_c, tiny_engine):
    versions = {}
    for scope in (scope_a, scope_c):  # the same memories in two scopes
        for text in MEMORIES:
            memory_append(scope=scope, content=text)
        versions[scope.pk] = cartridge_compile(scope=scope)
    a, c = _ids(versions[scope_a.pk]), _ids(versions[scope_c.pk])
    public = _chain(tiny_engine, MEMORIES, secret=b"")
    assert len(a) == len(public) >= 2  # several full blocks: the chain is long enough to say something
    assert not set(a) & set(public) and not set(c) & set(public)  # no id is the plain sha256 a guess can be checked against
    assert not set(a) & set(c)  # equal texts in two scopes: unrelated ids
    assert a == _chain(tiny_engine, MEMORIES, secret=scope_block_secret(scope=scope_a))


def test_the_incremental_gate_checks_the_chain_under_the_same_secret(scope_a, tiny_engine):
    for text in MEMORIES:
        memory_append(scope=scope_a, content=text)
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    memory_append(scope=scope_a, content="Dana's phone PIN is 4821.")
    version = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=version, gate="auto")  # the follow-up of a compile
    assert evaluation.figures["gate"] == "incremental", evaluation.figures
    assert evaluation.passed and evaluation.figures["incremental"]["chain_matches"], evaluation.reasons
