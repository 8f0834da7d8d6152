"""The decoding step compiled: one new token's forward pass through torch.compile (inductor), an opt-in configuration.

compiled_step(model) is ``torch.compile(model.forward, dynamic=True, fullgraph=True)``: one graph for the whole
model (fullgraph: no graph break, so no per-layer Python between kernels), its sizes symbolic from the first
compile, so a cache growing token by token or another cartridge's length runs the same code (no recompile,
measured). It runs single-token steps over a kvcache.CartridgeCache only; the prompt's pass stays eager.
warm_up() compiles it once, as the backend loads: about a minute on a 2-core CPU, hardly less from
inductor's on-disk cache (a second process). Figures and parity checks: BENCHMARKS.md, "torch.compile of the
decoding step".
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from .kvcache import CartridgeCache, KvState

log = logging.getLogger(__name__)


def compiled_step(model: torch.nn.Module) -> Callable:
    """The model's forward, compiled for one-token decoding steps over a CartridgeCache (module docstring)."""
    return torch.compile(model.forward, dynamic=True, fullgraph=True)


def warm_up(step: Callable, model: torch.nn.Module, kv_shape: tuple[int, int], *, dtype: torch.dtype, device: str) -> float:
    """Compile ``step`` by running it on two small zero states of different lengths (sizes 0 and 1 are specialized by
    dynamo, so both are past them); return the seconds it took."""
    started = time.perf_counter()
    num_layers = model.config.get_text_config().num_hidden_layers
    with torch.inference_mode():
        for length in (16, 24):
            state = KvState.blank(num_layers, kv_shape, capacity=length + 4, num_tokens=length, dtype=dtype, device=device)
            cache = CartridgeCache(state)
            for token in (0, 1):
                step(input_ids=torch.tensor([[token]], device=device), cache=cache, use_cache=True)
    seconds = time.perf_counter() - started
    log.info("kvengine: compiled the decoding step (torch.compile, inductor) in %.1f s", seconds)
    return seconds
