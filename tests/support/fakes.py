"""A fake engine whose cartridges lost their content, for the gate's refusals (test_gate.py, test_auto_refresh.py)."""
from __future__ import annotations

from kvengine import FidelityReport
from kvengine.fake import FakeKvBackend


class ForgetfulBackend(FakeKvBackend):
    """A fake whose cartridges lost their content (as a badly quantized cartridge would): it answers nothing."""

    def answer(self, cartridge, question, *, max_new_tokens=32):
        return super().answer(cartridge.__class__(header=cartridge.header, payload=("zzz",)), question, max_new_tokens=max_new_tokens)

    def fidelity(self, cartridge, texts, probes, *, max_new_tokens=None):
        return FidelityReport(num_probes=len(probes), top1_agreement=0.25, mean_kl=3.0, max_kl=5.0, answers_identical=0.0)
