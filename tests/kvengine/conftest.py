"""Tiny random-weight models (GPT-2 and Qwen2 code paths) built and saved in the test, fully offline; the real
model in other block sizes; the cartridges the batched-decoding tests share; the fused kernels' library."""
from __future__ import annotations

import pytest

from tests.support.batching import MEMORIES, OTHER_MEMORIES
from tests.support.cpu import AVX512F
from tests.support.tiny_models import build_tiny


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: arch -> directory of a saved tiny random model (built once per arch per session)."""
    built: dict[str, str] = {}

    def make(arch: str) -> str:
        if arch not in built:
            built[arch] = build_tiny(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return built[arch]

    return make


@pytest.fixture(scope="module")
def small_blocks(real_backend):
    """The real model in 16-token blocks (short contexts still span several blocks), sharing its weights."""
    return real_backend.variant(block_size=16)


@pytest.fixture(scope="module")
def long_blocks(real_backend):
    """The real model in 256-token blocks (the default is 64): a ~190-token log is one tail part."""
    return real_backend.variant(block_size=256)


@pytest.fixture(scope="module")
def cartridges(real_backend):
    """Two cartridges of the real model for the batched-decoding tests (test_batching*.py): MEMORIES, OTHER_MEMORIES."""
    return real_backend.compile(MEMORIES), real_backend.compile(OTHER_MEMORIES)


@pytest.fixture(scope="module")
def kernel():
    """The fused kernels' library, which must build and load on a CPU with AVX-512F (a failed build is a failure, not
    a skip)."""
    from kvengine import fused

    if not AVX512F:
        pytest.skip("this CPU lacks AVX-512F: torch's kernels serve (test_unavailable_kernel_leaves_the_flash_kernel)")
    lib = fused.kernel()
    assert lib is not None, "the fused kernel did not build or load (see the kvengine.fused warning)"
    return lib
