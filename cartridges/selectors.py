"""Reads of the cartridge lifecycle: the active configuration, what serves a scope, a version's state."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet, Subquery

from core.errors import NotFound
from kvengine import KvConfig
from kvengine.base import canonical_json
from memories import crypto
from memories.models import Memory

from .models import (
    CartridgeActivation,
    CartridgeDestruction,
    CartridgeEvaluation,
    CartridgeVersion,
    EvaluationCase,
    KvConfiguration,
    ScopeSettings,
)


@dataclass(frozen=True)
class ActiveConfiguration:
    """The engine configuration in force: the newest KvConfiguration row, else the MNESIO_KV_* settings.

    ``config`` is the engine's one configuration type (kvengine.KvConfig); the device and the row are what
    this process and the operator history add to it.
    """

    config: KvConfig
    device: str  # per process, from MNESIO_KV_DEVICE; not part of compatibility
    row: KvConfiguration | None  # None: no operator switch yet, the settings default applies

    backend = property(lambda self: self.config.backend)
    model = property(lambda self: self.config.model)
    dtype = property(lambda self: self.config.dtype)
    quant = property(lambda self: self.config.quant)

    def key(self) -> str:
        """The configuration's key (KvConfig.key), stored with evaluations."""
        return self.config.key

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "model": self.model,
            "dtype": self.dtype,
            "quant": self.quant,
            "device": self.device,
            "id": self.row.pk if self.row else None,
            "source": "row" if self.row else "settings",
        }


def active_configuration() -> ActiveConfiguration:
    """Return the configuration in force (the newest operator switch, else the settings)."""
    device = str(settings.MNESIO_KV_DEVICE)
    row = KvConfiguration.objects.order_by("-created_at", "-id").first()
    if row is not None:
        return ActiveConfiguration(row.config, device, row)
    config = KvConfig(
        str(settings.MNESIO_KV_BACKEND), str(settings.MNESIO_KV_MODEL), str(settings.MNESIO_KV_DTYPE),
        str(settings.MNESIO_KV_QUANT),
    )
    return ActiveConfiguration(config, device, None)


def kv_configurations() -> QuerySet[KvConfiguration]:
    """Every configuration switch, newest first."""
    return KvConfiguration.objects.order_by("-created_at", "-id")


def latest_activation(*, scope) -> CartridgeActivation | None:
    """The scope's newest activation (what the scope has been told to serve), or None."""
    return (
        CartridgeActivation.objects.filter(scope=scope)
        .select_related("version", "version__destruction")
        .order_by("-created_at", "-id")
        .first()
    )


def version_is_destroyed(*, version: CartridgeVersion) -> bool:
    """Whether the version's blob and blob key were destroyed."""
    return CartridgeDestruction.objects.filter(version=version).exists()


def version_erased_subjects(*, version: CartridgeVersion) -> list[str]:
    """External ids of shredded subjects among the memories the version's manifest lists.

    Read from the protected manifest and log rows (never from the CartridgeVersionSubject index, which
    nothing reads any more): even if an erasure missed the version, it can no longer serve or pass the gate.
    """
    seqs = [entry[0] for entry in version.manifest.get("entries", [])]
    # a forgotten memory (or one of a deleted scope) counts as well: its own key is shredded (one query for both)
    rows = Memory.objects.filter(
        Q(subject__shredded_at__isnull=False) | Q(own_key__shredded_at__isnull=False),
        scope_id=version.scope_id, seq__in=seqs,
    ).values_list("seq", "subject__external_id", "subject__shredded_at")
    return sorted({external_id if shredded_at is not None else f"memory #{seq}" for seq, external_id, shredded_at in rows})


def active_version(*, scope, configuration: ActiveConfiguration | None = None) -> CartridgeVersion | None:
    """The version that serves ``scope`` now, or None.

    That is the version of the scope's newest activation, as long as it is not destroyed, was compiled
    under the active configuration and lists no memory of an erased subject. There is no silent fallback to an older activation: a destroyed or
    out-of-configuration cartridge leaves the scope without one until a new version is activated
    (or an operator rolls back explicitly).
    """
    activation = latest_activation(scope=scope)
    if activation is None:
        return None
    version = activation.version
    if version_is_destroyed(version=version):
        return None
    config = configuration or active_configuration()
    if version.config != config.config:
        return None
    if version_erased_subjects(version=version):
        return None
    return version


def scope_versions(*, scope) -> QuerySet[CartridgeVersion]:
    """The scope's versions, newest first."""
    return CartridgeVersion.objects.filter(scope=scope).select_related("configuration").order_by("-id")


def version_get(*, scope, pk: int) -> CartridgeVersion:
    """Return the scope's version ``pk`` or raise NotFound naming `version`."""
    version = CartridgeVersion.objects.filter(scope=scope, pk=pk).first()
    if version is None:
        raise NotFound(f"`version` {pk} is not a cartridge version of scope '{scope.name}'", extra={"field": "version"})
    return version


def version_latest_evaluation(*, version: CartridgeVersion, config_key: str | None = None) -> CartridgeEvaluation | None:
    """The newest evaluation of ``version`` (under ``config_key`` when given)."""
    rows = CartridgeEvaluation.objects.filter(version=version)
    if config_key is not None:
        rows = rows.filter(config_key=config_key)
    return rows.order_by("-created_at", "-id").first()


def versions_with_state(versions: QuerySet[CartridgeVersion]) -> QuerySet[CartridgeVersion]:
    """Annotate what a version's state is derived from, so a whole page needs no query per row.

    ``is_destroyed`` and ``was_activated`` (Exists), the newest evaluation's verdict and the version of the
    scope's newest activation (Subquery); ``versions_states`` finishes the derivation.
    """
    newest_evaluation = CartridgeEvaluation.objects.filter(version=OuterRef("pk")).order_by("-created_at", "-id")
    scope_newest_activation = CartridgeActivation.objects.filter(scope=OuterRef("scope_id")).order_by("-created_at", "-id")
    return versions.annotate(
        is_destroyed=Exists(CartridgeDestruction.objects.filter(version=OuterRef("pk"))),
        was_activated=Exists(CartridgeActivation.objects.filter(version=OuterRef("pk"))),
        newest_evaluation_passed=Subquery(newest_evaluation.values("passed")[:1]),
        scope_activated_version_id=Subquery(scope_newest_activation.values("version_id")[:1]),
    )


def versions_serving(versions: Iterable[CartridgeVersion], *, configuration: ActiveConfiguration | None = None) -> set[int]:
    """Ids among ``versions`` (annotated by ``versions_with_state``) that serve their scope: ``active_version``'s rule.

    The version of the scope's newest activation, not destroyed, compiled under the active configuration and
    listing no memory of an erased subject (one query for all of them, read from the manifests as
    ``version_erased_subjects`` does).
    """
    candidates = [v for v in versions if not v.is_destroyed and v.scope_activated_version_id == v.pk]
    if not candidates:
        return set()
    config = configuration or active_configuration()
    matching = [v for v in candidates if v.config == config.config]
    if not matching:
        return set()
    listed = Q(pk__in=[])
    for version in matching:  # one scope per candidate: each is its scope's newest activation
        listed |= Q(scope_id=version.scope_id, seq__in=[entry[0] for entry in version.manifest.get("entries", [])])
    erased = Q(subject__shredded_at__isnull=False) | Q(own_key__shredded_at__isnull=False)
    erased_scopes = set(Memory.objects.filter(listed, erased).values_list("scope_id", flat=True).distinct())
    return {v.pk for v in matching if v.scope_id not in erased_scopes}


def versions_states(versions: Iterable[CartridgeVersion], *, configuration: ActiveConfiguration | None = None) -> dict[int, str]:
    """The state of each version annotated by ``versions_with_state``: see ``version_state``."""
    versions = list(versions)
    serving = versions_serving(versions, configuration=configuration)
    states = {}
    for version in versions:
        if version.is_destroyed:
            states[version.pk] = "destroyed"
        elif version.pk in serving:
            states[version.pk] = "active"
        elif version.was_activated:
            states[version.pk] = "superseded"
        elif version.newest_evaluation_passed is not None:
            states[version.pk] = "passed" if version.newest_evaluation_passed else "failed"
        else:
            states[version.pk] = "compiled"
    return states


def version_state(*, version: CartridgeVersion) -> str:
    """Derive the state: "destroyed", "active", "superseded", "failed", "passed" or "compiled"."""
    annotated = versions_with_state(CartridgeVersion.objects.filter(pk=version.pk))
    return versions_states(annotated)[version.pk]


def _history(version: CartridgeVersion, evaluations: Iterable[CartridgeEvaluation],
             activations: Iterable[CartridgeActivation], destruction: CartridgeDestruction | None,
             actor: Callable[[Any, int | None], Any]) -> list[dict[str, Any]]:
    """The version's events, oldest first; ``actor(user, user_id)`` says how each actor is shown."""
    events: list[dict[str, Any]] = [
        {"event": "compiled", "at": version.created_at, "actor": actor(lambda: version.created_by, version.created_by_id),
         "log_head": version.log_head}
    ]
    for ev in evaluations:
        events.append({"event": "evaluated", "at": ev.created_at, "actor": actor(lambda ev=ev: ev.created_by, ev.created_by_id),
                       "passed": ev.passed, "reasons": ev.reasons, "evaluation": ev.pk})
    for act in activations:
        events.append({"event": "activated", "at": act.created_at, "actor": actor(lambda act=act: act.actor, act.actor_id),
                       "kind": act.kind, "activation": act.pk})
    if destruction is not None:
        events.append({"event": "destroyed", "at": destruction.created_at,
                       "actor": actor(lambda: destruction.actor, destruction.actor_id),
                       "reason": destruction.reason, "erasure_request": destruction.erasure_request_id})
    events.sort(key=lambda e: e["at"])
    return events


def version_history(*, version: CartridgeVersion) -> list[dict[str, Any]]:
    """Every recorded event of the version, oldest first: compiled, evaluated, activated, destroyed (actor ids)."""
    return _history(
        version,
        CartridgeEvaluation.objects.filter(version=version).order_by("created_at", "id"),
        CartridgeActivation.objects.filter(version=version).order_by("created_at", "id"),
        CartridgeDestruction.objects.filter(version=version).first(),
        lambda user, user_id: user_id,
    )


@dataclass(frozen=True)
class VersionRead:
    """A version as the API shows it: the row, its derived state and its history (actors by username)."""

    version: CartridgeVersion
    state: str
    history: list[dict[str, Any]]


def versions_for_display(versions: QuerySet[CartridgeVersion]) -> QuerySet[CartridgeVersion]:
    """``versions`` with what ``versions_read`` renders: state annotations, scope, actors, history rows."""
    return versions_with_state(versions).select_related("scope", "created_by", "destruction__actor").prefetch_related(
        Prefetch("evaluations", queryset=CartridgeEvaluation.objects.select_related("created_by").order_by("created_at", "id")),
        Prefetch("activations", queryset=CartridgeActivation.objects.select_related("actor").order_by("created_at", "id")),
    )


def version_read(*, scope, pk: int) -> VersionRead:
    """Read the scope's version ``pk`` with its state and history, or raise NotFound naming `version`."""
    version = version_get(scope=scope, pk=pk)
    [read] = versions_read(versions_for_display(CartridgeVersion.objects.filter(pk=version.pk)))
    return read


def _username(user: Callable[[], Any], user_id: int | None) -> str | None:
    return user().get_username() if user_id is not None else None


def versions_read(versions: Iterable[CartridgeVersion]) -> list[VersionRead]:
    """Read a page of versions fetched with ``versions_for_display``: a fixed number of queries, whatever its size."""
    versions = list(versions)
    states = versions_states(versions)
    reads = []
    for version in versions:
        destruction = getattr(version, "destruction", None) if version.is_destroyed else None
        history = _history(version, version.evaluations.all(), version.activations.all(), destruction, _username)
        reads.append(VersionRead(version=version, state=states[version.pk], history=history))
    return reads


def evaluation_case_aad(case_id: int, part: str) -> bytes:
    """Associated data of an evaluation case's wrapped key (``part="key"``) and sealed content (``"content"``)."""
    return f"mnesio:evaluation-case:v1|{case_id}|{part}".encode()


@dataclass(frozen=True)
class OpenedCase:
    """An evaluation case as a reader sees it: question and answers, or None for both once erased."""

    id: int
    scope_id: int
    question: str | None
    answers: list[str] | None
    subjects: list[str]  # external ids of the subjects it concerns
    erased_at: dt.datetime | None
    created_at: dt.datetime

    @property
    def erased(self) -> bool:
        return self.question is None


def evaluation_case_open(*, case: EvaluationCase) -> OpenedCase:
    """Open one case (unwrap its key, unseal its content); an erased case opens as erased, with no text."""
    question = answers = None
    if case.erased_at is None and case.wrapped_key is not None and case.sealed is not None:
        key = crypto.unwrap(bytes(case.wrapped_key), wrapped_by=case.wrapped_by, aad=evaluation_case_aad(case.pk, "key"))
        content = json.loads(crypto.open_box(key, case.sealed, aad=evaluation_case_aad(case.pk, "content")))
        question, answers = content["question"], list(content["answers"])
    return OpenedCase(
        id=case.pk, scope_id=case.scope_id, question=question, answers=answers,
        subjects=[s.external_id for s in case.subjects.all()], erased_at=case.erased_at, created_at=case.created_at,
    )


def scope_evaluation_cases(*, scope) -> QuerySet[EvaluationCase]:
    """The operator's evaluation cases of ``scope`` (erased ones included), oldest first, still sealed."""
    return EvaluationCase.objects.filter(scope=scope).prefetch_related("subjects").order_by("id")


def scope_evaluation_cases_open(*, scope) -> list[OpenedCase]:
    """The scope's cases that are not erased, opened: what the gate scores (erased ones are skipped)."""
    return [evaluation_case_open(case=c) for c in scope_evaluation_cases(scope=scope).filter(erased_at__isnull=True)]


def scope_evaluation_cases_num_erased(*, scope) -> int:
    """How many of the scope's cases are erased (the gate records it beside the cases it scored)."""
    return EvaluationCase.objects.filter(scope=scope, erased_at__isnull=False).count()


def evaluation_cases_digest(*, scope) -> str:
    """A digest of the scope's live cases: an evaluation made before a case was added or erased is stale.

    Cases are never edited, so their ids say which were scored; hashing ids only keeps this readable
    without the master key (activation checks it) and holds no case text.
    """
    ids = list(EvaluationCase.objects.filter(scope=scope, erased_at__isnull=True).order_by("id").values_list("id", flat=True))
    return hashlib.sha256(canonical_json(["live-case-ids", ids]).encode()).hexdigest()


@dataclass(frozen=True)
class ScopeSettingsRead:
    """A scope's settings in force: its newest ScopeSettings row, else the defaults (today's behaviour)."""

    scope: str
    auto_refresh: str
    auto_refresh_debounce_s: int
    keep_previous_versions: int | None  # None: every previous version is kept
    layout: str  # prefix | routed | auto (models.Layout)
    updated_at: dt.datetime | None  # None: never changed, the defaults apply
    updated_by: str | None


def scope_settings_get(*, scope) -> ScopeSettingsRead:
    """Return the settings in force for ``scope`` (one query)."""
    row = ScopeSettings.objects.filter(scope=scope).select_related("created_by").order_by("-id").first()
    if row is None:
        defaults = {field.name: field.get_default() for field in ScopeSettings._meta.get_fields() if field.concrete}
        return ScopeSettingsRead(
            scope=scope.name,
            auto_refresh=defaults["auto_refresh"],
            auto_refresh_debounce_s=defaults["auto_refresh_debounce_s"],
            keep_previous_versions=defaults["keep_previous_versions"],
            layout=defaults["layout"],
            updated_at=None,
            updated_by=None,
        )
    return ScopeSettingsRead(
        scope=scope.name,
        auto_refresh=row.auto_refresh,
        auto_refresh_debounce_s=row.auto_refresh_debounce_s,
        keep_previous_versions=row.keep_previous_versions,
        layout=row.layout,
        updated_at=row.created_at,
        updated_by=row.created_by.get_username() if row.created_by_id else None,
    )
