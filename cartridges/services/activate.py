"""Activation and rollback: a version serves only through the gate; the old one serves until then.

Decisions:
- Activation needs a passing evaluation made under the active configuration and the scope's current
  evaluation cases; without one it evaluates first. It then re-runs the cheap checks (not destroyed,
  configuration and key, blob intact, no erased subject) right before writing the activation, because
  the blob or the log may have changed since the evaluation; a failure there is recorded as a failed
  evaluation (stage "activation") so every reason is on record.
- A failed gate raises GateFailed (409) and writes no activation: the previous version keeps serving.
- Activating the version that already serves returns its activation (idempotent, no new row).
- Rollback activates the newest earlier activated version that is not destroyed, through the gate again; a
  pruned one (services/retention.py) is refused, naming the retention setting.
- After an activation, retention prunes the versions beyond ``keep_previous_versions``.
"""
from __future__ import annotations

import logging

from django.db import transaction

from core.errors import Conflict
from memories.models import Scope

from ..models import CartridgeActivation, CartridgeEvaluation, CartridgePrune, CartridgeVersion
from ..selectors import (
    active_configuration,
    active_version,
    evaluation_cases_digest,
    latest_activation,
    version_latest_evaluation,
)
from .errors import GateFailed
from .gate import cartridge_evaluate, cartridge_is_committable, evaluation_record
from .retention import versions_prune

log = logging.getLogger("cartridges")


def _usable_evaluation(*, version: CartridgeVersion) -> CartridgeEvaluation | None:
    """The newest evaluation under the active configuration and the current cases, if any."""
    evaluation = version_latest_evaluation(version=version, config_key=active_configuration().key())
    if evaluation is None:
        return None
    if (evaluation.figures.get("accuracy") or {}).get("cases_digest") != evaluation_cases_digest(scope=version.scope):
        return None
    return evaluation


def cartridge_activate(*, version: CartridgeVersion, actor=None, kind: str = "activate") -> CartridgeActivation:
    """Put ``version`` into service for its scope if it passes the gate; raise GateFailed otherwise."""
    if kind not in CartridgeActivation.KINDS:
        raise ValueError(f"`kind` has to be one of {CartridgeActivation.KINDS} but got {kind!r}")
    current = latest_activation(scope=version.scope)
    if current is not None and current.version_id == version.pk and active_version(scope=version.scope) == version:
        return current
    evaluation = _usable_evaluation(version=version)
    if evaluation is None or not evaluation.passed:
        # a stale or failed evaluation is re-run: the blob, the cases or the configuration may have changed
        evaluation = cartridge_evaluate(version=version, actor=actor)
    if not evaluation.passed:
        raise _refused(version=version, evaluation=evaluation, when="did not pass the gate")
    quick = cartridge_is_committable(version=version, model_checks=False)
    if not quick.passed:
        failed = evaluation_record(version=version, result=quick, actor=actor, stage="activation")
        raise _refused(version=version, evaluation=failed, when="failed the gate at activation")
    with transaction.atomic():
        # serialize activations of one scope so two concurrent ones are ordered
        Scope.objects.select_for_update().filter(pk=version.scope_id).first()
        activation = CartridgeActivation.objects.create(
            version=version, scope_id=version.scope_id, evaluation=evaluation, kind=kind, actor=actor
        )
    log.info("cartridge activated version=%s scope=%s kind=%s", version.pk, version.scope_id, kind)
    versions_prune(scope=version.scope)  # retention (services/retention.py): after the new version serves
    return activation


def _refused(*, version: CartridgeVersion, evaluation: CartridgeEvaluation, when: str) -> GateFailed:
    """The refusal of an activation, naming every reason: the previously active version keeps serving."""
    return GateFailed(
        f"version {version.pk} {when} ({len(evaluation.reasons)} reason(s)); the previously active version keeps serving",
        reasons=evaluation.reasons,
        version_id=version.pk,
        evaluation_id=evaluation.pk,
    )


def cartridge_rollback(*, scope, actor=None) -> CartridgeActivation:
    """Activate the scope's newest earlier activated version that still exists, through the gate."""
    current = latest_activation(scope=scope)
    if current is None:
        raise Conflict(f"`scope` '{scope.name}' has never had an active cartridge; nothing to roll back to", extra={"field": "scope"})
    seen = {current.version_id}
    for activation in CartridgeActivation.objects.filter(scope=scope).select_related("version").order_by("-created_at", "-id"):
        version = activation.version
        if version.pk in seen:
            continue
        seen.add(version.pk)
        if hasattr(version, "destruction"):
            continue
        prune = CartridgePrune.objects.filter(version=version).first()
        if prune is not None:
            raise Conflict(
                f"`scope` '{scope.name}''s previous version {version.pk} was pruned by retention "
                f"(keep_previous_versions={prune.keep_previous_versions}); it cannot be restored, compile the scope instead",
                extra={"field": "scope", "version": version.pk, "kind": "version_pruned"},
            )
        return cartridge_activate(version=version, actor=actor, kind="rollback")
    raise Conflict(
        f"`scope` '{scope.name}' has no earlier cartridge version that still exists to roll back to",
        extra={"field": "scope"},
    )
