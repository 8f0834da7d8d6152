"""mnesio settings: twelve-factor, read from the environment, in one file and the pieces it calls.

Every knob is an environment variable. The embedded default needs nothing running:
SQLite in ``var/`` and Celery tasks executed in-process. Point ``DATABASE_URL`` at
PostgreSQL and ``REDIS_URL`` at Redis for a real deployment (see docs/operating.md).
"""
from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from core.keys import parse_master_key
from core.settings_spec import read
from mnesio_site.settings_parts import api, log_config
from mnesio_site.settings_parts.database import envdatabase
from mnesio_site.settings_parts.storage import cartridge_blob_storage

BASE_DIR = Path(__file__).resolve().parent.parent

# Every variable is declared once, with its type, default, bounds and help, in core/settings_spec.py; ``read``
# parses it from the environment and fails loudly (ImproperlyConfigured naming the variable, what it accepts and
# what it got). docs/configuration.md is generated from the same declaration. The larger values are built by
# mnesio_site/settings_parts/, which reads its variables the same way.

# ---------------------------------------------------------------------------
# Core Django
# ---------------------------------------------------------------------------
# Off unless asked for: only bin/run (the embedded demo) sets MNESIO_DEBUG=true. With debug off, SECRET_KEY and
# the master key must be set (the test suite sets test values: tests/settings.py).
DEBUG = read("MNESIO_DEBUG")
# Error pages and error log records show tracebacks without any variable's value, in debug or not
# (frame variables hold master-key bytes, data keys and memory plaintext).
DEFAULT_EXCEPTION_REPORTER_FILTER = "mnesio_site.debug.SecretsExceptionReporterFilter"
# Where the embedded default keeps its SQLite file, blobs, dev master key and model cache.
DATA_DIR = Path(read("MNESIO_DATA_DIR", default=BASE_DIR / "var")).resolve()

SECRET_KEY = read("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("`SECRET_KEY` (or `SECRET_KEY_FILE`) must be set when MNESIO_DEBUG is false")
    SECRET_KEY = "mnesio-insecure-development-key-do-not-use-in-production"

ALLOWED_HOSTS = read("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = read("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    # Only for memories/migrations/0003_api_tokens_hashed.py, which converts its plaintext tokens into knox's.
    "rest_framework.authtoken",
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc assets from the package: the docs work offline
    "pgtrigger",
    "core",
    "memories",
    "cartridges",
]

MIDDLEWARE = [
    # /healthz and /readyz answer first: no https redirect, host check, session or auth for a probe (mnesio_site/health.py)
    "mnesio_site.health.HealthMiddleware",
    # a request id for every log line of the request (X-Request-ID in and out) and the per-route latency histogram
    "core.observability.RequestIdMiddleware",
    # a body over DATA_UPLOAD_MAX_MEMORY_SIZE is a JSON 413 on the API before anything reads it (mnesio_site/limits.py)
    "mnesio_site.limits.RequestBodyLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # static files from STATIC_ROOT (bin/serve collects them): the production server serves the admin's CSS itself
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "core.middleware.MasterKeyUnavailableMiddleware",  # a wrong master key is a JSON 503, not a 500
    "mnesio_site.versioning.AliasDeprecationMiddleware",  # /api/... (unversioned) answers say: use /api/v1/
]

ROOT_URLCONF = "mnesio_site.urls"
WSGI_APPLICATION = "mnesio_site.wsgi.application"
ASGI_APPLICATION = "mnesio_site.asgi.application"  # what bin/serve runs (gunicorn + uvicorn workers)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = read("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'mnesio.sqlite3'}")
if DATABASE_URL.startswith("sqlite:") and DATABASE_URL.startswith(f"sqlite:///{DATA_DIR}"):
    # The embedded default keeps its file in DATA_DIR; a fresh checkout has none yet.
    DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {"default": envdatabase("DATABASE_URL", DATABASE_URL, conn_max_age=read("DB_CONN_MAX_AGE"))}
# SQLite's connections wait for the write lock and take it at BEGIN (settings_parts/database.py says why)
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
MEDIA_ROOT = read("MNESIO_MEDIA_ROOT", default=DATA_DIR / "media")

# Cartridge blobs: local files under DATA_DIR by default, an S3 bucket, or a named storage (settings_parts/storage.py).
MNESIO_BLOB_STORAGE = read("MNESIO_BLOB_STORAGE")
MNESIO_BLOB_STORAGE_BACKEND = read("MNESIO_BLOB_STORAGE_BACKEND")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "cartridges": cartridge_blob_storage(
        storage=MNESIO_BLOB_STORAGE, backend=MNESIO_BLOB_STORAGE_BACKEND, data_dir=DATA_DIR
    ),
}

# Production hardening: on unless debugging (``manage.py check --deploy`` is clean with MNESIO_DEBUG=false).
SECURE_SSL_REDIRECT = read("SECURE_SSL_REDIRECT", default=not DEBUG)
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = read("SECURE_HSTS_SECONDS", default=0 if DEBUG else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if read("MNESIO_BEHIND_PROXY") else None

# ---------------------------------------------------------------------------
# Master key: wraps every subject/scope data key (AES-256-GCM)
# ---------------------------------------------------------------------------
# Base64 of 32 random bytes, from MNESIO_MASTER_KEY or the file MNESIO_MASTER_KEY_FILE.
# With neither set and MNESIO_DEBUG on, a development key is generated once in DATA_DIR
# (memories.keys reads MNESIO_MASTER_KEY_DEV_FILE); with MNESIO_DEBUG off it is an error.
_master_raw = read("MNESIO_MASTER_KEY")
MNESIO_MASTER_KEY: bytes | None = parse_master_key(_master_raw, name="MNESIO_MASTER_KEY") if _master_raw else None
if MNESIO_MASTER_KEY is None and not DEBUG:
    raise ImproperlyConfigured("`MNESIO_MASTER_KEY` (or `MNESIO_MASTER_KEY_FILE`) must be set when MNESIO_DEBUG is false")
MNESIO_MASTER_KEY_DEV_FILE = DATA_DIR / "master.key"
# The previous master key during a rotation: keys wrapped by it are still opened and re-wrapped.
_old_raw = read("MNESIO_MASTER_KEY_OLD")
MNESIO_MASTER_KEY_OLD: bytes | None = parse_master_key(_old_raw, name="MNESIO_MASTER_KEY_OLD") if _old_raw else None

# Largest memory content accepted by the API, in UTF-8 bytes (docs/guarantees.md, Limits).
MNESIO_MAX_MEMORY_BYTES = read("MNESIO_MAX_MEMORY_BYTES")
# The optional metadata of one memory, as canonical JSON (memories.services.metadata_validate).
MNESIO_MAX_METADATA_BYTES = read("MNESIO_MAX_METADATA_BYTES")
# Largest question accepted by the API, in characters.
MNESIO_MAX_QUESTION_CHARS = read("MNESIO_MAX_QUESTION_CHARS")
# What else one appended memory may carry, and how many memories one batch append takes (read by
# memories.services.validation; the subject is also a column of that width, memories.models.Subject).
MNESIO_MAX_SUBJECT_CHARS = 200
MNESIO_MAX_IDEMPOTENCY_KEY_CHARS = 200
MNESIO_MAX_BATCH_ITEMS = 1000  # one request, one transaction: 1,000 rows of at most 8 KiB stay well under a second
# The largest request body, derived from the limits above so that a batch at every documented limit fits however
# its JSON is written: a byte of UTF-8 content or metadata takes at most 6 bytes of JSON (a control character is
# escaped as \u0001), a character of a subject or key at most 12 (an astral one: two \uXXXX escapes), plus 256 bytes
# per item of field names, punctuation and indentation. A larger body is refused before it is read
# (mnesio_site.limits: a JSON 413 `body_too_large` on /api/ and /v1/); so is one over this for Django's form parsing.
JSON_BYTES_PER_UTF8_BYTE = 6
DATA_UPLOAD_MAX_MEMORY_SIZE = MNESIO_MAX_BATCH_ITEMS * (
    JSON_BYTES_PER_UTF8_BYTE * (MNESIO_MAX_MEMORY_BYTES + MNESIO_MAX_METADATA_BYTES)
    + 12 * (MNESIO_MAX_SUBJECT_CHARS + MNESIO_MAX_IDEMPOTENCY_KEY_CHARS)
    + 256
) + 4096

# ---------------------------------------------------------------------------
# KV engine defaults (an operator can switch the active configuration at runtime)
# ---------------------------------------------------------------------------
MNESIO_KV_BACKEND = read("MNESIO_KV_BACKEND")
# The fake engine answers with whole memory texts: tests only (the suite turns this on, tests/settings.py).
MNESIO_ALLOW_FAKE_BACKEND = read("MNESIO_ALLOW_FAKE_BACKEND")
if MNESIO_KV_BACKEND == "fake" and not MNESIO_ALLOW_FAKE_BACKEND:
    raise ImproperlyConfigured(
        "`MNESIO_KV_BACKEND` 'fake' answers with whole memory texts and is for tests only: it has to be "
        "'transformers' unless `MNESIO_ALLOW_FAKE_BACKEND=true`"
    )
MNESIO_KV_MODEL = read("MNESIO_KV_MODEL")
MNESIO_KV_DTYPE = read("MNESIO_KV_DTYPE")
MNESIO_KV_QUANT = read("MNESIO_KV_QUANT")
MNESIO_KV_DEVICE = read("MNESIO_KV_DEVICE")
# Tokens per KV block (transformers backend, kvengine/blocks.py): an append recomputes the last partial block plus
# the new memory, so smaller blocks refresh faster; a full compile runs one pass per block, so larger blocks compile
# faster (BENCHMARKS.md, "Blocks of 64 tokens"). A multiple of 64, so no quantization group (q8 16, q4 64 tokens)
# straddles or pads a block. Changing it makes new block ids: a scope's next compile reuses no stored block. At most
# 8192 (SmolLM2's whole window): a larger block is never full, so every append would recompute the whole scope.
MNESIO_KV_BLOCK_SIZE = read("MNESIO_KV_BLOCK_SIZE")
# Single-token decoding steps through torch.compile (kvengine/compiled.py): off by default, compiled as the model loads.
MNESIO_KV_COMPILE_STEP = read("MNESIO_KV_COMPILE_STEP")
# Converted model weights and other engine caches.
MNESIO_MODEL_CACHE_DIR = read("MNESIO_MODEL_CACHE_DIR", default=Path.home() / ".cache" / "mnesio")
# How many loaded cartridges a worker keeps in memory (LRU); 0 disables the cache.
MNESIO_CARTRIDGE_CACHE_SIZE = read("MNESIO_CARTRIDGE_CACHE_SIZE")
# Model ids an operator may switch to (cartridges.conf.allowed_models adds the configured default).
MNESIO_KV_ALLOWED_MODELS = read("MNESIO_KV_ALLOWED_MODELS")

# Whether /readyz waits for the active model to be loaded in this process (the web process answers questions);
# false for a process that never answers.
MNESIO_READYZ_MODEL = read("MNESIO_READYZ_MODEL")
# How long a process reuses its /readyz blob storage check (a write, a read and a delete: three S3 requests), seconds.
MNESIO_READYZ_STORAGE_CACHE_S = read("MNESIO_READYZ_STORAGE_CACHE_S")

# ---------------------------------------------------------------------------
# Cartridge lifecycle: the gate and serving (read at call time through cartridges.conf, so the tests'
# ``settings`` fixture overrides them; worker processes get them through the environment)
# ---------------------------------------------------------------------------
# Least top-1 next-token agreement with text re-reading on the probes (f32 agrees fully; q4 may not).
MNESIO_GATE_MIN_FIDELITY = read("MNESIO_GATE_MIN_FIDELITY")
# Quantized / bf16 variants (gate check 7): teacher-forced divergence from an f32 cartridge on the probes.
# On SQuAD scopes at 1k tokens the mean KL is ~5e-6 (q8), ~5e-4 (q4), ~1.4e-4 (bf16r), ~1.2e-3 (bf16) (docs/design/):
# 0.02 is kveval's q4 target (kvengine/kveval/summary.py), and a broken quantizer lands at 1-10 nats.
MNESIO_GATE_MAX_MEAN_KL = read("MNESIO_GATE_MAX_MEAN_KL")
MNESIO_GATE_MIN_TOP1_PER_POSITION = read("MNESIO_GATE_MIN_TOP1_PER_POSITION")
# The incremental gate (cartridges/services/gate.py): every Nth version of a chain runs the full gate, and
# the most max |KV difference| between a new part and its one-pass re-reading.
MNESIO_GATE_FULL_EVERY = read("MNESIO_GATE_FULL_EVERY")
MNESIO_GATE_MAX_KV_ABS_DIFF = read("MNESIO_GATE_MAX_KV_ABS_DIFF")
# How long past its debounce a scope's "refresh pending" marker lives (a lost refresh task frees the scope then).
MNESIO_AUTO_REFRESH_MARKER_GRACE_S = read("MNESIO_AUTO_REFRESH_MARKER_GRACE_S")
# Whether each process of a worker that consumes the gpu queue loads the model as it starts (mnesio_site/celery.py).
MNESIO_WORKER_WARMUP = read("MNESIO_WORKER_WARMUP")
# How far cartridge accuracy on the cases may fall below text re-reading (0 for f32: no loss allowed).
MNESIO_GATE_ACCURACY_TOLERANCE = read("MNESIO_GATE_ACCURACY_TOLERANCE")
# Whether the cartridge must also match the top-k text retrieval baseline (off: it is recorded only).
MNESIO_GATE_REQUIRE_RETRIEVAL = read("MNESIO_GATE_REQUIRE_RETRIEVAL")
# How many memories the BM25 retrieval baseline re-reads per question.
MNESIO_GATE_RETRIEVAL_TOP_K = read("MNESIO_GATE_RETRIEVAL_TOP_K")
# How many probe questions are made from the memories (evenly spaced over the log; bounds gate time).
MNESIO_GATE_NUM_AUTO_PROBES = read("MNESIO_GATE_NUM_AUTO_PROBES")
# Greedy answer length when scoring evaluation cases (short keeps the gate cheap on CPU).
MNESIO_GATE_MAX_NEW_TOKENS = read("MNESIO_GATE_MAX_NEW_TOKENS")
# Greedy length of each fidelity probe (the threshold is on the first token; the rest feeds answers_identical).
MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = read("MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS")
# Greedy answer length of cartridge_answer.
MNESIO_ANSWER_MAX_NEW_TOKENS = read("MNESIO_ANSWER_MAX_NEW_TOKENS")
# How long an AnswerRequest waits to be collected before it expires and is swept (one hour).
MNESIO_ANSWER_REQUEST_TTL_S = read("MNESIO_ANSWER_REQUEST_TTL_S")
# Most memories appended after the serving version that an ask compiles on top of it in memory (a fresh answer); past
# it the version answers alone and says so. Each ask pays that incremental compile until the refresh catches up.
MNESIO_FRESH_MAX_MEMORIES = read("MNESIO_FRESH_MAX_MEMORIES")
# fresh compiles at once per process (each holds a private copy of the KV); an ask past it is answered stale
MNESIO_FRESH_MAX_CONCURRENT = read("MNESIO_FRESH_MAX_CONCURRENT")
# a new scope refreshes on append (after 2 s) unless the deployment makes refreshing a manual step
MNESIO_DEFAULT_AUTO_REFRESH = read("MNESIO_DEFAULT_AUTO_REFRESH")
# Age after which an unclaimed blob is certainly dead; None: CELERY_TASK_TIME_LIMIT + 60 (cartridges.conf), since
# a compile cannot outlive the task's hard limit.
MNESIO_ORPHAN_BLOB_GRACE_S = read("MNESIO_ORPHAN_BLOB_GRACE_S")
# Fault injection for tests: sleep this long between opening the log and compiling (0 in production; the worker
# tests pass it to worker processes through the environment).
MNESIO_CARTRIDGE_COMPILE_PAUSE_S = read("MNESIO_CARTRIDGE_COMPILE_PAUSE_S")
# Fault injection for tests: a pause after a compile wrote its blobs and before it records its version (0: none).
MNESIO_CARTRIDGE_STORE_PAUSE_S = read("MNESIO_CARTRIDGE_STORE_PAUSE_S")
MNESIO_BLOCK_CACHE_BYTES = read("MNESIO_BLOCK_CACHE_BYTES")
# Serving (cartridges/services/admission.py, remote.py): how many asks one process holds at once (sync, streamed,
# OpenAI-compatible) before answering 429 + Retry-After, and the Retry-After it names.
MNESIO_MAX_WAITING_ASKS = read("MNESIO_MAX_WAITING_ASKS")
MNESIO_ASK_RETRY_AFTER_S = read("MNESIO_ASK_RETRY_AFTER_S")
# Async asks hold no slot: how many unanswered ones one process files, and one user has (every process), before 429.
MNESIO_MAX_PENDING_ASYNC_ASKS = read("MNESIO_MAX_PENDING_ASYNC_ASKS")
MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER = read("MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER")
# The MCP server over HTTP (cartridges/mcp_server/http.py): open sessions per process (the SDK's own bound; past it a
# 503) and per user, over all their tokens (past it a 429, so one tenant cannot take every tenant's sessions), and the idle time after
# which a session is closed.
MNESIO_MCP_MAX_SESSIONS = read("MNESIO_MCP_MAX_SESSIONS")
MNESIO_MCP_MAX_SESSIONS_PER_USER = read("MNESIO_MCP_MAX_SESSIONS_PER_USER")
MNESIO_MCP_SESSION_IDLE_S = read("MNESIO_MCP_SESSION_IDLE_S")
# false: this (web) process never loads the model (never imports torch); asks go to gpu workers as AnswerRequests.
MNESIO_WEB_LOADS_MODEL = read("MNESIO_WEB_LOADS_MODEL")
# Search (memories/selectors.py): `bm25` ranks by BM25 alone; `hybrid` fuses BM25 by reciprocal rank with
# all-MiniLM-L6-v2 similarity over the newest MNESIO_SEARCH_DENSE_WINDOW memories the filters keep (embedded in the
# process, never stored). A model-free web process (MNESIO_WEB_LOADS_MODEL=false) never loads the encoder: BM25.
MNESIO_SEARCH_RETRIEVER = read("MNESIO_SEARCH_RETRIEVER")
MNESIO_SEARCH_DENSE_WINDOW = read("MNESIO_SEARCH_DENSE_WINDOW")
# How long a model-free web process waits for a gpu worker's answer before answering 504 (never a hung request).
MNESIO_REMOTE_ANSWER_TIMEOUT_S = read("MNESIO_REMOTE_ANSWER_TIMEOUT_S")
# The routed layout (services/routed_chunks.py, routed_answer.py): the repair of an answer (full by default: the only
# rung that answers as re-reading does on SmolLM2-135M, BENCHMARKS.md "Routed cartridges: the repair ladder"), how a
# chunk is stored, how many memories an answer retrieves and how many of their tokens it assembles, the chunk cache.
MNESIO_ROUTED_REPAIR = read("MNESIO_ROUTED_REPAIR")
MNESIO_ROUTED_CHUNK_QUANT = read("MNESIO_ROUTED_CHUNK_QUANT")
MNESIO_ROUTED_TOP_K = read("MNESIO_ROUTED_TOP_K")
MNESIO_ROUTED_TOKEN_BUDGET = read("MNESIO_ROUTED_TOKEN_BUDGET")
MNESIO_ROUTED_CHUNK_CACHE_SIZE = read("MNESIO_ROUTED_CHUNK_CACHE_SIZE")

# ---------------------------------------------------------------------------
# Celery
# ---------------------------------------------------------------------------
REDIS_URL = read("REDIS_URL")
CELERY_BROKER_URL = read("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = read("CELERY_RESULT_BACKEND", default=REDIS_URL)
# No broker configured: run tasks in-process so the embedded default needs nothing running.
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
# Long model tasks (see mnesio_site/celery.py for why each reliability setting is set).
CELERY_TASK_SOFT_TIME_LIMIT = read("CELERY_TASK_SOFT_TIME_LIMIT")
CELERY_TASK_TIME_LIMIT = read("CELERY_TASK_TIME_LIMIT")
CELERY_VISIBILITY_TIMEOUT = read("CELERY_VISIBILITY_TIMEOUT")
if CELERY_TASK_TIME_LIMIT >= CELERY_VISIBILITY_TIMEOUT:
    raise ImproperlyConfigured(
        f"`CELERY_TASK_TIME_LIMIT` ({CELERY_TASK_TIME_LIMIT}) has to be below `CELERY_VISIBILITY_TIMEOUT` "
        f"({CELERY_VISIBILITY_TIMEOUT}), or Redis redelivers tasks that are still running"
    )
if CELERY_TASK_SOFT_TIME_LIMIT >= CELERY_TASK_TIME_LIMIT:
    raise ImproperlyConfigured("`CELERY_TASK_SOFT_TIME_LIMIT` has to be below `CELERY_TASK_TIME_LIMIT`")
# Redis redelivers an unacked message after the visibility timeout; it must exceed the hard time limit (checked
# above) or a long compile would run twice concurrently (mnesio_site/celery.py acknowledges late).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT}

# ---------------------------------------------------------------------------
# Prometheus: with several processes behind one scrape (gunicorn workers, Celery prefork), each writes its
# answer-latency samples into this directory and /metrics reads them all (prometheus_client's multiprocess mode;
# the library reads the same variable when it is imported). Empty it before the processes start.
# ---------------------------------------------------------------------------
PROMETHEUS_MULTIPROC_DIR = read("PROMETHEUS_MULTIPROC_DIR")
if PROMETHEUS_MULTIPROC_DIR and not Path(PROMETHEUS_MULTIPROC_DIR).is_dir():
    raise ImproperlyConfigured(
        f"`PROMETHEUS_MULTIPROC_DIR` has to be an existing directory but {PROMETHEUS_MULTIPROC_DIR!r} is not"
    )

# ---------------------------------------------------------------------------
# DRF and the OpenAPI schema (settings_parts/api.py)
# ---------------------------------------------------------------------------
REST_FRAMEWORK = api.REST_FRAMEWORK
SPECTACULAR_SETTINGS = api.SPECTACULAR_SETTINGS
# API tokens (django-rest-knox): `Authorization: Token <key>` or `Bearer <key>` on every surface
# (mnesio_site.authentication). knox's own lifetime is off (a token made by `api_token_create` does not stop
# working silently after knox's default 10 hours); tokens made through the API (POST /api/v1/tokens/, invitations)
# carry an expiry: this many days by default, at most the second.
MNESIO_TOKEN_DEFAULT_TTL_DAYS = read("MNESIO_TOKEN_DEFAULT_TTL_DAYS")
MNESIO_TOKEN_MAX_TTL_DAYS = read("MNESIO_TOKEN_MAX_TTL_DAYS")
if MNESIO_TOKEN_DEFAULT_TTL_DAYS > MNESIO_TOKEN_MAX_TTL_DAYS:
    raise ImproperlyConfigured("`MNESIO_TOKEN_DEFAULT_TTL_DAYS` has to be at most `MNESIO_TOKEN_MAX_TTL_DAYS`")
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Token",
    "TOKEN_TTL": None,
    "AUTO_REFRESH": False,
}

# ---------------------------------------------------------------------------
# Logging: no memory plaintext is ever logged (tests scan the logs for it).
# ---------------------------------------------------------------------------
LOG_LEVEL = read("MNESIO_LOG_LEVEL")
# json: one JSON object per line with the request id (core.observability); plain: for a terminal.
LOG_FORMAT = read("MNESIO_LOG_FORMAT")
LOGGING = log_config.logging_config(level=LOG_LEVEL, fmt=LOG_FORMAT)
