"""A small, realistic state for the dashboard: two configurations, two scopes, answers, a failed gate."""
from __future__ import annotations

from typing import Any


def build(*, alice, charlie, operator, scope_a, scope_c, append) -> dict[str, Any]:
    """Scope A and C serve cartridges of the q8 configuration (A's first one was f32/none), A has one
    failed gate result, and both modes have answered a few questions through the API code path."""
    from cartridges.services import (
        cartridge_activate,
        cartridge_answer,
        cartridge_compile,
        cartridge_evaluate,
        kv_configuration_switch,
    )
    from tests.support.blobs import tamper

    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Ada drinks green tea every morning.", "ada")
    cartridge_activate(version=cartridge_compile(scope=scope_a, actor=alice), actor=alice)
    kv_configuration_switch(backend="fake", model="fake-model", dtype="bf16", quant="q8", actor=operator)
    append(scope_c, "Miso the cat sleeps on the piano.")
    for scope in (scope_a, scope_c):
        cartridge_activate(version=cartridge_compile(scope=scope, actor=operator), actor=operator)
    append(scope_a, "The car is parked on level 3.")
    broken = cartridge_compile(scope=scope_a, actor=alice)
    tamper(broken)
    cartridge_evaluate(version=broken, actor=alice)
    for question in ("Where is the spare key?", "What does Ada drink?", "Where is the car?"):
        cartridge_answer(scope=scope_a, question=question, actor=alice)
        cartridge_answer(scope=scope_a, question=question, mode="text", actor=alice)
    cartridge_answer(scope=scope_c, question="Where does Miso sleep?", actor=charlie)
    return {"broken": broken}
