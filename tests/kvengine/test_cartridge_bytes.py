"""Cartridge bytes are pinned: refactoring the engine must not change a single byte of what it compiles.

The digests below were computed with the engine before the issue-12 split of transformers_backend.py into
layout.py, payload.py and the backend (commit d3c3563), on this project's CPU machine; they held with 1 and
2 torch threads. A change here means stored cartridges stop matching what a recompile produces, which
erasure relies on (a rebuilt blob is byte-identical to one compiled from a log that never held the subject):
bump LAYOUT_VERSION or FORMAT_VERSION on purpose instead of updating these values.
"""
from __future__ import annotations

import hashlib

import pytest

from kvengine import make_backend

MEMORIES = [
    "Alice Moreau lives in Lisbon and works as a baker.",
    "Bob keeps the spare key under the blue flower pot.",
    "The meeting with Carol is on Friday at three.",
]
TINY = {
    "qwen2:f32:none": "70acb3532dcbd799e9dee1bf909c586574acf31b51580cc8742a012b7bd86e95",
    "qwen2:f32:q8": "d37e31d6593672d706ac63e6d454980202d83b9dd26b8a9e3403d2addb3e6a51",
    "qwen2:f32:q4": "cd732a050964b4de06e7d5a0a295539e0bcc53ce853c5a46cc081a6aad893810",
    "qwen2:bf16:none": "77fc0f40117133a0cb577f3c57dd9475317331106ba171d5b39c7c402c8ec675",
    "qwen2:bf16:q8": "2379cb7cafafb5937f3e235ef59b76e9c47bdab2aa8556f91872628e85e14dc1",
    "qwen2:bf16:q4": "a4859edb3af7242633f7fc46c606029dded5340f0d7d92da3b49007cce782eb9",
    "gpt2:f32:none": "52e3383967cb1b14cf6acd1e1a9caa81cfd71cd90fdba2ede1e0e328b0eaec90",
    "gpt2:f32:q8": "62e8ca0729a2c8058b92ef0c713b0954d7aca4a7d6cb74fd3636804597a531d2",
    "gpt2:f32:q4": "31392b204e8bc8fcd6117535d20a3551b3704c8950afe09c65202ceadbe7110d",
    "gpt2:bf16:none": "96ddcc867d606a6db172d05a7b4287d27c55a9a6bd310f65addeb7dbbab2fa1f",
    "gpt2:bf16:q8": "ffa1c82800f5fdc185ca358c336f9a6e39355469a506333157c80773b0499fbe",
    "gpt2:bf16:q4": "54c42ffe801ecb3cde4284544500a5739474764b903d0ccc8ba5457a151f09dc",
}
SMOLLM2 = {
    "none": "ce796993b101f9343c278438ca63ca85b80dfa71f06c4c3bb3c5e18af8f10cd0",
    "q8": "d142deb897628e703c2cf47ef1e559d6dfbe8588acf6bb3dad78e096a2517c5e",
    "q4": "0102b24adce6d8a47578d6c81bcfe7b5c3b35873f9b83b8f3bdcafd3e341e06b",
}


def _digest(backend) -> str:
    return hashlib.sha256(backend.dumps(backend.compile(MEMORIES, log_head=3, labels={"scope": "pin"}))).hexdigest()


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_tiny_model_cartridges_keep_their_bytes(arch, tiny_model_dir, tmp_path, monkeypatch):
    # the header names the model as given: load it by a fixed relative name, not the session's temp path
    (tmp_path / f"tiny-{arch}").symlink_to(tiny_model_dir(arch), target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for dtype in ("f32", "bf16"):
        backend = make_backend("transformers", model=f"tiny-{arch}", dtype=dtype, device="cpu")
        for quant in ("none", "q8", "q4"):
            assert _digest(backend.variant(quant=quant)) == TINY[f"{arch}:{dtype}:{quant}"], f"{arch} {dtype} {quant}"


@pytest.mark.model
def test_default_model_cartridges_keep_their_bytes(real_backend):
    for quant, expected in SMOLLM2.items():
        assert _digest(real_backend.variant(quant=quant)) == expected, quant
