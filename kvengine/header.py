"""What a backend is and what a cartridge file's header says (BackendDescription, CartridgeHeader), the one list of
fields both must match (COMPAT_KEY_FIELDS), and the canonical JSON they are hashed and stored in.

Plain values only: format.py, blocks.py and the backends build on these; base.py re-exports them.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import KvConfig

# The fields a cartridge must match to be served by a backend: a backend's description and a cartridge's header
# both carry them, and both build their compat_key from this one list (in this order).
COMPAT_KEY_FIELDS = (
    "backend", "model_id", "weights_fingerprint", "tokenizer_fingerprint", "template_fingerprint", "rope_config",
    "dtype", "quant",
)


@dataclass(frozen=True)
class BackendDescription:
    """What a backend is; the compatibility part of it is written into every cartridge header."""

    backend: str  # "fake" | "transformers"
    model_id: str  # e.g. "smollm2-135m-instruct", "gpt2", or a local path / hub id
    weights_fingerprint: str  # sha256 over the weights (name, shape, dtype, bytes)
    tokenizer_fingerprint: str  # sha256 over the tokenizer's vocabulary and special tokens
    template_fingerprint: str  # sha256 over the chat template / prompt layout
    rope_config: str  # canonical JSON: {"type": ..., "theta": ..., "scaling": ...}
    dtype: str  # one of DTYPES: the precision the KV state is computed and stored in
    quant: str  # one of QUANTS: how the stored KV state is quantized
    device: str  # "cpu", "cuda", "cuda:0" ... (not part of compatibility)
    max_context_tokens: int  # the model's context window

    def compat_key(self) -> dict[str, str]:
        """The fields a cartridge must match to be served by this backend."""
        return {name: getattr(self, name) for name in COMPAT_KEY_FIELDS}

    @property
    def config(self) -> KvConfig:
        """The KV configuration this backend serves (its ``.key`` is what the database stores)."""
        return KvConfig(backend=self.backend, model=self.model_id, dtype=self.dtype, quant=self.quant)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CartridgeHeader:
    """The metadata stored in a cartridge file's safetensors header (all strings on disk).

    It carries the full compatibility key, the token count, the log head the cartridge was
    compiled at, and the sha256 of the payload. It never carries memory text.
    """

    format_version: int
    backend: str
    model_id: str
    weights_fingerprint: str
    tokenizer_fingerprint: str
    template_fingerprint: str
    rope_config: str
    dtype: str
    quant: str
    num_tokens: int
    log_head: int
    payload_sha256: str
    # Free-form, caller-provided, non-secret labels (e.g. {"scope": "agent-7"}); never memory text.
    labels: dict[str, str] = field(default_factory=dict)
    # Blocks (kvengine/blocks.py): tokens per full block, and the cartridge's full blocks in order as
    # canonical JSON ``[[block_id, first_position, num_tokens, part_sha256], ...]``; the tail follows them.
    block_size: int = 0
    blocks: str = "[]"

    def compat_key(self) -> dict[str, str]:
        """The fields this cartridge was compiled under; served only by a backend whose compat_key is equal."""
        return {name: getattr(self, name) for name in COMPAT_KEY_FIELDS}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form hashed and stored in headers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
