"""A scope's cartridge settings (layout, refresh on append, retention), their defaults and bounds."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from cartridges.models.versions import LifecycleRecord
from core.models import append_only_triggers


class Layout(models.TextChoices):
    PREFIX = "prefix"  # one causal prefix cartridge: exact, bounded by the model's window
    ROUTED = "routed"  # one chunk per memory, the question's memories assembled per ask (services/routed.py)
    AUTO = "auto"  # prefix while the scope fits the model's window, routed past it


class AutoRefresh(models.TextChoices):
    MANUAL = "manual"  # a cartridge is compiled when a client or an operator asks
    ON_APPEND = "on_append"  # recompile after appends, at most once per debounce window (the default)


# A new scope's refresh: on append by default (MNESIO_DEFAULT_AUTO_REFRESH), after a short wait. Asks read the
# memories after the serving version in the meantime (services/serving.py, "Fresh answers"), so the debounce bounds
# how long each ask pays that extra compile, and 2 s still folds an agent's burst of appends into one compile + gate.
DEFAULT_DEBOUNCE_S = 2


def default_auto_refresh() -> str:
    """A new scope's refresh: MNESIO_DEFAULT_AUTO_REFRESH (on_append unless the deployment says manual)."""
    from django.conf import settings

    return settings.MNESIO_DEFAULT_AUTO_REFRESH


# Bounds of the scope settings, checked by the service (a 400 naming the field) and by the database.
MAX_DEBOUNCE_S = 86_400  # a day: a longer wait is "manual" in practice
MAX_KEEP_PREVIOUS_VERSIONS = 1_000
# Versions kept restorable before the active one unless a scope says otherwise. A version is a materialized view of
# the log: a pruned one is rebuilt by compiling at its head, so a few for quick rollback are enough, and each kept
# version keeps its tail (up to half a block of KV, ~6 MB at f32) and the blocks only it uses.
DEFAULT_KEEP_PREVIOUS_VERSIONS = 3


class ScopeSettings(LifecycleRecord):
    """One change of a scope's cartridge settings; the scope's newest row is in force (none: the defaults).

    Append-only like KvConfiguration: a change is a new row naming who made it, so the history of who set
    what is kept without an audit table. The defaults: refresh on append after DEFAULT_DEBOUNCE_S, the
    DEFAULT_KEEP_PREVIOUS_VERSIONS versions before the active one kept (null keeps every one). ``keep_previous_versions`` is applied after every
    activation (services/retention.py).
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="settings_changes")
    auto_refresh = models.CharField(max_length=16, choices=AutoRefresh.choices, default=default_auto_refresh)
    # the wait after an append before an `on_append` refresh (appends within it share one compile)
    auto_refresh_debounce_s = models.PositiveIntegerField(default=DEFAULT_DEBOUNCE_S)
    # how many versions before the active one to keep; null keeps every one
    keep_previous_versions = models.PositiveIntegerField(null=True, blank=True, default=DEFAULT_KEEP_PREVIOUS_VERSIONS)
    # auto: a scope that fits keeps today's exact prefix cartridge, one that grows past the window is still answered
    layout = models.CharField(max_length=8, choices=Layout.choices, default=Layout.AUTO)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(LifecycleRecord.Meta):
        verbose_name_plural = "scope settings"
        triggers = append_only_triggers("scopesettings_")
        permissions = [("change_scope_settings", "Can change a scope's cartridge settings (auto-refresh, retention)")]
        indexes = [models.Index(fields=["scope", "-id"], name="cartridges_scopeset_newest")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(auto_refresh__in=AutoRefresh.values), name="cartridges_scopesettings_auto_refresh"
            ),
            models.CheckConstraint(
                condition=models.Q(auto_refresh_debounce_s__lte=MAX_DEBOUNCE_S),
                name="cartridges_scopesettings_debounce_bounded",
            ),
            models.CheckConstraint(
                condition=models.Q(keep_previous_versions__isnull=True)
                | models.Q(keep_previous_versions__lte=MAX_KEEP_PREVIOUS_VERSIONS),
                name="cartridges_scopesettings_keep_bounded",
            ),
            models.CheckConstraint(condition=models.Q(layout__in=Layout.values), name="cartridges_scopesettings_layout"),
        ]

    def __str__(self) -> str:
        return f"settings of scope {self.scope_id}: {self.auto_refresh}"
