"""Repair policies: which tokens of an assembly to recompute, and recomputing them (assembly.recompute).

Chunks compiled alone have seen only P; in the prompt each chunk after the first would also have seen the
chunks before it. A repair recomputes a subset S of those chunks' tokens over the assembly:

- ``none``: nothing (chunks as compiled, keys moved);
- ``first``: the first ``num_tokens`` tokens of every chunk after the first, where each chunk's attention
  sink formed when it was compiled alone (EPIC's LegoLink);
- ``deviation``: CacheBlend: layers 0..``check_layer`` are computed for every candidate token (kept), the
  ``ratio`` of them whose keys at ``check_layer`` moved most (sum of squared differences to the cached keys,
  LMCache's measure) are recomputed through all layers;
- ``full``: every token of every chunk after the first: the re-reading up to float summation order.

The first chunk is never a candidate: it sits where it was compiled, after exactly what preceded it there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from .assembly import Assembly, StopPass, recompute

KINDS = ("none", "first", "deviation", "full")


@dataclass(frozen=True)
class RepairPolicy:
    """What to recompute over an assembly (module docstring). Build with the classmethods."""

    kind: str = "none"
    num_tokens: int = 0  # ``first``: tokens recomputed at the start of each chunk after the first
    ratio: float = 0.0  # ``deviation``: share of the candidate tokens recomputed through all layers
    check_layer: int = 1  # ``deviation``: the layer whose key deviation selects them (CacheBlend's default)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"`kind` has to be one of {list(KINDS)} but got {self.kind!r}")
        if self.kind == "first" and (isinstance(self.num_tokens, bool) or not isinstance(self.num_tokens, int) or self.num_tokens < 1):
            raise ConfigError(f"`num_tokens` has to be a positive integer for a 'first' repair but got {self.num_tokens!r}")
        if self.kind == "deviation" and not (isinstance(self.ratio, (int, float)) and 0.0 < self.ratio <= 1.0):
            raise ConfigError(f"`ratio` has to be in (0, 1] for a 'deviation' repair but got {self.ratio!r}")
        if isinstance(self.check_layer, bool) or not isinstance(self.check_layer, int) or self.check_layer < 0:
            raise ConfigError(f"`check_layer` has to be a layer index >= 0 but got {self.check_layer!r}")

    @classmethod
    def none(cls) -> RepairPolicy:
        return cls("none")

    @classmethod
    def first(cls, num_tokens: int) -> RepairPolicy:
        return cls("first", num_tokens=num_tokens)

    @classmethod
    def deviation(cls, ratio: float, *, check_layer: int = 1) -> RepairPolicy:
        return cls("deviation", ratio=ratio, check_layer=check_layer)

    @classmethod
    def full(cls) -> RepairPolicy:
        return cls("full")

    @property
    def name(self) -> str:
        """A short label: none, first-8, deviation-15%, full."""
        if self.kind == "first":
            return f"first-{self.num_tokens}"
        if self.kind == "deviation":
            return f"deviation-{round(self.ratio * 100, 2):g}%"
        return self.kind


def candidates(assembly: Assembly) -> list[int]:
    """Positions of every token of every chunk after the first."""
    return [p for begin, end in assembly.spans[1:] for p in range(begin, end)]


def _deviation_selected(model: Any, assembly: Assembly, policy: RepairPolicy) -> list[int]:
    """Run layers 0..check_layer for all candidates (their fresh K/V kept); the top ``ratio`` by key deviation there."""
    pool = candidates(assembly)
    if not pool:
        return []
    num_layers = len(assembly.state.keys)
    if policy.check_layer >= num_layers:
        raise ConfigError(f"`check_layer` has to be below the model's {num_layers} layers but got {policy.check_layer}")
    deviation: list[torch.Tensor] = []

    def observe(layer: int, cached: torch.Tensor, fresh: torch.Tensor) -> None:
        if layer == policy.check_layer:
            deviation.append(((fresh.float() - cached.float()) ** 2).sum(dim=(0, 1, 3)))  # (|S|,) over heads and head_dim
        elif layer > policy.check_layer:
            raise StopPass  # the layers after the check are computed for the selected tokens only

    recompute(model, assembly, pool, observe)
    keep = max(1, math.ceil(policy.ratio * len(pool)))
    top = torch.topk(deviation[0], min(keep, len(pool))).indices.tolist()
    return sorted(pool[i] for i in top)


def selected(model: Any, assembly: Assembly, policy: RepairPolicy) -> list[int]:
    """The positions ``policy`` recomputes, ascending (a deviation policy runs its probing layers here)."""
    if policy.kind == "none":
        return []
    if policy.kind == "full":
        return candidates(assembly)
    if policy.kind == "first":
        return [p for begin, end in assembly.spans[1:] for p in range(begin, min(end, begin + policy.num_tokens))]
    return _deviation_selected(model, assembly, policy)


def repair(model: Any, assembly: Assembly, policy: RepairPolicy) -> int:
    """Apply ``policy`` to ``assembly`` in place; the number of tokens recomputed through all layers."""
    positions = selected(model, assembly, policy)
    recompute(model, assembly, positions)
    return len(positions)
