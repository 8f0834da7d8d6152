"""kvengine: compile memories into a model's KV state (cartridges) and answer from it.

Pure Python + torch/transformers; never imports Django, DRF or Celery.
"""
from __future__ import annotations

from .base import (
    DTYPES,
    QUANTS,
    Answer,
    BackendDescription,
    Cartridge,
    CartridgeHeader,
    FidelityReport,
    KvBackend,
)
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
    "DTYPES", "QUANTS", "Answer", "BackendDescription", "Cartridge", "CartridgeHeader", "FidelityReport",
    "KvBackend", "ConfigError", "ContextTooLongError", "CorruptCartridgeError", "EmptyInputError",
    "IncompatibleCartridgeError", "KvError", "ModelUnavailableError", "make_backend",
]


def make_backend(name: str = "transformers", **options) -> KvBackend:
    """Build a backend by name: "fake" (no torch) or "transformers" (any causal LM).

    Options for "transformers": model (default "smollm2-135m-instruct"), dtype, quant, device, cache_dir.
    Options for "fake": model, dtype, quant.
    """
    if name == "fake":
        from .fake import FakeKvBackend

        return FakeKvBackend(**options)
    if name == "transformers":
        from .transformers_backend import TransformersKvBackend

        return TransformersKvBackend(**options)
    raise ConfigError(f"`backend` has to be one of ['fake', 'transformers'] but got {name!r}")
