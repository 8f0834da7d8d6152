"""Cartridge bytes are pinned: refactoring the engine must not change a single byte of what it compiles.

The digests below were computed with the engine before the issue-12 split of transformers_backend.py into
layout.py, payload.py and the backend (commit d3c3563), on this project's CPU machine; they held with 1 and
2 torch threads. A change here means stored cartridges stop matching what a recompile produces, which
erasure relies on (a rebuilt blob is byte-identical to one compiled from a log that never held the subject):
bump LAYOUT_VERSION or FORMAT_VERSION on purpose instead of updating these values.

FORMAT_VERSION 3 (issue 16: rotated q8/q4, q4 in 32-value groups) changed every header, so every digest:
recomputed on 2026-11-30 in a virtualenv installed from requirements.txt; they hold with 1 and 2 torch threads.

The bytes are those of one machine kind: the format-2 pins, computed on the previous session's machine (an AMD
EPYC of family 26, Zen 5, per BENCHMARKS.md), did not reproduce on this one (family 25 model 17, Zen 4) with the
same pinned packages, before any code change: the float kernels (MKL, oneDNN) take other code paths on another
microarchitecture. So the pins are keyed by the CPU and torch version (``machine()``); on a machine without pins
the tests skip and say how to record them (``MNESIO_PRINT_CARTRIDGE_DIGESTS=1``, at a commit known to be good).
Within one machine, byte-identity of a rebuild is what erasure relies on, and other tests check it directly.

FORMAT_VERSION 4 (issue 13: blocks computed on top of each other, parts stacked by layer) and 5 (q8 in 16-value
groups) changed every digest again: recomputed on 2026-11-30 on this session's machine (family 25 model 1, Zen 3),
the same with 1 and 2 torch threads; the Zen 4 pins of format 3 were dropped (they can no longer match).
"""
from __future__ import annotations

import hashlib
import os
import platform

import pytest
import torch

from kvengine import make_backend

MEMORIES = [
    "Alice Moreau lives in Lisbon and works as a baker.",
    "Bob keeps the spare key under the blue flower pot.",
    "The meeting with Carol is on Friday at three.",
]
# FORMAT_VERSION 6 (issue 16: q4 with 5-bit keys in 64-value groups, bf16r with exact matmul outputs) changed every
# digest again: recomputed on 2026-11-30 on an Intel Xeon (family 6 model 207) with 1 and 2 torch threads. The tiny
# models' bytes and SmolLM2's bf16r bytes are the same with 1 and 2 threads; SmolLM2's f32/q8/q4 are NOT on this CPU
# (its f32 matmuls split across threads in another order), so they are pinned per thread count: a rebuild is
# byte-identical only under the thread count of the compile. The AMD (Zen 3) pins of format 5 were dropped: they
# can no longer match, and no AMD machine was at hand to record format 6's.
# FORMAT_VERSION 7 (issue 16: q4's bits per layer from a calibrated plan; every quantized part stores its layers' bits
# and its codes flattened by layer) changed every digest again: recomputed on 2026-11-30 on the same Intel Xeon kind,
# 1 and 2 threads, with the same pattern (tiny models and SmolLM2's bf16r alike, SmolLM2's f32/q8/q4 per thread count).
TINY_XEON = {
    "qwen2:f32:none": "5d22a32eaa6d38ab0a6114022c7fa22662622feecadb3ec04d10a2f550b867e6",
    "qwen2:f32:q8": "c0454443d299955c037dccaa0bdbbaa8e7f4358bdf9e2d8c849cf98cb79b933f",
    "qwen2:f32:q4": "92a37c2793e3a35b95d6a5957c01cad5571d1d5e02cd5fdc77a4eb280bc45bab",
    "qwen2:bf16:none": "51653c02088d25ed4cc2f9fa1f660248502eb9845dcfe346ca17141475ade125",
    "qwen2:bf16:q8": "01d556859a61eb206b9c9e022a2fc89c36ef767edd61aa8b2aae9e7439203157",
    "qwen2:bf16:q4": "fc57c0961e7fa6f27192df92321f0f38c1398faa9a43dd4eef6b77fe96d5246b",
    "gpt2:f32:none": "645fd40ff1dc6e9e096dc9a643d614a926828d14c846fe551abade9d852cd02a",
    "gpt2:f32:q8": "a321e84425ce08a3599fce3112c9794c4a4caec08df81c499bc108ce8795271a",
    "gpt2:f32:q4": "9957b22b87b612faba38821c50a4fda53da02b1963a46fb8fba553f7fdbad7fd",
    "gpt2:bf16:none": "91892736db30009c7e7d95c878b4910810c7e1ee9e9374d9b3e51b1db624edd0",
    "gpt2:bf16:q8": "c8ccf94cecc20c8daee16e4bb868900dfc5c7daf8152102b6a0f73cc8dd201a6",
    "gpt2:bf16:q4": "6bd98aca5035ebe43618494969dc05402cfa8f10a99c0ac6cfb9a8300e8074ef",
}
SMOLLM2_XEON_1_THREAD = {
    "none": "9f96ed47ee75187b57ffc0bbfd3ab8806d697e68bbc92a9e59a8fdfa345f5506",
    "q8": "555af191bfe7c35b4bb02b74034ee98d2940377ecd2cced053ee928b23115f28",
    "q4": "dd420829e244d9a3d7da7b9b8e852ba49948d16a72f840d96849bb8d272130bd",
    "bf16r": "7767d925c80bbe17d01f1e763fed12a0ce33714a95b0b7cc5d6b6b29cae1dc66",
}
SMOLLM2_XEON_2_THREADS = {
    "none": "71430f3116309a7043b4a575370122c0b4018a049af1531624ef7385099a3588",
    "q8": "bd5057d2754c042bd05074a6332668ae27ccfda62886888ec8424fc2273a6768",
    "q4": "0ec818f9b43b85113ad287020c65a07fc9a32f617f67b2697c83cef25586bde5",
    "bf16r": "7767d925c80bbe17d01f1e763fed12a0ce33714a95b0b7cc5d6b6b29cae1dc66",
}


def machine() -> str:
    """The CPU (vendor, family, model) and torch version the digests depend on."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = " ".join(fields.get(key, "?") for key in ("vendor_id", "cpu family", "model")) if fields else platform.processor()
    return f"{cpu} torch {torch.__version__}"


# machine() -> the pins computed there; "kind@N" pins hold only with N torch threads (and win over "kind")
PINNED = {
    "GenuineIntel 6 207 torch 2.13.0+cpu": {"tiny": TINY_XEON, "smollm2@1": SMOLLM2_XEON_1_THREAD, "smollm2@2": SMOLLM2_XEON_2_THREADS},
}


def _pins(kind: str, computed: dict[str, str] | None = None) -> dict[str, str]:
    here = machine()
    if os.environ.get("MNESIO_PRINT_CARTRIDGE_DIGESTS") == "1" and computed is not None:
        print(f"cartridge digests on {here!r} ({kind}): {computed}")
    pins = PINNED.get(here, {})
    found = pins.get(f"{kind}@{torch.get_num_threads()}", pins.get(kind))
    if found is None:
        pytest.skip(f"no {kind} cartridge digests pinned for this machine ({here!r}) with {torch.get_num_threads()} torch "
                    "thread(s); run this test with -s and MNESIO_PRINT_CARTRIDGE_DIGESTS=1 at a commit known to be good "
                    "and add them to PINNED")
    return found


def _digest(backend) -> str:
    return hashlib.sha256(backend.dumps(backend.compile(MEMORIES, log_head=3, labels={"scope": "pin"}))).hexdigest()


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_tiny_model_cartridges_keep_their_bytes(arch, tiny_model_dir, tmp_path, monkeypatch):
    # the header names the model as given: load it by a fixed relative name, not the session's temp path
    (tmp_path / f"tiny-{arch}").symlink_to(tiny_model_dir(arch), target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    computed = {}
    for dtype in ("f32", "bf16"):
        backend = make_backend("transformers", model=f"tiny-{arch}", dtype=dtype, device="cpu")
        for quant in ("none", "q8", "q4"):
            computed[f"{arch}:{dtype}:{quant}"] = _digest(backend.variant(quant=quant))
    pins = _pins("tiny", computed)
    for name, digest in computed.items():
        assert digest == pins[name], name


@pytest.mark.model
def test_default_model_cartridges_keep_their_bytes(real_backend):
    computed = {quant: _digest(real_backend.variant(quant=quant)) for quant in ("none", "q8", "q4")}
    computed["bf16r"] = _digest(real_backend.variant(dtype="bf16r"))  # format 6: its matmul outputs (precision.py)
    pins = _pins("smollm2", computed)
    for quant, digest in computed.items():
        assert digest == pins[quant], quant
