"""q4's calibrated bits per layer and KV head, by the model's weights fingerprint: read from q4_plans.json.

Torch-free, so blocks.key_digest (which the model-free web process imports) can key blocks by the plan they were
quantized under. quant.bit_plan turns a plan into each head's bits; bench/tuning/calibrate_q4.py writes
the file (docs/design/quantization.md says how a plan is chosen).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

PLANS_FILE = Path(__file__).with_name("q4_plans.json")
KINDS = ("k", "v")  # keys, values


@functools.cache
def _plans() -> dict[str, dict]:
    with PLANS_FILE.open(encoding="utf-8") as f:
        return json.load(f)["plans"]


def calibrated_plan(quant: str, weights_fingerprint: str) -> dict[str, list] | None:
    """The calibrated bits {"k": [...], "v": [...]} of ``quant`` for these weights, or None (uniform bits): per layer,
    a list of each KV head's bits (or one number for all of them).
    Part of a block's key (blocks.key_digest): blocks quantized under another plan are never reused."""
    found = _plans().get(weights_fingerprint) if quant == "q4" else None
    if found is None:
        return None
    if not isinstance(found, dict):  # quant.bit_plan refuses what does not fit; this keeps key_digest from crashing
        return {kind: [] for kind in KINDS}
    return {kind: list(found[kind]) if isinstance(found.get(kind), list) else [] for kind in KINDS}
