"""kvengine: compile memories into a model's KV state (cartridges) and answer from it.

Pure Python + torch/transformers; never imports Django, DRF or Celery.
"""
from __future__ import annotations

from .base import (
    Answer,
    BackendDescription,
    Cartridge,
    CartridgeHeader,
    FidelityReport,
    KvBackend,
)
from .config import ANSWER_MODES, BACKENDS, DTYPES, QUANTS, KvConfig, check_choice
from .errors import (
    ConfigError,
    ContextTooLongError,
    CorruptCartridgeError,
    EmptyInputError,
    IncompatibleCartridgeError,
    KvError,
    ModelUnavailableError,
)

__all__ = [
    "ANSWER_MODES", "BACKENDS", "DTYPES", "QUANTS", "KvConfig", "Answer", "BackendDescription", "Cartridge",
    "CartridgeHeader", "FidelityReport", "KvBackend", "ConfigError", "ContextTooLongError", "CorruptCartridgeError",
    "EmptyInputError", "IncompatibleCartridgeError", "KvError", "ModelUnavailableError", "make_backend",
]


def make_backend(name: str = "transformers", **options) -> KvBackend:
    """Build a backend by name, one of BACKENDS: "fake" (no torch) or "transformers" (any causal LM).

    Options for "transformers": model (default "smollm2-135m-instruct"), dtype, quant, device, cache_dir, block_size,
    compile_step (single-token steps through torch.compile, compiled.py).
    Options for "fake": model, dtype, quant.
    """
    check_choice("backend", name, BACKENDS)
    if name == "fake":
        from .fake import FakeKvBackend

        return FakeKvBackend(**options)
    from .transformers_backend import TransformersKvBackend  # imported here: the fake must not pull in torch

    return TransformersKvBackend(**options)
