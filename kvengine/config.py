"""The engine's vocabulary: backends, precisions, quantizations, answer modes, and one KV configuration type.

Each is defined here once; the backends, kveval and the Django apps import them instead of keeping copies
that could drift apart. ``KvConfig.key`` is the one string form of a configuration: it is stored in the
database (cartridge versions, evaluations), so its format is fixed.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path

from .errors import ConfigError

BACKENDS = ("fake", "transformers")  # "transformers" runs a causal LM; "fake" is the torch-free stand-in for tests
# precision of weights and KV; bf16r: bf16 with an f32 residual stream; f32w8: f32 KV and activations with weight-only
# int8 linear layers; bf16w8: the same int8 layers and f32 residual stream over bf16 KV (precision.py)
DTYPES = ("f32", "bf16", "f16", "bf16r", "f32w8", "bf16w8")
# The precision each dtype serves the linear layers' weights in. A dtype names weights and KV together, so the weights'
# precision is part of the compatibility key (and of KvConfig.key) through the dtype: an f32w8 cartridge is never
# served by f32 weights, nor an f32 one by int8 weights.
WEIGHT_PRECISIONS = {"f32": "f32", "bf16": "bf16", "f16": "f16", "bf16r": "bf16", "f32w8": "int8", "bf16w8": "int8"}
QUANTS = ("none", "q8", "q4")  # how a stored cartridge's KV state is quantized (kvengine.quant)
CHUNK_QUANTS = ("none", "q8")  # how a routed chunk's KV is stored (routed/chunk_bytes.py)
ANSWER_MODES = ("cartridge", "text")  # answer from the compiled cartridge, or re-read the memories as text


def check_choice(name: str, value: object, allowed: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``allowed``; else raise ConfigError naming the option and its values."""
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"`{name}` has to be one of {list(allowed)} but got {value!r}")
    return value


@dataclass(frozen=True)
class KvConfig:
    """Which backend serves which model in which precision: what a cartridge is compiled for.

    Validated on construction, so a KvConfig in hand is always one the engine can be asked for.
    """

    backend: str  # one of BACKENDS
    model: str  # a model id ("smollm2-135m-instruct", a hub id) or a local model directory; may contain ":"
    dtype: str  # one of DTYPES
    quant: str  # one of QUANTS

    def __post_init__(self) -> None:
        check_choice("backend", self.backend, BACKENDS)
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"`model` has to be a non-empty string but got {self.model!r}")
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("quant", self.quant, QUANTS)

    @property
    def weights(self) -> str:
        """The precision the linear layers' weights are served in (WEIGHT_PRECISIONS): "f32", "bf16", "f16" or "int8"."""
        return WEIGHT_PRECISIONS[self.dtype]

    @property
    def key(self) -> str:
        """``"backend:model:dtype:quant"``: the one string form, stored in the database (keep it byte-stable)."""
        return ":".join(self.as_tuple())

    def as_tuple(self) -> tuple[str, str, str, str]:
        """``(backend, model, dtype, quant)``."""
        return astuple(self)

    @classmethod
    def from_key(cls, key: str) -> KvConfig:
        """Parse ``key`` back; the model is everything between the backend and the last two fields."""
        if not isinstance(key, str) or key.count(":") < 3:
            raise ConfigError(f"`key` has to look like 'backend:model:dtype:quant' but got {key!r}")
        backend, rest = key.split(":", 1)
        model, dtype, quant = rest.rsplit(":", 2)
        return cls(backend=backend, model=model, dtype=dtype, quant=quant)


def default_cache_dir() -> Path:
    """$MNESIO_MODEL_CACHE_DIR or ~/.cache/mnesio: converted model weights and the engine's built kernels."""
    return Path(os.environ.get("MNESIO_MODEL_CACHE_DIR") or Path.home() / ".cache" / "mnesio")
