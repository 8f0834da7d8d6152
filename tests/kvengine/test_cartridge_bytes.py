"""Cartridge bytes are pinned: refactoring the engine must not change a single byte of what it compiles.

A change here means stored cartridges stop matching what a recompile produces, which erasure relies on (a
rebuilt blob is byte-identical to one compiled from a log that never held the subject): bump LAYOUT_VERSION or
FORMAT_VERSION on purpose instead of updating these values.

The bytes are those of one machine kind: the float kernels (MKL, oneDNN) take other code paths on another CPU
microarchitecture, so the pins are keyed by the CPU and torch version (``machine()``); on a machine without
pins the tests skip and say how to record them (``MNESIO_PRINT_CARTRIDGE_DIGESTS=1``, at a commit known to be
good). Within one machine, byte-identity of a rebuild is what erasure relies on, and other tests check it
directly.
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
# Recorded on an AMD EPYC of family 25 model 17 (Zen 4), requirements.txt installed, with 1 and 2 torch threads:
# every digest is the same with both.
TINY_ZEN4 = {
    "qwen2:f32:none": "205c2dfe63dcfea0b717c2a66f1374cdf5e1db38f914803797174f702ed9eb57",
    "qwen2:f32:q8": "98f1c0397cedd42300a99654d519600a3074dd6ec37311a4a209fd1587d3cfe6",
    "qwen2:f32:q4": "c5d95d491b992ac641e22308baeb06b0a47ee662398bcf9ee693da03a7b0355e",
    "qwen2:bf16:none": "9aca548c6415546a5f2f9539bf03d6421d8fc3560a0e985b86c9f8b181dca1ec",
    "qwen2:bf16:q8": "e834114ef5b38d15bd6a1fa941064f12955b05ac2a929cb98c44a51d4a795807",
    "qwen2:bf16:q4": "64b424c1f204177e260e13e46e2def91be5d1572e5e05a1e08ae2b2131c56111",
    "gpt2:f32:none": "dba33e9d01dc47f91a6d37e4cda6a1fb3c9abd7a64c7c296870b94fa237dd197",
    "gpt2:f32:q8": "2c4c74f11949d9d6934ec0cf261f85d4091f10ca8d5a970d5b4a042dd1fc4eb7",
    "gpt2:f32:q4": "3e3ff431700e03235407bce7e4bf30584e7ef9ecf1ebb5babb6be3ea5cc4e74c",
    "gpt2:bf16:none": "ae042de78cce7a79a5e65286a3ef67a4c4c95aef444bf0d483b4b3a4391c3759",
    "gpt2:bf16:q8": "26c14642904d6ebd9f8a8e822579f1b61ea8fa5403328d2cf54c5e835378f869",
    "gpt2:bf16:q4": "36e3d740d8f84d9e9568799badba7b5596e674f466d571adb67bfa5b2c040b8f",
}
SMOLLM2_ZEN4 = {
    "none": "918d79cb228154d506b512baf859a69411780e1221a4c0c498897c0302999f93",
    "q8": "77bcd2609b2959aa77f4097161caa981ab74fa8bfe0d37572b35fad5153a0bbd",
    "q4": "db6d6f38751ddf3a0f50eff0934c957d03630a4028ab913a5c629332c40437e7",
    "bf16r": "d05a2278a128af38d4e581a7eac6bf3892688008d3b42f226e69f9bbe66ffefd",
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
    "AuthenticAMD 25 17 torch 2.13.0+cpu": {"tiny": TINY_ZEN4, "smollm2": SMOLLM2_ZEN4},
    # an AMD EPYC of family 26 model 2 (Zen 5) computes the Zen 4 bytes, every one (recorded at bc04cd8 and at
    # da01320, with 1 and 2 torch threads)
    "AuthenticAMD 26 2 torch 2.13.0+cpu": {"tiny": TINY_ZEN4, "smollm2": SMOLLM2_ZEN4},
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
    computed["bf16r"] = _digest(real_backend.variant(dtype="bf16r"))  # its exact matmul outputs (precision.py)
    pins = _pins("smollm2", computed)
    for quant, digest in computed.items():
        assert digest == pins[quant], quant
