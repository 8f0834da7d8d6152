"""Cartridge lifecycle rows: configurations, versions and the immutable records of what happened to them.

A version row is never edited: evaluations, activations and destructions are new rows, and a version's
state is derived from them (cartridges.selectors.version_state). On PostgreSQL triggers reject UPDATE and
DELETE of these rows (also through raw SQL); on SQLite the ORM refuses them (ImmutableRowError).
The only mutable-by-deletion table is BlobKey: the wrapped blob key, deleted when a version is
destroyed so that no copy of the ciphertext can ever be opened again.
One module per concern; every model is imported here, so ``from cartridges.models import X`` is the way in
(and migrations name ``cartridges.models.default_auto_refresh``).
"""
from __future__ import annotations

from cartridges.models.answers import AnswerRecord, AnswerRequest
from cartridges.models.blocks import CartridgeBlock, CartridgeBlockDestruction, CartridgePrune, CartridgeVersionBlock
from cartridges.models.keys import BlobKey, ScopeBlockSecret
from cartridges.models.lifecycle import CartridgeActivation, CartridgeDestruction, CartridgeEvaluation, EvaluationCase
from cartridges.models.routed import RoutedChunk
from cartridges.models.scope_settings import (
    DEFAULT_DEBOUNCE_S,
    DEFAULT_KEEP_PREVIOUS_VERSIONS,
    MAX_DEBOUNCE_S,
    MAX_KEEP_PREVIOUS_VERSIONS,
    AutoRefresh,
    Layout,
    ScopeSettings,
    default_auto_refresh,
)
from cartridges.models.versions import CartridgeVersion, CartridgeVersionSubject, KvConfiguration, LifecycleRecord

__all__ = [
    "DEFAULT_DEBOUNCE_S",
    "DEFAULT_KEEP_PREVIOUS_VERSIONS",
    "MAX_DEBOUNCE_S",
    "MAX_KEEP_PREVIOUS_VERSIONS",
    "AnswerRecord",
    "AnswerRequest",
    "AutoRefresh",
    "BlobKey",
    "CartridgeActivation",
    "CartridgeBlock",
    "CartridgeBlockDestruction",
    "CartridgeDestruction",
    "CartridgeEvaluation",
    "CartridgePrune",
    "CartridgeVersion",
    "CartridgeVersionBlock",
    "CartridgeVersionSubject",
    "EvaluationCase",
    "KvConfiguration",
    "Layout",
    "LifecycleRecord",
    "RoutedChunk",
    "ScopeBlockSecret",
    "ScopeSettings",
    "default_auto_refresh",
]
