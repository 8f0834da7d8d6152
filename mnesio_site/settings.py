"""mnesio settings: twelve-factor, read from the environment, in one file.

Every knob is an environment variable. The embedded default needs nothing running:
SQLite in ``var/`` and Celery tasks executed in-process. Point ``DATABASE_URL`` at
PostgreSQL and ``REDIS_URL`` at Redis for a real deployment (see README.md).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from core.keys import parse_master_key

BASE_DIR = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------
# Environment helpers: django-environ reads and casts; these add what it lacks (healthchecks' envint/envbool/
# envsecret are the model): an empty variable means its default, a bad value is a loud ImproperlyConfigured
# naming the variable and the allowed values, and secrets may come from ``NAME_FILE``.
# ---------------------------------------------------------------------------
ENV = environ.Env()
BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True, "off": False}


def _raw(name: str) -> str | None:
    """Return the variable's text, or None when unset or empty.

    Read as is, without django-environ's ``$OTHER_VARIABLE`` proxying: a secret that starts with ``$`` (Django's
    generated keys may) is a secret, not the name of another variable.
    """
    value = ENV.ENVIRON.get(name, "")
    return value if value != "" else None


def _cast(name: str, raw: str, cast: Any, kind: str) -> Any:
    try:
        return ENV.parse_value(raw.strip(), cast)
    except ValueError:
        raise ImproperlyConfigured(f"`{name}` has to be {kind} but got {raw!r}") from None


def env(name: str, default: str = "") -> str:
    """Return an environment variable, or ``default`` when unset or empty."""
    raw = _raw(name)
    return raw if raw is not None else default


def envbool(name: str, default: bool) -> bool:
    """Parse a boolean environment variable, failing loudly on anything unclear (django-environ reads those as false)."""
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in BOOL_STRINGS:
        raise ImproperlyConfigured(f"`{name}` has to be one of {list(BOOL_STRINGS)} but got {value!r}")
    return BOOL_STRINGS[value]


def envint(name: str, default: int | None, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
    """Parse an integer environment variable within [minimum, maximum], failing loudly on a bad value."""
    raw = _raw(name)
    if raw is None:
        return default
    value = _cast(name, raw, int, "an integer")
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"`{name}` has to be >= {minimum} but got {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"`{name}` has to be <= {maximum} but got {value}")
    return value


def envfloat(name: str, default: float, *, minimum: float = 0.0, maximum: float | None = None) -> float:
    """Parse a number environment variable within [minimum, maximum], failing loudly on a bad value."""
    raw = _raw(name)
    if raw is None:
        return default
    # Python's float, not django-environ's: that one drops characters it does not know ('0.0.1' reads as 0.1)
    value = _cast(name, raw, lambda text: float(text), "a number")
    if value < minimum or (maximum is not None and value > maximum):
        raise ImproperlyConfigured(f"`{name}` has to be between {minimum} and {maximum} but got {value}")
    return value


def envchoice(name: str, default: str, choices: list[str]) -> str:
    """Parse an environment variable that must be one of ``choices``."""
    value = env(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"`{name}` has to be one of {choices} but got {value!r}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    """Parse a comma-separated environment variable (blanks around and between commas are dropped)."""
    raw = _raw(name)
    if raw is None:
        return list(default)
    return [v.strip() for v in _cast(name, raw, list, "a comma-separated list") if v.strip()]


def envsecret(name: str, default: str = "") -> str:
    """Read a secret from ``NAME`` or from the file named by ``NAME_FILE`` (Docker and Kubernetes secrets)."""
    file_name = env(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"`{name}_FILE` points at {file_name!r}, which cannot be read: {exc}") from None
    return env(name, default)


def envdatabase(name: str, url: str, *, conn_max_age: int) -> dict[str, Any]:
    """Parse the database URL read from ``name`` with django-environ, accepting only the engines this project runs on."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unknown scheme is refused below, by name
            config = ENV.db_url_config(url)
    except (ValueError, KeyError) as exc:
        raise ImproperlyConfigured(f"`{name}` is not a database URL this project understands: {exc}") from None
    engine = config.get("ENGINE")
    if engine not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
        raise ImproperlyConfigured(f"`{name}` has to name 'sqlite' or 'postgres' but names {engine!r}")
    return {**config, "CONN_MAX_AGE": conn_max_age}


# ---------------------------------------------------------------------------
# Core Django
# ---------------------------------------------------------------------------
# Off unless asked for: only bin/run (the embedded demo) sets MNESIO_DEBUG=true. With debug off, SECRET_KEY and
# the master key must be set (the test suite sets test values: tests/settings.py).
DEBUG = envbool("MNESIO_DEBUG", False)
# Error pages and error log records show tracebacks without any variable's value, in debug or not
# (frame variables hold master-key bytes, data keys and memory plaintext).
DEFAULT_EXCEPTION_REPORTER_FILTER = "mnesio_site.debug.SecretsExceptionReporterFilter"
# Where the embedded default keeps its SQLite file, blobs, dev master key and model cache.
DATA_DIR = Path(env("MNESIO_DATA_DIR", str(BASE_DIR / "var"))).resolve()

SECRET_KEY = envsecret("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("`SECRET_KEY` (or `SECRET_KEY_FILE`) must be set when MNESIO_DEBUG is false")
    SECRET_KEY = "mnesio-insecure-development-key-do-not-use-in-production"

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

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

DATABASE_URL = env("DATABASE_URL", f"sqlite:///{DATA_DIR / 'mnesio.sqlite3'}")
if DATABASE_URL.startswith("sqlite:") and DATABASE_URL.startswith(f"sqlite:///{DATA_DIR}"):
    # The embedded default keeps its file in DATA_DIR; a fresh checkout has none yet.
    DATA_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {"default": envdatabase("DATABASE_URL", DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", 0, minimum=0))}
IS_POSTGRES = DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
if not IS_POSTGRES:
    # Concurrent writers (the dev server plus in-process tasks) wait instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 30
    # Every transaction takes SQLite's write lock at BEGIN, so a compile's subject check and its version
    # insert cannot interleave with an erasure's shred (cartridges.services.compile.manifest_subjects_lock).
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

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
MEDIA_ROOT = Path(env("MNESIO_MEDIA_ROOT", str(DATA_DIR / "media")))

# Cartridge blobs go through Django's storage API (cartridges/storage.py): local files by default;
# MNESIO_BLOB_STORAGE=s3 puts them in an S3 bucket (django-storages, cartridges/s3.py) so that a fleet of web and
# worker hosts shares them; MNESIO_BLOB_STORAGE_BACKEND names any other Django storage class (no options).
MNESIO_BLOB_STORAGE = envchoice("MNESIO_BLOB_STORAGE", "local", ["local", "s3"])
MNESIO_BLOB_STORAGE_BACKEND = env("MNESIO_BLOB_STORAGE_BACKEND")
if MNESIO_BLOB_STORAGE_BACKEND and MNESIO_BLOB_STORAGE == "s3":
    raise ImproperlyConfigured("set either `MNESIO_BLOB_STORAGE=s3` or `MNESIO_BLOB_STORAGE_BACKEND`, not both")
if MNESIO_BLOB_STORAGE == "s3":
    _s3_bucket = env("MNESIO_S3_BUCKET")
    if not _s3_bucket:
        raise ImproperlyConfigured("`MNESIO_S3_BUCKET` must be set when `MNESIO_BLOB_STORAGE` is 's3'")
    _blob_storage: dict[str, Any] = {
        "BACKEND": "cartridges.s3.CartridgeS3Storage",
        "OPTIONS": {
            "bucket_name": _s3_bucket,
            # a key prefix inside the bucket ('' = the bucket's root)
            "location": env("MNESIO_S3_PREFIX", "").strip("/"),
            # unset: AWS itself; set for MinIO, Ceph, moto (tests) or another S3-compatible service
            "endpoint_url": env("MNESIO_S3_ENDPOINT_URL") or None,
            "region_name": env("MNESIO_S3_REGION") or None,
            # unset: boto3's own chain (AWS_ACCESS_KEY_ID..., an instance or pod role)
            "access_key": envsecret("MNESIO_S3_ACCESS_KEY_ID") or None,
            "secret_key": envsecret("MNESIO_S3_SECRET_ACCESS_KEY") or None,
            # 'path' for most self-hosted S3-compatible servers; unset: boto3 chooses (virtual hosts on AWS)
            "addressing_style": envchoice("MNESIO_S3_ADDRESSING_STYLE", "auto", ["auto", "path", "virtual"]),
            "signature_version": "s3v4",
            "file_overwrite": False,  # a name that exists is never written over (cartridges.storage refuses a rename)
            "default_acl": None,  # the bucket's own policy: blobs are private, never public-read
            "querystring_auth": True,
        },
    }
else:
    _blob_backend = MNESIO_BLOB_STORAGE_BACKEND or "django.core.files.storage.FileSystemStorage"
    _blob_storage = {
        "BACKEND": _blob_backend,
        "OPTIONS": {"location": env("MNESIO_BLOB_ROOT", str(DATA_DIR / "cartridges"))}
        if _blob_backend == "django.core.files.storage.FileSystemStorage"
        else {},
    }
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "cartridges": _blob_storage,
}

# Production hardening: on unless debugging (``manage.py check --deploy`` is clean with MNESIO_DEBUG=false).
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("MNESIO_BEHIND_PROXY", False) else None

# ---------------------------------------------------------------------------
# Master key: wraps every subject/scope data key (AES-256-GCM)
# ---------------------------------------------------------------------------
# Base64 of 32 random bytes, from MNESIO_MASTER_KEY or the file MNESIO_MASTER_KEY_FILE.
# With neither set and MNESIO_DEBUG on, a development key is generated once in DATA_DIR
# (memories.keys reads MNESIO_MASTER_KEY_DEV_FILE); with MNESIO_DEBUG off it is an error.
_master_raw = envsecret("MNESIO_MASTER_KEY")
MNESIO_MASTER_KEY: bytes | None = parse_master_key(_master_raw, name="MNESIO_MASTER_KEY") if _master_raw else None
if MNESIO_MASTER_KEY is None and not DEBUG:
    raise ImproperlyConfigured("`MNESIO_MASTER_KEY` (or `MNESIO_MASTER_KEY_FILE`) must be set when MNESIO_DEBUG is false")
MNESIO_MASTER_KEY_DEV_FILE = DATA_DIR / "master.key"
# The previous master key during a rotation: keys wrapped by it are still opened and re-wrapped.
_old_raw = envsecret("MNESIO_MASTER_KEY_OLD")
MNESIO_MASTER_KEY_OLD: bytes | None = parse_master_key(_old_raw, name="MNESIO_MASTER_KEY_OLD") if _old_raw else None

# Largest memory content accepted by the API, in UTF-8 bytes (documented in README).
MNESIO_MAX_MEMORY_BYTES = envint("MNESIO_MAX_MEMORY_BYTES", 8192, minimum=1)
# The optional metadata of one memory, as canonical JSON (memories.services.metadata_validate).
MNESIO_MAX_METADATA_BYTES = envint("MNESIO_MAX_METADATA_BYTES", 4096, minimum=2)
# Largest question accepted by the API, in characters.
MNESIO_MAX_QUESTION_CHARS = envint("MNESIO_MAX_QUESTION_CHARS", 2000, minimum=1)
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
MNESIO_KV_BACKEND = envchoice("MNESIO_KV_BACKEND", "transformers", ["fake", "transformers"])
# The fake engine answers with whole memory texts: tests only (the suite turns this on, tests/settings.py).
MNESIO_ALLOW_FAKE_BACKEND = envbool("MNESIO_ALLOW_FAKE_BACKEND", False)
if MNESIO_KV_BACKEND == "fake" and not MNESIO_ALLOW_FAKE_BACKEND:
    raise ImproperlyConfigured(
        "`MNESIO_KV_BACKEND` 'fake' answers with whole memory texts and is for tests only: it has to be "
        "'transformers' unless `MNESIO_ALLOW_FAKE_BACKEND=true`"
    )
MNESIO_KV_MODEL = env("MNESIO_KV_MODEL", "smollm2-135m-instruct")
MNESIO_KV_DTYPE = envchoice("MNESIO_KV_DTYPE", "f32", ["f32", "bf16", "f16", "bf16r", "f32w8"])
MNESIO_KV_QUANT = envchoice("MNESIO_KV_QUANT", "none", ["none", "q8", "q4"])
MNESIO_KV_DEVICE = env("MNESIO_KV_DEVICE", "auto")
# Tokens per KV block (transformers backend, kvengine/blocks.py): an append recomputes the last partial block plus
# the new memory, so smaller blocks refresh faster; a full compile runs one pass per block, so larger blocks compile
# faster (BENCHMARKS.md, "Blocks of 64 tokens"). A multiple of 64, so no quantization group (q8 16, q4 64 tokens)
# straddles or pads a block. Changing it makes new block ids: a scope's next compile reuses no stored block. At most
# 8192 (SmolLM2's whole window): a larger block is never full, so every append would recompute the whole scope.
MNESIO_KV_BLOCK_SIZE = envint("MNESIO_KV_BLOCK_SIZE", 64, minimum=64, maximum=8192)
if MNESIO_KV_BLOCK_SIZE % 64:
    raise ImproperlyConfigured(f"`MNESIO_KV_BLOCK_SIZE` has to be a multiple of 64 tokens but got {MNESIO_KV_BLOCK_SIZE}")
# Converted model weights and other engine caches.
MNESIO_MODEL_CACHE_DIR = Path(env("MNESIO_MODEL_CACHE_DIR", str(Path.home() / ".cache" / "mnesio")))
# How many loaded cartridges a worker keeps in memory (LRU); 0 disables the cache.
MNESIO_CARTRIDGE_CACHE_SIZE = envint("MNESIO_CARTRIDGE_CACHE_SIZE", 8, minimum=0)
# Model ids an operator may switch to (cartridges.conf.allowed_models adds the configured default).
MNESIO_KV_ALLOWED_MODELS = envlist("MNESIO_KV_ALLOWED_MODELS", ["smollm2-135m-instruct", "fake-model"])

# Whether /readyz waits for the active model to be loaded in this process (the web process answers questions);
# false for a process that never answers.
MNESIO_READYZ_MODEL = envbool("MNESIO_READYZ_MODEL", True)
# How long a process reuses its /readyz blob storage check (a write, a read and a delete: three S3 requests), seconds.
MNESIO_READYZ_STORAGE_CACHE_S = envint("MNESIO_READYZ_STORAGE_CACHE_S", 5, minimum=0)

# ---------------------------------------------------------------------------
# Cartridge lifecycle: the gate and serving (read at call time through cartridges.conf, so the tests'
# ``settings`` fixture overrides them; worker processes get them through the environment)
# ---------------------------------------------------------------------------
# Least top-1 next-token agreement with text re-reading on the probes (f32 agrees fully; q4 may not).
MNESIO_GATE_MIN_FIDELITY = envfloat("MNESIO_GATE_MIN_FIDELITY", 0.95, maximum=1.0)
# Quantized / bf16 variants (gate check 7): teacher-forced divergence from an f32 cartridge on the probes.
# kveval at 1k tokens measured mean KL ~1e-5 (q8), ~1.5e-3 (q4, format 3), ~3e-4 (bf16r), ~1.5e-3 (bf16):
# 0.02 is kveval's q4 target (kvengine/kveval/runner.py), and a broken quantizer lands at 1-10 nats.
MNESIO_GATE_MAX_MEAN_KL = envfloat("MNESIO_GATE_MAX_MEAN_KL", 0.02)
MNESIO_GATE_MIN_TOP1_PER_POSITION = envfloat("MNESIO_GATE_MIN_TOP1_PER_POSITION", 0.9, maximum=1.0)
# The incremental gate (cartridges/services/gate.py): every Nth version of a chain runs the full gate, and
# the most max |KV difference| between a new part and its one-pass re-reading.
MNESIO_GATE_FULL_EVERY = envint("MNESIO_GATE_FULL_EVERY", 10, minimum=1)
MNESIO_GATE_MAX_KV_ABS_DIFF = envfloat("MNESIO_GATE_MAX_KV_ABS_DIFF", 1e-3)
# How long past its debounce a scope's "refresh pending" marker lives (a lost refresh task frees the scope then).
MNESIO_AUTO_REFRESH_MARKER_GRACE_S = envint("MNESIO_AUTO_REFRESH_MARKER_GRACE_S", 600, minimum=1)
# Whether each process of a worker that consumes the gpu queue loads the model as it starts (mnesio_site/celery.py).
MNESIO_WORKER_WARMUP = envbool("MNESIO_WORKER_WARMUP", True)
# How far cartridge accuracy on the cases may fall below text re-reading (0 for f32: no loss allowed).
MNESIO_GATE_ACCURACY_TOLERANCE = envfloat("MNESIO_GATE_ACCURACY_TOLERANCE", 0.0, maximum=1.0)
# Whether the cartridge must also match the top-k text retrieval baseline (off: it is recorded only).
MNESIO_GATE_REQUIRE_RETRIEVAL = envbool("MNESIO_GATE_REQUIRE_RETRIEVAL", False)
# How many memories the BM25 retrieval baseline re-reads per question.
MNESIO_GATE_RETRIEVAL_TOP_K = envint("MNESIO_GATE_RETRIEVAL_TOP_K", 3, minimum=1)
# How many probe questions are made from the memories (evenly spaced over the log; bounds gate time).
MNESIO_GATE_NUM_AUTO_PROBES = envint("MNESIO_GATE_NUM_AUTO_PROBES", 4, minimum=1)
# Greedy answer length when scoring evaluation cases (short keeps the gate cheap on CPU).
MNESIO_GATE_MAX_NEW_TOKENS = envint("MNESIO_GATE_MAX_NEW_TOKENS", 16, minimum=1)
# Greedy length of each fidelity probe (the threshold is on the first token; the rest feeds answers_identical).
MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = envint("MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS", 8, minimum=1)
# Greedy answer length of cartridge_answer.
MNESIO_ANSWER_MAX_NEW_TOKENS = envint("MNESIO_ANSWER_MAX_NEW_TOKENS", 32, minimum=1)
# How long an AnswerRequest waits to be collected before it expires and is swept (one hour).
MNESIO_ANSWER_REQUEST_TTL_S = envint("MNESIO_ANSWER_REQUEST_TTL_S", 3600, minimum=1)
# Most memories appended after the serving version that an ask compiles on top of it in memory (a fresh answer); past
# it the version answers alone and says so. Each ask pays that incremental compile until the refresh catches up.
MNESIO_FRESH_MAX_MEMORIES = envint("MNESIO_FRESH_MAX_MEMORIES", 32, minimum=0)
# fresh compiles at once per process (each holds a private copy of the KV); an ask past it is answered stale
MNESIO_FRESH_MAX_CONCURRENT = envint("MNESIO_FRESH_MAX_CONCURRENT", 1, minimum=1)
# a new scope refreshes on append (after 2 s) unless the deployment makes refreshing a manual step
MNESIO_DEFAULT_AUTO_REFRESH = envchoice("MNESIO_DEFAULT_AUTO_REFRESH", "on_append", ["on_append", "manual"])
# Age after which an unclaimed blob is certainly dead; None: CELERY_TASK_TIME_LIMIT + 60 (cartridges.conf), since
# a compile cannot outlive the task's hard limit.
MNESIO_ORPHAN_BLOB_GRACE_S = envint("MNESIO_ORPHAN_BLOB_GRACE_S", None, minimum=0)
# Fault injection for tests: sleep this long between opening the log and compiling (0 in production; the worker
# tests pass it to worker processes through the environment).
MNESIO_CARTRIDGE_COMPILE_PAUSE_S = envfloat("MNESIO_CARTRIDGE_COMPILE_PAUSE_S", 0.0, maximum=600.0)
# Fault injection for tests: a pause after a compile wrote its blobs and before it records its version (0: none).
MNESIO_CARTRIDGE_STORE_PAUSE_S = envfloat("MNESIO_CARTRIDGE_STORE_PAUSE_S", 0.0, maximum=600.0)
MNESIO_BLOCK_CACHE_BYTES = envint("MNESIO_BLOCK_CACHE_BYTES", 1 << 30, minimum=0)
# Serving (cartridges/services/admission.py, remote.py): how many asks one process holds at once (sync, streamed,
# OpenAI-compatible) before answering 429 + Retry-After, and the Retry-After it names.
MNESIO_MAX_WAITING_ASKS = envint("MNESIO_MAX_WAITING_ASKS", 32, minimum=1)
MNESIO_ASK_RETRY_AFTER_S = envint("MNESIO_ASK_RETRY_AFTER_S", 2, minimum=1)
# Async asks hold no slot: how many unanswered ones one process files, and one user has (every process), before 429.
MNESIO_MAX_PENDING_ASYNC_ASKS = envint("MNESIO_MAX_PENDING_ASYNC_ASKS", 64, minimum=1)
MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER = envint("MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER", 16, minimum=1)
# The MCP server over HTTP (cartridges/mcp_server/http.py): open sessions per process (the SDK's own bound; past it a
# 503) and per user, over all their tokens (past it a 429, so one tenant cannot take every tenant's sessions), and the idle time after
# which a session is closed.
MNESIO_MCP_MAX_SESSIONS = envint("MNESIO_MCP_MAX_SESSIONS", 1000, minimum=1)
MNESIO_MCP_MAX_SESSIONS_PER_USER = envint("MNESIO_MCP_MAX_SESSIONS_PER_USER", 8, minimum=1)
MNESIO_MCP_SESSION_IDLE_S = envint("MNESIO_MCP_SESSION_IDLE_S", 600, minimum=1)
# false: this (web) process never loads the model (never imports torch); asks go to gpu workers as AnswerRequests.
MNESIO_WEB_LOADS_MODEL = envbool("MNESIO_WEB_LOADS_MODEL", True)
# Search (memories/selectors.py): `bm25` ranks by BM25 alone; `hybrid` fuses BM25 by reciprocal rank with
# all-MiniLM-L6-v2 similarity over the newest MNESIO_SEARCH_DENSE_WINDOW memories the filters keep (embedded in the
# process, never stored). A model-free web process (MNESIO_WEB_LOADS_MODEL=false) never loads the encoder: BM25.
MNESIO_SEARCH_RETRIEVER = envchoice("MNESIO_SEARCH_RETRIEVER", "bm25", ["bm25", "hybrid"])
MNESIO_SEARCH_DENSE_WINDOW = envint("MNESIO_SEARCH_DENSE_WINDOW", 2000, minimum=1)
# How long a model-free web process waits for a gpu worker's answer before answering 504 (never a hung request).
MNESIO_REMOTE_ANSWER_TIMEOUT_S = envint("MNESIO_REMOTE_ANSWER_TIMEOUT_S", 120, minimum=1)

# ---------------------------------------------------------------------------
# Celery
# ---------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL")
CELERY_BROKER_URL = env("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", REDIS_URL)
# No broker configured: run tasks in-process so the embedded default needs nothing running.
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
# Long model tasks (see mnesio_site/celery.py for why each reliability setting is set).
CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", 1500, minimum=1)
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 1800, minimum=1)
CELERY_VISIBILITY_TIMEOUT = envint("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=1)
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
PROMETHEUS_MULTIPROC_DIR = env("PROMETHEUS_MULTIPROC_DIR")
if PROMETHEUS_MULTIPROC_DIR and not Path(PROMETHEUS_MULTIPROC_DIR).is_dir():
    raise ImproperlyConfigured(
        f"`PROMETHEUS_MULTIPROC_DIR` has to be an existing directory but {PROMETHEUS_MULTIPROC_DIR!r} is not"
    )

# ---------------------------------------------------------------------------
# DRF and the OpenAPI schema
# ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "mnesio_site.authentication.TokenAuthentication",  # knox: tokens stored hashed
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies refuse lone surrogates and too deep nesting with a 400 (core/parsers.py); forms as DRF's default
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mnesio API",
    "DESCRIPTION": "Long-term memory for AI agents: an append-only log compiled into KV cartridges. "
    "The API is versioned under /api/v1/; the unversioned /api/... paths are a deprecated alias of the same "
    "endpoints (their responses carry `Deprecation: true` and a `Link` to the /api/v1/ successor).",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page list every route and field: for logged-in users only (token or session).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # The schema documents /api/v1/; /api/... is the same API under a deprecated alias (mnesio_site.versioning).
    "PREPROCESSING_HOOKS": ["mnesio_site.versioning.v1_endpoints_only"],
    # The docs pages load their JavaScript and CSS from this server (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # "layout" is a scope's setting (three values) and, in an answer, what answered (two): one name each
    "ENUM_NAME_OVERRIDES": {"ScopeLayoutEnum": ["prefix", "routed", "auto"], "AnswerLayoutEnum": ["prefix", "routed"]},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",  # the default hook, kept
        "mnesio_site.versioning.unversioned_operation_ids",
        # the Error component (a `code` enum from core.errors.ERROR_CODES) and the error responses of every operation
        "core.schema.error_responses",
    ],
}
# API tokens (django-rest-knox): `Authorization: Token <key>` or `Bearer <key>` on every surface
# (mnesio_site.authentication). knox's own lifetime is off (a token made by `api_token_create` does not stop
# working silently after knox's default 10 hours); tokens made through the API (POST /api/v1/tokens/, invitations)
# carry an expiry: this many days by default, at most the second.
MNESIO_TOKEN_DEFAULT_TTL_DAYS = envint("MNESIO_TOKEN_DEFAULT_TTL_DAYS", 90, minimum=1)
MNESIO_TOKEN_MAX_TTL_DAYS = envint("MNESIO_TOKEN_MAX_TTL_DAYS", 365, minimum=1)
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
LOG_LEVEL = envchoice("MNESIO_LOG_LEVEL", "INFO", ["DEBUG", "INFO", "WARNING", "ERROR"])
# json: one JSON object per line with the request id (core.observability); plain: for a terminal.
LOG_FORMAT = envchoice("MNESIO_LOG_FORMAT", "json", ["json", "plain"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "core.observability.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "mnesio": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "memories": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "cartridges": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "kvengine": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        # a worker's own lines (received, succeeded, a lost child) in the same format (celery.py: no root hijack)
        "celery": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
    },
}
