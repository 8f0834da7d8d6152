"""Gate check 7 on the real model: a variant's teacher-forced divergence from f32 (kvengine.divergence).

A deliberately broken quantizer (dequantizing every stored value to zero) must be refused by the divergence
threshold; the real q4 of the same short scope must pass it. The thresholds are settings.
"""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.services import cartridge_compile
from cartridges.services.gate import cartridge_is_committable

pytestmark = [pytest.mark.django_db, pytest.mark.model]

MODEL = "smollm2-135m-instruct"
MEMORIES = [
    "The spare key is under the blue flowerpot by the back door.",
    "Dana's locker code is 4417 and her locker is on the second floor.",
    "The team meeting moved to Thursday at ten in room B.",
]


@pytest.fixture
def q4_engine(settings, real_backend):
    """The real model, q4, as the active configuration (the f32 reference registered beside it)."""
    settings.MNESIO_KV_BACKEND, settings.MNESIO_KV_MODEL = "transformers", MODEL
    settings.MNESIO_KV_DTYPE, settings.MNESIO_KV_QUANT = "f32", "q4"
    settings.MNESIO_GATE_NUM_AUTO_PROBES = 3
    settings.MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = 4
    engine.register_backend(("transformers", MODEL, "f32", "none"), real_backend)
    engine.register_backend(("transformers", MODEL, "f32", "q4"), real_backend.variant(quant="q4"))


def _divergence_reasons(result) -> list[str]:
    return [r for r in result.reasons if "KL divergence" in r or "per answer position" in r]


def test_the_gate_refuses_a_broken_quantizer_by_divergence_from_f32(q4_engine, scope_a, append, monkeypatch):
    import torch

    import kvengine.payload as payload

    real = payload.dequantize_kv
    # a broken quantizer: what it stores dequantizes to zeros (the exact sink positions stay, as stored)
    monkeypatch.setattr(payload, "dequantize_kv", lambda parts, quant, dtype, *, axis: torch.cat(
        [parts["exact"].to(dtype), torch.zeros_like(real(parts, quant, dtype, axis=axis)[..., parts["exact"].shape[-2]:, :])], dim=-2))
    for text in MEMORIES:
        append(scope_a, text)
    version = cartridge_compile(scope=scope_a)
    result = cartridge_is_committable(version=version)
    assert not result.passed
    figures = result.figures["divergence"]
    assert figures["max_mean_kl"] == 0.02 and figures["num_questions"] == 3 and figures["num_positions"] >= 3
    assert figures["mean_kl"] > 0.02
    reasons = _divergence_reasons(result)
    assert any("mean KL divergence" in r and "above the threshold 0.02" in r for r in reasons), result.reasons
    assert "flowerpot" not in str(result.figures)  # numbers only


def test_the_gate_passes_the_real_q4_and_its_thresholds_are_settings(q4_engine, scope_a, append, settings):
    for text in MEMORIES:
        append(scope_a, text)
    version = cartridge_compile(scope=scope_a)
    result = cartridge_is_committable(version=version)
    figures = result.figures["divergence"]
    assert figures["mean_kl"] <= 0.02 and not _divergence_reasons(result), result.reasons
    assert figures["reference"] == "f32 cartridge, teacher-forced"
    # the same version against a threshold below what it measured: refused, naming the setting's value
    settings.MNESIO_GATE_MAX_MEAN_KL = figures["mean_kl"] / 2
    strict = cartridge_is_committable(version=version)
    assert not strict.passed and any("above the threshold" in r for r in _divergence_reasons(strict))


def test_f32_is_its_own_reference_and_skips_the_check(real_engine, scope_a, append):
    append(scope_a, MEMORIES[0])
    result = cartridge_is_committable(version=cartridge_compile(scope=scope_a))
    assert result.passed and "divergence" not in result.figures
