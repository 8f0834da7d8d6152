"""The safetensors cartridge file: deterministic bytes, full header, integrity checks."""
from __future__ import annotations

import dataclasses
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from kvengine.base import CartridgeHeader
from kvengine.errors import CorruptCartridgeError, IncompatibleCartridgeError
from kvengine.fake import FakeKvBackend
from kvengine.format import (
    FORMAT_VERSION,
    RawTensor,
    check_compatible,
    merkle_sha256,
    read_cartridge,
    read_header,
    write_cartridge,
)


def _header(**over) -> CartridgeHeader:
    values = dict(
        format_version=FORMAT_VERSION, backend="fake", model_id="m", weights_fingerprint="w", tokenizer_fingerprint="t",
        template_fingerprint="tp", rope_config='{"theta":1}', dtype="f32", quant="none", num_tokens=7, log_head=3,
        payload_sha256="", labels={"scope": "a"},
    )
    values.update(over)
    return CartridgeHeader(**values)


def _tensors() -> dict[str, RawTensor]:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, -2, 3], dtype=np.int8)
    return {"tail.layer.0.k": RawTensor("F32", a.shape, a.tobytes()), "tail.scales": RawTensor("I8", b.shape, b.tobytes())}


def test_it_writes_identical_bytes_for_identical_input():
    assert write_cartridge(_header(), _tensors()) == write_cartridge(_header(), _tensors())


def test_it_stores_every_header_field_and_the_payload_sha256():
    data = write_cartridge(_header(), _tensors())
    header = read_header(data)
    assert header.payload_sha256 == merkle_sha256([], {name[len("tail."):]: t for name, t in _tensors().items()})
    assert dataclasses.replace(header, payload_sha256="") == _header()
    (n,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + n])["__metadata__"]
    assert set(meta) == {f.name for f in dataclasses.fields(CartridgeHeader)}
    assert all(isinstance(v, str) for v in meta.values())


def test_it_is_readable_by_the_safetensors_library():
    data = write_cartridge(_header(), _tensors())
    loaded = st_load(data)
    assert np.array_equal(loaded["tail.layer.0.k"], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert loaded["tail.scales"].tolist() == [1, -2, 3]
    header, tensors = read_cartridge(data)
    assert tensors["tail.layer.0.k"].shape == (3, 4) and bytes(tensors["tail.scales"].data) == np.array([1, -2, 3], np.int8).tobytes()


@pytest.mark.parametrize("cut", [0, 5, 8, 40, -1, -13])
def test_it_refuses_a_truncated_file(cut):
    data = write_cartridge(_header(), _tensors())
    with pytest.raises(CorruptCartridgeError):
        read_header(data[:cut])


def test_it_refuses_a_flipped_payload_byte_by_sha256():
    data = bytearray(write_cartridge(_header(), _tensors()))
    data[-3] ^= 0xFF
    with pytest.raises(CorruptCartridgeError, match="sha256"):
        read_header(bytes(data))


def test_it_refuses_a_header_whose_sha256_was_edited():
    data = write_cartridge(_header(), _tensors())
    sha = read_header(data).payload_sha256
    forged = data.replace(sha.encode(), ("0" * 64).encode())
    with pytest.raises(CorruptCartridgeError, match="sha256"):
        read_header(forged)


def test_it_refuses_garbage_and_non_cartridge_safetensors():
    with pytest.raises(CorruptCartridgeError):
        read_header(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CorruptCartridgeError):
        read_header(b"\xff" * 64)
    from safetensors.numpy import save

    plain = save({"x": np.zeros(2, np.float32)})
    with pytest.raises(CorruptCartridgeError, match="not a mnesio cartridge"):
        read_header(plain)


def test_it_names_every_incompatible_field():
    fake = FakeKvBackend(model="one", quant="q8")
    header = _header(backend="fake", model_id="two", quant="q4")
    with pytest.raises(IncompatibleCartridgeError) as err:
        check_compatible(header, fake.describe())
    assert "model_id" in str(err.value) and "quant" in str(err.value)


def test_it_refuses_an_unknown_format_version():
    fake = FakeKvBackend()
    header = dataclasses.replace(_header(**fake.describe().compat_key()), format_version=FORMAT_VERSION + 1)
    with pytest.raises(IncompatibleCartridgeError, match="format_version"):
        check_compatible(header, fake.describe())
