"""Settings of the cartridge lifecycle, typed and checked, each read from django.conf.settings at call time.

mnesio_site/settings.py reads every one from the environment (with its default and its checks); reading
them here at call time keeps them overridable in tests (pytest-django's ``settings`` fixture), and worker
processes get theirs through the environment as usual. The checks here catch a bad override.
"""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_MISSING = object()


def _float(name: str, *, minimum: float = 0.0, maximum: float | None = None, default: object = _MISSING) -> float:
    raw = getattr(settings, name) if default is _MISSING else getattr(settings, name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(f"`{name}` has to be a number but got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"`{name}` has to be between {minimum} and {maximum} but got {value}")
    return value


def _int(name: str, *, minimum: int = 0, default: object = _MISSING) -> int:
    raw = getattr(settings, name) if default is _MISSING else getattr(settings, name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ImproperlyConfigured(f"`{name}` has to be an integer but got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"`{name}` has to be >= {minimum} but got {value}")
    return value


def _int_setting(name: str, *, minimum: int, doc: str) -> Callable[[], int]:
    """A reader of the integer setting ``name`` (checked at call time, so a test's override is seen)."""

    def read() -> int:
        return _int(name, minimum=minimum)

    read.__name__ = read.__qualname__ = name.lower()
    read.__doc__ = doc
    return read


def _bool(name: str) -> bool:
    raw = getattr(settings, name)
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"`{name}` has to be true or false but got {raw!r}")


def gate_min_fidelity() -> float:
    """Least top-1 next-token agreement with text re-reading on the probes (f32 agrees fully; q4 may not)."""
    return _float("MNESIO_GATE_MIN_FIDELITY", maximum=1.0)


def gate_max_mean_kl() -> float:
    """Most mean KL(f32 || variant) per answer position a quantized or bf16 variant may have (gate check 7)."""
    return _float("MNESIO_GATE_MAX_MEAN_KL")


def gate_min_top1_per_position() -> float:
    """Least top-1 agreement with f32 per answer position a quantized or bf16 variant must reach (gate check 7)."""
    return _float("MNESIO_GATE_MIN_TOP1_PER_POSITION", maximum=1.0)


def gate_accuracy_tolerance() -> float:
    """How far cartridge accuracy on the cases may fall below text re-reading (0 for f32: no loss allowed)."""
    return _float("MNESIO_GATE_ACCURACY_TOLERANCE", maximum=1.0)


def gate_require_retrieval_baseline() -> bool:
    """Whether the cartridge must also match the top-k text retrieval baseline (off: it is recorded only)."""
    return _bool("MNESIO_GATE_REQUIRE_RETRIEVAL")


gate_retrieval_top_k = _int_setting("MNESIO_GATE_RETRIEVAL_TOP_K", minimum=1, doc="How many memories the BM25 retrieval baseline re-reads per question.")
gate_num_auto_probes = _int_setting("MNESIO_GATE_NUM_AUTO_PROBES", minimum=1, doc="How many probe questions are made from the memories (evenly spaced over the log; bounds gate time).")
gate_max_new_tokens = _int_setting("MNESIO_GATE_MAX_NEW_TOKENS", minimum=1, doc="Greedy answer length when scoring evaluation cases (short keeps the gate cheap on CPU).")
gate_fidelity_max_new_tokens = _int_setting("MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS", minimum=1, doc="Greedy length of each fidelity probe (the threshold is on the first token; the rest feeds answers_identical).")
answer_max_new_tokens = _int_setting("MNESIO_ANSWER_MAX_NEW_TOKENS", minimum=1, doc="Greedy answer length of cartridge_answer.")
cartridge_cache_size = _int_setting("MNESIO_CARTRIDGE_CACHE_SIZE", minimum=0, doc="How many loaded cartridges one process keeps (LRU); 0 disables the cache.")


def allowed_models() -> list[str]:
    """Model ids an operator may switch to (the configured default is always allowed)."""
    raw = settings.MNESIO_KV_ALLOWED_MODELS
    # a list, or the environment's comma-separated text set as is
    models = [str(m) for m in raw] if isinstance(raw, (list, tuple)) else [m.strip() for m in str(raw).split(",") if m.strip()]
    default = str(settings.MNESIO_KV_MODEL)
    return models if default in models else [*models, default]


def orphan_blob_grace_s() -> int:
    """Age after which an unclaimed blob is certainly dead: a compile cannot outlive the task's hard limit."""
    if settings.MNESIO_ORPHAN_BLOB_GRACE_S is None:
        return _int("CELERY_TASK_TIME_LIMIT", minimum=1) + 60
    return _int("MNESIO_ORPHAN_BLOB_GRACE_S", minimum=0)


def answer_request_ttl_s() -> int:
    """How long an AnswerRequest waits to be collected before it expires and is swept (default one hour)."""
    return _int("MNESIO_ANSWER_REQUEST_TTL_S", minimum=1)


def store_pause_s() -> float:
    """Fault injection: seconds a compile waits between writing its blobs and recording its version (tests only)."""
    return _float("MNESIO_CARTRIDGE_STORE_PAUSE_S", maximum=600.0)


def compile_pause_s() -> float:
    """Fault injection for tests: sleep this long between opening the log and compiling (0 in production)."""
    return _float("MNESIO_CARTRIDGE_COMPILE_PAUSE_S", maximum=600.0)


max_waiting_asks = _int_setting("MNESIO_MAX_WAITING_ASKS", minimum=1, doc="How many asks one process holds at once before answering 429.")
ask_retry_after_s = _int_setting("MNESIO_ASK_RETRY_AFTER_S", minimum=1, doc="The Retry-After (seconds) of a 429 for too many waiting asks.")
max_pending_async_asks = _int_setting("MNESIO_MAX_PENDING_ASYNC_ASKS", minimum=1, doc="How many unanswered async asks one process files before answering 429.")
max_pending_async_asks_per_user = _int_setting("MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER", minimum=1, doc="How many unanswered async asks one user may have before 429.")
mcp_max_sessions = _int_setting("MNESIO_MCP_MAX_SESSIONS", minimum=1, doc="How many MCP sessions one process keeps open (the SDK answers 503 past it).")
mcp_max_sessions_per_user = _int_setting("MNESIO_MCP_MAX_SESSIONS_PER_USER", minimum=1, doc="How many MCP sessions one user (all their tokens) may hold open in one process before 429.")
mcp_session_idle_s = _int_setting("MNESIO_MCP_SESSION_IDLE_S", minimum=1, doc="Seconds without a request after which an MCP session is closed.")
remote_answer_timeout_s = _int_setting("MNESIO_REMOTE_ANSWER_TIMEOUT_S", minimum=1, doc="How long a model-free web process waits for a gpu worker's answer (then 504).")


def web_loads_model() -> bool:
    """Whether this process answers with its own engine (true) or sends asks to gpu workers (false: no torch)."""
    return _bool("MNESIO_WEB_LOADS_MODEL")


# -- The incremental gate and auto-refresh (mnesio_site/settings.py reads each from the environment).


def gate_full_every() -> int:
    """Every Nth version of an incremental chain runs the full gate (1: always full); the others run incremental."""
    return _int("MNESIO_GATE_FULL_EVERY", minimum=1)


def gate_max_kv_abs_diff() -> float:
    """Most max |KV difference| between the cartridge's new part and its one-pass re-reading (f32: float reordering only)."""
    return _float("MNESIO_GATE_MAX_KV_ABS_DIFF")


def auto_refresh_marker_grace_s() -> int:
    """How long past its debounce a scope's "refresh pending" marker lives (a lost refresh task frees the scope then)."""
    return _int("MNESIO_AUTO_REFRESH_MARKER_GRACE_S", minimum=1)


# -- the routed layout (services/routed_chunks.py, services/routed_answer.py) ----------------------------------------
def routed_repair() -> str:
    """The repair of a routed answer: none | full | first-N | deviation-P% (kvengine.routed.RepairPolicy).

    full by default: the only rung that answers as re-reading the same memories does on SmolLM2-135M (BENCHMARKS.md,
    "Routed cartridges: the repair ladder"); the cheaper ones are for models that tolerate them, checked by the gate.
    """
    return str(getattr(settings, "MNESIO_ROUTED_REPAIR", "full"))


def routed_chunk_quant() -> str:
    """How a routed chunk is stored: q8 (default, ~1/4 of f32) or none (the backend's dtype)."""
    value = str(getattr(settings, "MNESIO_ROUTED_CHUNK_QUANT", "q8"))
    if value not in ("none", "q8"):
        raise ImproperlyConfigured(f"`MNESIO_ROUTED_CHUNK_QUANT` has to be one of ['none', 'q8'] but got {value!r}")
    return value


def routed_top_k() -> int:
    """How many memories a routed answer retrieves at most (BM25, memories.selectors.memory_search)."""
    return max(1, min(100, _int("MNESIO_ROUTED_TOP_K", minimum=1, default=8)))


def routed_token_budget() -> int:
    """Most memory tokens a routed answer assembles (the best-ranked memories that fit, then log order)."""
    return _int("MNESIO_ROUTED_TOKEN_BUDGET", minimum=1, default=2048)


def routed_chunk_cache_size() -> int:
    """How many opened chunks one process keeps (LRU); 0 disables the cache."""
    return _int("MNESIO_ROUTED_CHUNK_CACHE_SIZE", minimum=0, default=512)


def fresh_max_concurrent() -> int:
    """Fresh compiles (services/answer.py) running at once in one process; an ask that finds them all busy is
    answered by its version alone and says so (each holds a private KV copy for its whole answer)."""
    return _int("MNESIO_FRESH_MAX_CONCURRENT", minimum=1)


def fresh_max_memories() -> int:
    """Most memories appended after the serving version that an ask compiles on top of it in memory (services/answer.py,
    "Fresh answers"); past it the version answers alone and says how many it did not read. 0: never."""
    return _int("MNESIO_FRESH_MAX_MEMORIES", minimum=0)
