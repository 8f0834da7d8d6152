"""What both gates share: the result, the probes made from the memories, the version loaded with its texts, and
the accuracy check (check 6) from the counts of correct answers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvengine import CorruptCartridgeError, IncompatibleCartridgeError
from memories.selectors import scope_memories_open

from ... import conf, engine
from ...models import CartridgeVersion
from ...selectors import (
    evaluation_cases_digest,
)
from ...storage import BlobTampered, BlobUnavailable


@dataclass
class GateResult:
    """The outcome of cartridge_is_committable(): passed, every reason, and the figures measured."""

    passed: bool = True
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.passed = False
        self.reasons.append(reason)


def auto_probes(texts: list[str], num: int) -> list[str]:
    """Probe questions made from the memories: evenly spaced memories, asked about by their opening words."""
    if not texts:
        return []
    num = min(num, len(texts))
    picks = sorted({round(i * (len(texts) - 1) / max(num - 1, 1)) for i in range(num)})
    probes = []
    for i in picks:
        words = texts[i].split()[:6]
        probes.append(f"What do you remember about: {' '.join(words)}?")
    return probes


def version_texts(*, version: CartridgeVersion, result: GateResult) -> tuple[list[int], list[str]] | None:
    """The version's memories (seqs and texts) opened from the log; None (and a reason) when the log no longer yields them."""
    seqs = [entry[0] for entry in version.manifest["entries"]]
    opened = {m.seq: m for m in scope_memories_open(scope=version.scope, as_of=version.log_head)}
    if any(s not in opened or opened[s].erased for s in seqs):
        result.fail(f"the log no longer yields every memory of version {version.pk}; it cannot be compared with text")
        return None
    return seqs, [opened[s].text for s in seqs]


def version_loaded(*, version: CartridgeVersion, backend, config, result: GateResult) -> tuple[Any, list[int], list[str]] | None:
    """The version's loaded cartridge (this process's cache, or its parts, every one verified) and its memories
    opened from the log; None (and a reason) when either fails."""
    try:
        cartridge, _ = engine.cartridge_load(version=version, config=config, record_refusal=False)
    except (IncompatibleCartridgeError, CorruptCartridgeError, BlobUnavailable, BlobTampered) as exc:
        result.fail(f"the backend refuses to load version {version.pk}: {getattr(exc, 'message', exc)}")
        return None
    opened = version_texts(version=version, result=result)
    return None if opened is None else (cartridge, *opened)


def accuracy_record(*, version: CartridgeVersion, cases, num_cases_erased: int, correct: dict, ttft: dict, result: GateResult) -> None:
    """Check 6's figures and failures from the counts of correct answers per mode."""
    tolerance = conf.gate_accuracy_tolerance()
    k = conf.gate_retrieval_top_k()
    n = len(cases)
    accuracy = {mode: (correct[mode] / n if n else None) for mode in correct}
    result.figures["accuracy"] = {
        "num_cases": n,
        "num_cases_erased": num_cases_erased,
        **accuracy,
        "tolerance": tolerance,
        "retrieval_top_k": k,
        "retrieval_required": conf.gate_require_retrieval_baseline(),
        "mean_ttft_s": {mode: (ttft[mode] / n if n else None) for mode in ttft},
        "cases_digest": evaluation_cases_digest(scope=version.scope),
    }
    if n:
        if accuracy["cartridge"] < accuracy["text"] - tolerance - 1e-9:
            result.fail(
                f"task accuracy {accuracy['cartridge']:.3f} on {n} cases is below text re-reading's "
                f"{accuracy['text']:.3f} minus the tolerance {tolerance}"
            )
        if conf.gate_require_retrieval_baseline() and accuracy["cartridge"] < accuracy["retrieval"] - tolerance - 1e-9:
            result.fail(
                f"task accuracy {accuracy['cartridge']:.3f} on {n} cases is below the top-{k} retrieval baseline's "
                f"{accuracy['retrieval']:.3f} minus the tolerance {tolerance}"
            )
