"""The incremental gate: a version that extends verified blocks is gated at the cost of what changed, never weaker."""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.models import CartridgeBlock, CartridgeEvaluation
from cartridges.selectors import active_version
from cartridges.services import (
    GateFailed,
    cartridge_activate,
    cartridge_compile,
    cartridge_evaluate,
)
from cartridges.services.gate import cartridge_is_committable
from kvengine.fake import FakeKvBackend

pytestmark = pytest.mark.django_db

FACTS = [f"Locker {i} holds the {word} umbrella." for i, word in enumerate(["red", "blue", "green", "grey", "pink", "white"])]


def _grow(scope, append, num: int) -> None:
    for text in FACTS[:num]:
        append(scope, text)


@pytest.fixture
def verified(scope_a, append, fake_engine):
    """Scope A with five memories (one full fake block), compiled and passed by the full gate."""
    _grow(scope_a, append, 5)
    v1 = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=v1, gate="auto")
    assert evaluation.passed and evaluation.figures["gate"] == "full"
    assert "no earlier version" in evaluation.figures["gate_cost"]["why_full"]
    return v1


def test_it_gates_an_append_incrementally_on_the_parents_verified_blocks(verified, scope_a, append):
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    fig = evaluation.figures
    assert evaluation.passed, evaluation.reasons
    assert fig["gate"] == "incremental"
    inc = fig["incremental"]
    assert inc["parent_version_id"] == verified.pk and inc["num_verified_blocks"] == 1
    assert inc["num_new_memories"] == 1 and inc["num_new_tokens"] == 2  # the fake's positions count memories
    assert inc["chain_matches"] and inc["max_abs_diff"] == 0.0 and inc["since_full"] == 1
    assert fig["gate_cost"]["tokens_reread"] == 2 and fig["gate_cost"]["seconds"] >= 0
    assert len(fig["verified_blocks"]) == 1
    assert "umbrella" not in str(fig)  # numbers and digests only


def test_it_probes_the_new_memories(verified, scope_a, append, monkeypatch):
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    seen = {}
    backend = engine.backend_for(v2.config)
    original = type(backend).verify_extension

    def spy(self, cartridge, texts, probes, **kwargs):
        seen["probes"] = list(probes)
        return original(self, cartridge, texts, probes, **kwargs)

    monkeypatch.setattr(type(backend), "verify_extension", spy)
    assert cartridge_evaluate(version=v2, gate="auto").figures["gate"] == "incremental"
    assert any("Locker 5 holds the white" in probe for probe in seen["probes"])


def test_an_explicit_evaluation_runs_the_full_gate(verified, scope_a, append):
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=v2)
    assert evaluation.passed and evaluation.figures["gate"] == "full"
    assert evaluation.figures["gate_cost"]["why_full"] == "asked for the full gate"


def test_an_incremental_chain_is_transitive_and_runs_the_full_gate_on_schedule(verified, scope_a, append, settings):
    settings.MNESIO_GATE_FULL_EVERY = 3
    gates = []
    for i in range(5):
        append(scope_a, f"Shelf {i} holds the {i}th box of tea.")
        version = cartridge_compile(scope=scope_a)
        evaluation = cartridge_evaluate(version=version, gate="auto")
        assert evaluation.passed, evaluation.reasons
        gates.append((evaluation.figures["gate"], (evaluation.figures.get("incremental") or {}).get("since_full")))
    # 6..10 memories: every 3rd version of the chain runs in full; 9 memories make a second block, verified by an
    # incremental gate, and the 10-memory version reuses it: incremental passes vouch for blocks too (transitive)
    assert gates == [("incremental", 1), ("incremental", 2), ("full", None), ("incremental", 1), ("incremental", 2)]
    last = CartridgeEvaluation.objects.order_by("-id").first()
    assert last.figures["incremental"]["num_verified_blocks"] == 2


def _unrecorded_pass(scope, append):
    """Five memories compiled, and the figures a passing full gate gives them, recorded nowhere yet."""
    _grow(scope, append, 5)
    v1 = cartridge_compile(scope=scope)
    result = cartridge_is_committable(version=v1)
    assert result.passed and result.figures["verified_blocks"]
    append(scope, FACTS[5])
    return v1, result.figures, cartridge_compile(scope=scope)


def test_it_runs_the_full_gate_when_the_parent_never_passed(scope_a, append, fake_engine):
    v1, figures, v2 = _unrecorded_pass(scope_a, append)
    # the parent's only evaluation failed, though it lists the very block ids and digests v2 reuses
    CartridgeEvaluation.objects.create(version=v1, passed=False, reasons=["forged"], figures=figures, config_key="fake:fake-model:f32:none")
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    assert evaluation.passed and evaluation.figures["gate"] == "full"
    assert "no earlier version" in evaluation.figures["gate_cost"]["why_full"]


def test_a_parent_that_passed_under_another_configuration_does_not_count(scope_a, append, fake_engine):
    v1, figures, v2 = _unrecorded_pass(scope_a, append)
    CartridgeEvaluation.objects.create(version=v1, passed=True, reasons=[], figures=figures, config_key="fake:fake-model:f32:q8")
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    assert evaluation.passed and evaluation.figures["gate"] == "full"


def test_a_parent_under_the_same_configuration_counts(scope_a, append, fake_engine):
    v1, figures, v2 = _unrecorded_pass(scope_a, append)
    CartridgeEvaluation.objects.create(version=v1, passed=True, reasons=[], figures=figures, config_key="fake:fake-model:f32:none")
    assert cartridge_evaluate(version=v2, gate="auto").figures["gate"] == "incremental"  # the control of the two above


def test_a_configuration_switch_makes_the_next_gate_full(verified, scope_a, append):
    from cartridges.services import kv_configuration_switch

    kv_configuration_switch(backend="fake", model="fake-model", dtype="f32", quant="none")
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    assert evaluation.passed and evaluation.figures["gate"] == "full"


def test_a_block_named_by_id_and_digest_instead_of_its_row_is_not_verified(verified, scope_a, append):
    # a forged passing evaluation that names the parent's first block by id and some digest, not by its row
    real = CartridgeEvaluation.objects.get(version=verified)
    (row_id, *_) = real.figures["verified_blocks"]
    block = CartridgeBlock.objects.get(pk=row_id)
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    forged = CartridgeEvaluation.objects.create(
        version=verified, passed=True, reasons=[], config_key=real.config_key,
        figures={"gate": "full", "verified_blocks": [[block.block_id, "0" * 64]]},
    )
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    assert evaluation.figures["incremental"]["parent_evaluation_id"] == real.pk != forged.pk


def test_quantized_variants_are_gated_in_full(scope_a, append, fake_engine, settings):
    settings.MNESIO_KV_QUANT = "q8"
    _grow(scope_a, append, 5)
    v1 = cartridge_compile(scope=scope_a)
    assert cartridge_evaluate(version=v1, gate="auto").passed
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    evaluation = cartridge_evaluate(version=v2, gate="auto")
    assert evaluation.figures["gate"] == "full" and "q8" in evaluation.figures["gate_cost"]["why_full"]


class LyingTail(FakeKvBackend):
    """A fake whose compile garbles the newest memory (a broken incremental compile): blocks right, tail wrong."""

    def compile(self, texts, **kwargs):
        texts = list(texts)
        if len(texts) == 6:
            texts[-1] = "Parcel 5 holds the white umbrella."
        return super().compile(texts, **kwargs)


@pytest.fixture
def lying(verified, scope_a, append, fake_engine):
    """Version 2 of scope A compiled by LyingTail, and the fake back in place afterwards."""
    append(scope_a, FACTS[5])
    engine.register_backend(fake_engine, LyingTail(model="fake-model"))
    try:
        v2 = cartridge_compile(scope=scope_a)
    finally:
        engine.register_backend(fake_engine, FakeKvBackend(model="fake-model"))
    return v2


def test_a_new_part_that_disagrees_with_the_log_fails_the_incremental_gate(lying):
    evaluation = cartridge_evaluate(version=lying, gate="auto")
    assert not evaluation.passed and evaluation.figures["gate"] == "incremental"
    reasons = " | ".join(evaluation.reasons)
    assert "differs from its one-pass re-reading by up to 1" in reasons
    assert "top-1 agreement with re-reading the new part" in reasons  # the probe about the new memory disagrees
    with pytest.raises(GateFailed):
        cartridge_activate(version=lying)  # no pass, so activation runs the full gate: it fails as well
    assert not CartridgeEvaluation.objects.filter(version=lying, passed=True).exists()


def test_probes_about_the_new_memory_fail_the_gate_on_their_own(lying, settings):
    settings.MNESIO_GATE_MAX_KV_ABS_DIFF = 2.0  # let the KV comparison pass: the answers must still catch it
    evaluation = cartridge_evaluate(version=lying, gate="auto")
    assert not evaluation.passed and evaluation.figures["gate"] == "incremental"
    assert len(evaluation.reasons) == 1 and "fidelity" in evaluation.reasons[0], evaluation.reasons


def test_the_compile_follow_up_gates_incrementally_and_an_explicit_evaluate_runs_in_full(
    verified, scope_a, append, eager_tasks, django_capture_on_commit_callbacks
):
    from cartridges.tasks import cartridge_evaluate_task

    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    with django_capture_on_commit_callbacks(execute=True):  # the activation is sent after commit
        followed = cartridge_evaluate_task.delay(v2.pk, True).get()
    assert CartridgeEvaluation.objects.get(pk=followed["evaluation"]).figures["gate"] == "incremental"
    assert active_version(scope=scope_a) == v2  # activated on the incremental pass
    explicit = cartridge_evaluate_task.delay(v2.pk).get()  # an incremental pass is not reused for an explicit evaluate
    assert explicit["evaluation"] != followed["evaluation"]
    assert CartridgeEvaluation.objects.get(pk=explicit["evaluation"]).figures["gate"] == "full"
    assert cartridge_evaluate_task.delay(v2.pk).get()["evaluation"] == explicit["evaluation"]  # a full one is


def test_a_refresh_defers_the_scheduled_full_gate_and_says_it_is_due(verified, scope_a, append, settings):
    settings.MNESIO_GATE_FULL_EVERY = 1
    append(scope_a, FACTS[5])
    v2 = cartridge_compile(scope=scope_a)
    deferred = cartridge_evaluate(version=v2, gate="auto", defer_full=True)
    assert deferred.passed and deferred.figures["gate"] == "incremental" and deferred.figures["incremental"]["full_due"]
    assert cartridge_evaluate(version=v2, gate="auto").figures["gate"] == "full"  # not deferred: the schedule runs it


def test_a_full_gate_of_an_older_version_resets_the_schedule(verified, scope_a, append, settings):
    """A scheduled full gate runs on the version serving while newer versions are gated (and may hold more blocks):
    it still resets the count, or every version after it would be due again and full gates would run back to back."""
    settings.MNESIO_GATE_FULL_EVERY = 3
    versions = []
    for i, num in enumerate([1, 3]):  # 6 memories (one fake block), then 9 (two)
        for j in range(num):
            append(scope_a, f"Shelf {i}.{j} holds a box of tea.")
        versions.append(cartridge_compile(scope=scope_a))
        figures = cartridge_evaluate(version=versions[-1], gate="auto", defer_full=True).figures
        assert (figures["incremental"]["since_full"], len(figures["verified_blocks"])) == (i + 1, i + 1)
    assert cartridge_evaluate(version=versions[0]).figures["gate"] == "full"  # the older one (one block), in full
    append(scope_a, "Shelf 2 holds the last box of tea.")
    evaluation = cartridge_evaluate(version=cartridge_compile(scope=scope_a), gate="auto", defer_full=True)
    assert evaluation.figures["gate"] == "incremental"
    assert evaluation.figures["incremental"]["since_full"] == 1 and not evaluation.figures["incremental"]["full_due"]
