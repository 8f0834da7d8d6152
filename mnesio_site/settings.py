"""mnesio settings: twelve-factor, read from the environment, in one file.

Every knob is an environment variable. The embedded default needs nothing running:
SQLite in ``var/`` and Celery tasks executed in-process. Point ``DATABASE_URL`` at
PostgreSQL and ``REDIS_URL`` at Redis for a real deployment (see README.md).
"""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core.keys import parse_master_key

BASE_DIR = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------
# Environment helpers (modelled on healthchecks' envint/envbool/envsecret)
# ---------------------------------------------------------------------------
def env(name: str, default: str = "") -> str:
    """Return an environment variable, or ``default`` when unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def envbool(name: str, default: str) -> bool:
    """Parse a boolean environment variable, failing loudly on anything unclear."""
    value = env(name, default).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(
        f"`{name}` has to be one of ['true', 'false', '1', '0', 'yes', 'no', 'on', 'off'] but got {value!r}"
    )


def envint(name: str, default: str, *, minimum: int | None = None) -> int:
    """Parse an integer environment variable, failing loudly on a bad value."""
    raw = env(name, default)
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"`{name}` has to be an integer but got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"`{name}` has to be >= {minimum} but got {value}")
    return value


def envchoice(name: str, default: str, choices: list[str]) -> str:
    """Parse an environment variable that must be one of ``choices``."""
    value = env(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"`{name}` has to be one of {choices} but got {value!r}")
    return value


def envsecret(name: str, default: str = "") -> str:
    """Read a secret from ``NAME`` or from the file named by ``NAME_FILE``."""
    file_name = env(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"`{name}_FILE` points at {file_name!r}, which cannot be read: {exc}") from None
    return env(name, default)


# ---------------------------------------------------------------------------
# Core Django
# ---------------------------------------------------------------------------
# Off unless asked for: only bin/run (the embedded demo) sets MNESIO_DEBUG=true. With debug off, SECRET_KEY and
# the master key must be set (the test suite sets test values: tests/settings.py).
DEBUG = envbool("MNESIO_DEBUG", "false")
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

ALLOWED_HOSTS = [h.strip() for h in env("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in env("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

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
    "pgtrigger",
    "core",
    "memories",
    "cartridges",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "core.middleware.MasterKeyUnavailableMiddleware",  # a wrong master key is a JSON 503, not a 500
]

ROOT_URLCONF = "mnesio_site.urls"
WSGI_APPLICATION = "mnesio_site.wsgi.application"

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
try:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=envint("DB_CONN_MAX_AGE", "0", minimum=0))}
except ValueError as exc:
    raise ImproperlyConfigured(f"`DATABASE_URL` is not a database URL this project understands: {exc}") from None
if DATABASES["default"]["ENGINE"] not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
    raise ImproperlyConfigured(
        f"`DATABASE_URL` has to name 'sqlite' or 'postgres' but names {DATABASES['default']['ENGINE']!r}"
    )
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

# Cartridge blobs go through Django's storage API: local files by default, any
# django-storages backend (S3, GCS) for a worker fleet via MNESIO_BLOB_STORAGE_BACKEND.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "cartridges": {
        "BACKEND": env("MNESIO_BLOB_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"),
        "OPTIONS": {"location": env("MNESIO_BLOB_ROOT", str(DATA_DIR / "cartridges"))}
        if env("MNESIO_BLOB_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage")
        == "django.core.files.storage.FileSystemStorage"
        else {},
    },
}

# Production hardening: on unless debugging (``manage.py check --deploy`` is clean with MNESIO_DEBUG=false).
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "false" if DEBUG else "true")
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "0" if DEBUG else "31536000", minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if envbool("MNESIO_BEHIND_PROXY", "false") else None

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
MNESIO_MAX_MEMORY_BYTES = envint("MNESIO_MAX_MEMORY_BYTES", "8192", minimum=1)
# Largest question accepted by the API, in characters.
MNESIO_MAX_QUESTION_CHARS = envint("MNESIO_MAX_QUESTION_CHARS", "2000", minimum=1)

# ---------------------------------------------------------------------------
# KV engine defaults (an operator can switch the active configuration at runtime)
# ---------------------------------------------------------------------------
MNESIO_KV_BACKEND = envchoice("MNESIO_KV_BACKEND", "transformers", ["fake", "transformers"])
# The fake engine answers with whole memory texts: tests only (the suite turns this on, tests/settings.py).
MNESIO_ALLOW_FAKE_BACKEND = envbool("MNESIO_ALLOW_FAKE_BACKEND", "false")
if MNESIO_KV_BACKEND == "fake" and not MNESIO_ALLOW_FAKE_BACKEND:
    raise ImproperlyConfigured(
        "`MNESIO_KV_BACKEND` 'fake' answers with whole memory texts and is for tests only: it has to be "
        "'transformers' unless `MNESIO_ALLOW_FAKE_BACKEND=true`"
    )
MNESIO_KV_MODEL = env("MNESIO_KV_MODEL", "smollm2-135m-instruct")
MNESIO_KV_DTYPE = envchoice("MNESIO_KV_DTYPE", "f32", ["f32", "bf16", "f16"])
MNESIO_KV_QUANT = envchoice("MNESIO_KV_QUANT", "none", ["none", "q8", "q4"])
MNESIO_KV_DEVICE = env("MNESIO_KV_DEVICE", "auto")
# Converted model weights and other engine caches.
MNESIO_MODEL_CACHE_DIR = Path(env("MNESIO_MODEL_CACHE_DIR", str(Path.home() / ".cache" / "mnesio")))
# How many loaded cartridges a worker keeps in memory (LRU).
MNESIO_CARTRIDGE_CACHE_SIZE = envint("MNESIO_CARTRIDGE_CACHE_SIZE", "8", minimum=0)

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
CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", "1500", minimum=1)
CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", "1800", minimum=1)
CELERY_VISIBILITY_TIMEOUT = envint("CELERY_VISIBILITY_TIMEOUT", "3600", minimum=1)
if CELERY_TASK_TIME_LIMIT >= CELERY_VISIBILITY_TIMEOUT:
    raise ImproperlyConfigured(
        f"`CELERY_TASK_TIME_LIMIT` ({CELERY_TASK_TIME_LIMIT}) has to be below `CELERY_VISIBILITY_TIMEOUT` "
        f"({CELERY_VISIBILITY_TIMEOUT}), or Redis redelivers tasks that are still running"
    )
if CELERY_TASK_SOFT_TIME_LIMIT >= CELERY_TASK_TIME_LIMIT:
    raise ImproperlyConfigured("`CELERY_TASK_SOFT_TIME_LIMIT` has to be below `CELERY_TASK_TIME_LIMIT`")

# ---------------------------------------------------------------------------
# DRF and the OpenAPI schema
# ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "mnesio_site.authentication.TokenAuthentication",  # knox: tokens stored hashed
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mnesio API",
    "DESCRIPTION": "Long-term memory for AI agents: an append-only log compiled into KV cartridges.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page list every route and field: for logged-in users only (token or session).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}
# API tokens (django-rest-knox): `Authorization: Token <key>`, no expiry (a client's token does not stop
# working silently after knox's default 10 hours; revoke one by deleting it in the admin).
REST_KNOX = {
    "AUTH_HEADER_PREFIX": "Token",
    "TOKEN_TTL": None,
    "AUTO_REFRESH": False,
}

# ---------------------------------------------------------------------------
# Logging: no memory plaintext is ever logged (tests scan the logs for it).
# ---------------------------------------------------------------------------
LOG_LEVEL = envchoice("MNESIO_LOG_LEVEL", "INFO", ["DEBUG", "INFO", "WARNING", "ERROR"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "mnesio": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "memories": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "cartridges": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "kvengine": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
    },
}
