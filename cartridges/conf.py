"""Settings of the cartridge lifecycle, each read from django.conf.settings at call time and checked against its
declaration (core/settings_spec.py: type, bounds and help are declared there once).

mnesio_site/settings.py reads every one from the environment; reading them here at call time keeps them
overridable in tests (pytest-django's ``settings`` fixture), and the check catches a bad override with the same
ImproperlyConfigured as a bad environment value. Worker processes get theirs through the environment as usual.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings

from core.settings_spec import SETTINGS


def value(name: str) -> Any:
    """The setting ``name`` as django.conf.settings holds it now, checked against its declaration."""
    return SETTINGS[name].check(getattr(settings, name))


def _reader(name: str) -> Callable[[], Any]:
    """A reader of the setting ``name`` (checked at call time, so a test's override is seen); its help is its doc."""

    def read() -> Any:
        return value(name)

    read.__name__ = read.__qualname__ = name.removeprefix("MNESIO_").lower()
    read.__doc__ = f"{SETTINGS[name].help} (``{name}``)"
    return read


gate_min_fidelity = _reader("MNESIO_GATE_MIN_FIDELITY")
gate_max_mean_kl = _reader("MNESIO_GATE_MAX_MEAN_KL")
gate_min_top1_per_position = _reader("MNESIO_GATE_MIN_TOP1_PER_POSITION")
gate_accuracy_tolerance = _reader("MNESIO_GATE_ACCURACY_TOLERANCE")
gate_require_retrieval_baseline = _reader("MNESIO_GATE_REQUIRE_RETRIEVAL")
gate_retrieval_top_k = _reader("MNESIO_GATE_RETRIEVAL_TOP_K")
gate_num_auto_probes = _reader("MNESIO_GATE_NUM_AUTO_PROBES")
gate_max_new_tokens = _reader("MNESIO_GATE_MAX_NEW_TOKENS")
gate_fidelity_max_new_tokens = _reader("MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS")
gate_full_every = _reader("MNESIO_GATE_FULL_EVERY")
gate_max_kv_abs_diff = _reader("MNESIO_GATE_MAX_KV_ABS_DIFF")
auto_refresh_marker_grace_s = _reader("MNESIO_AUTO_REFRESH_MARKER_GRACE_S")
answer_max_new_tokens = _reader("MNESIO_ANSWER_MAX_NEW_TOKENS")
answer_request_ttl_s = _reader("MNESIO_ANSWER_REQUEST_TTL_S")
cartridge_cache_size = _reader("MNESIO_CARTRIDGE_CACHE_SIZE")
store_pause_s = _reader("MNESIO_CARTRIDGE_STORE_PAUSE_S")
compile_pause_s = _reader("MNESIO_CARTRIDGE_COMPILE_PAUSE_S")
max_waiting_asks = _reader("MNESIO_MAX_WAITING_ASKS")
ask_retry_after_s = _reader("MNESIO_ASK_RETRY_AFTER_S")
max_pending_async_asks = _reader("MNESIO_MAX_PENDING_ASYNC_ASKS")
max_pending_async_asks_per_user = _reader("MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER")
mcp_max_sessions = _reader("MNESIO_MCP_MAX_SESSIONS")
mcp_max_sessions_per_user = _reader("MNESIO_MCP_MAX_SESSIONS_PER_USER")
mcp_session_idle_s = _reader("MNESIO_MCP_SESSION_IDLE_S")
remote_answer_timeout_s = _reader("MNESIO_REMOTE_ANSWER_TIMEOUT_S")
web_loads_model = _reader("MNESIO_WEB_LOADS_MODEL")
fresh_max_concurrent = _reader("MNESIO_FRESH_MAX_CONCURRENT")
fresh_max_memories = _reader("MNESIO_FRESH_MAX_MEMORIES")
# the routed layout (services/routed_chunks.py, services/routed_answer.py); the repair is parsed by
# services.routed_chunks.repair_policy into a kvengine.routed.RepairPolicy
routed_repair = _reader("MNESIO_ROUTED_REPAIR")
routed_chunk_quant = _reader("MNESIO_ROUTED_CHUNK_QUANT")
routed_top_k = _reader("MNESIO_ROUTED_TOP_K")
routed_token_budget = _reader("MNESIO_ROUTED_TOKEN_BUDGET")
routed_chunk_cache_size = _reader("MNESIO_ROUTED_CHUNK_CACHE_SIZE")


def allowed_models() -> list[str]:
    """Model ids an operator may switch to (the configured default is always allowed)."""
    models = value("MNESIO_KV_ALLOWED_MODELS")
    default = str(settings.MNESIO_KV_MODEL)
    return models if default in models else [*models, default]


def orphan_blob_grace_s() -> int:
    """Age after which an unclaimed blob is certainly dead: a compile cannot outlive the task's hard limit."""
    grace = value("MNESIO_ORPHAN_BLOB_GRACE_S")
    return value("CELERY_TASK_TIME_LIMIT") + 60 if grace is None else grace
