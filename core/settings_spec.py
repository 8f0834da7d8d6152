"""Every environment variable mnesio reads, declared once: name, type, default, bounds or choices, and help.

``mnesio_site/settings.py`` reads each from the environment through :func:`read`; ``cartridges.conf`` checks a
test's override against the same declaration (:meth:`Setting.check`); ``python -m core.settings_doc`` writes
docs/configuration.md from it. A bad value is an ``ImproperlyConfigured`` naming the variable, what it accepts and
what it got. A secret may come from the file named by ``NAME_FILE`` (Docker and Kubernetes secrets).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from kvengine.config import BACKENDS, CHUNK_QUANTS, DTYPES, QUANTS

BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True, "off": False}
KINDS = ("text", "secret", "bool", "int", "float", "choice", "list", "path")
SETTINGS_PY = "mnesio_site/settings.py"
_PARSER = environ.Env()
_UNSET: Any = object()


@dataclass(frozen=True)
class Setting:
    """One environment variable: how it is read, what it accepts, and what the docs say about it."""

    name: str
    kind: str  # one of KINDS
    default: Any  # the value when unset or empty (None: no value)
    help: str  # one line for docs/configuration.md
    section: str
    minimum: float | None = None  # int and float
    maximum: float | None = None
    multiple_of: int | None = None  # int
    unit: str = ""  # what an int counts, in the multiple-of message ("tokens")
    choices: tuple[str, ...] = ()  # choice
    default_doc: str = ""  # a default computed from other settings, as the docs say it (the reader passes it)
    read_by: str = SETTINGS_PY  # what reads it: settings.py, or a script or command outside Django's settings

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind
        assert (self.kind == "choice") == bool(self.choices), self.name

    def read(self, environ: Mapping[str, str] | None = None, *, default: Any = _UNSET) -> Any:
        """Parse the variable from ``environ`` (the process's by default); unset or empty means the default.

        ``default`` is for a default computed from other settings: only a setting that documents one takes it.
        """
        environ = os.environ if environ is None else environ
        if default is _UNSET:
            default = self.default
        else:
            assert self.default_doc, f"{self.name}: a computed default has to be documented (default_doc)"
        if self.kind == "secret":
            file_name = environ.get(f"{self.name}_FILE", "")
            if file_name:
                try:
                    return Path(file_name).read_text().strip()
                except OSError as exc:
                    raise ImproperlyConfigured(
                        f"`{self.name}_FILE` points at {file_name!r}, which cannot be read: {exc}"
                    ) from None
        # as is, without django-environ's `$OTHER_VARIABLE` proxying: a secret may start with `$`
        raw = environ.get(self.name, "")
        if raw == "":
            return list(default) if self.kind == "list" and default is not None else default
        return self.parse(raw)

    def parse(self, raw: str) -> Any:
        """The value of the variable's text ``raw``, or ImproperlyConfigured naming what it accepts."""
        if self.kind in ("text", "secret"):
            return raw
        if self.kind == "path":
            return Path(raw)
        if self.kind == "bool":
            value = raw.strip().lower()
            if value not in BOOL_STRINGS:
                raise ImproperlyConfigured(f"`{self.name}` has to be one of {list(BOOL_STRINGS)} but got {value!r}")
            return BOOL_STRINGS[value]
        if self.kind == "int":
            return self._bounded(self._cast(raw, lambda text: _PARSER.parse_value(text.strip(), int), "an integer"))
        if self.kind == "float":
            # Python's float, not django-environ's: that one drops characters it does not know ('0.0.1' reads as 0.1)
            return self._bounded(self._cast(raw, lambda text: float(text.strip()), "a number"))
        if self.kind == "choice":
            return self._chosen(raw)
        # list: comma-separated, blanks around and between commas dropped
        return [v.strip() for v in raw.split(",") if v.strip()]

    def check(self, value: Any) -> Any:
        """``value`` as this setting's type, checked like the environment's text (a test's override, a settings value)."""
        if value is None and self.default is None:
            return None
        if self.kind == "bool":
            return value if isinstance(value, bool) else self.parse(str(value))
        if self.kind == "int":
            return self._bounded(self._cast(value, int, "an integer"))
        if self.kind == "float":
            return self._bounded(self._cast(value, float, "a number"))
        if self.kind == "choice":
            return self._chosen(str(value))
        if self.kind == "list":
            return [str(v) for v in value] if isinstance(value, (list, tuple)) else self.parse(str(value))
        return Path(value) if self.kind == "path" else str(value)

    def _cast(self, raw: Any, cast: Any, kind: str) -> Any:
        try:
            return cast(raw)
        except (TypeError, ValueError):
            raise ImproperlyConfigured(f"`{self.name}` has to be {kind} but got {raw!r}") from None

    def _bounded(self, value: float) -> Any:
        if self.kind == "float":
            if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
                raise ImproperlyConfigured(f"`{self.name}` has to be {self.bounds} but got {value}")
            return value
        if self.minimum is not None and value < self.minimum:
            raise ImproperlyConfigured(f"`{self.name}` has to be >= {self.minimum} but got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ImproperlyConfigured(f"`{self.name}` has to be <= {self.maximum} but got {value}")
        if self.multiple_of and value % self.multiple_of:
            unit = f" {self.unit}" if self.unit else ""
            raise ImproperlyConfigured(f"`{self.name}` has to be a multiple of {self.multiple_of}{unit} but got {value}")
        return value

    def _chosen(self, value: str) -> str:
        if value not in self.choices:
            raise ImproperlyConfigured(f"`{self.name}` has to be one of {list(self.choices)} but got {value!r}")
        return value

    @property
    def bounds(self) -> str:
        """The accepted range in words ('' when any value of the type is accepted)."""
        low, high = self.minimum, self.maximum
        if self.kind == "float" and low is not None and high is not None:
            text = f"between {low} and {high}"
        elif low is not None and high is not None:
            text = f">= {low} and <= {high}"
        elif low is not None:
            text = f">= {low}"
        elif high is not None:
            text = f"<= {high}"
        else:
            text = ""
        if self.multiple_of:
            text = f"{text}, a multiple of {self.multiple_of}" if text else f"a multiple of {self.multiple_of}"
        return text


def _int(name: str, default: int | None, help: str, section: str, *, minimum: int | None = None,
         maximum: int | None = None, **extra: Any) -> Setting:
    return Setting(name, "int", default, help, section, minimum=minimum, maximum=maximum, **extra)


def _float(name: str, default: float, help: str, section: str, *, maximum: float | None = None) -> Setting:
    return Setting(name, "float", default, help, section, minimum=0.0, maximum=maximum)


def _bool(name: str, default: bool, help: str, section: str, **extra: Any) -> Setting:
    return Setting(name, "bool", default, help, section, **extra)


def _choice(name: str, default: str, choices: tuple[str, ...], help: str, section: str) -> Setting:
    return Setting(name, "choice", default, help, section, choices=tuple(choices))


def _text(name: str, default: str, help: str, section: str, **extra: Any) -> Setting:
    return Setting(name, "text", default, help, section, **extra)


DJANGO = "Django and the web server"
STORAGE = "Cartridge blob storage"
KEYS = "Master key and limits"
ENGINE = "KV engine"
GATE = "The gate and compiling"
SERVING = "Serving and answering"
ROUTED = "The routed layout"
CELERY = "Celery and metrics"
SCRIPTS = "Scripts and commands"

DECLARED: tuple[Setting, ...] = (
    # -- Django and the web server
    _bool("MNESIO_DEBUG", False, "Django's debug mode and development defaults (a generated SECRET_KEY and master key); "
          "only bin/run turns it on.", DJANGO),
    Setting("MNESIO_DATA_DIR", "path", None, "Where the embedded default keeps its SQLite file, blobs, dev master key "
            "and static files.", DJANGO, default_doc="var/ in the checkout"),
    Setting("SECRET_KEY", "secret", "", "Django's secret key; required when MNESIO_DEBUG is false.", DJANGO,
            default_doc="required (a fixed development key with MNESIO_DEBUG)"),
    Setting("ALLOWED_HOSTS", "list", ("localhost", "127.0.0.1", "[::1]", "testserver"),
            "Host names this site answers for (comma-separated).", DJANGO),
    Setting("CSRF_TRUSTED_ORIGINS", "list", (), "Origins trusted for unsafe requests with a session (comma-separated).",
            DJANGO),
    _text("DATABASE_URL", "", "The database: sqlite:///path or postgres://user:password@host:port/name.", DJANGO,
          default_doc="sqlite:///$MNESIO_DATA_DIR/mnesio.sqlite3"),
    _int("DB_CONN_MAX_AGE", 0, "Seconds a database connection is kept open between requests (0: one per request).",
         DJANGO, minimum=0),
    Setting("MNESIO_MEDIA_ROOT", "path", None, "Django's MEDIA_ROOT.", DJANGO, default_doc="$MNESIO_DATA_DIR/media"),
    _bool("SECURE_SSL_REDIRECT", False, "Redirect plain http to https.", DJANGO, default_doc="true unless MNESIO_DEBUG"),
    _int("SECURE_HSTS_SECONDS", 31536000, "The Strict-Transport-Security max-age, seconds.", DJANGO, minimum=0,
         default_doc="31536000 (0 with MNESIO_DEBUG)"),
    _bool("MNESIO_BEHIND_PROXY", False, "Trust X-Forwarded-Proto from the reverse proxy in front (https detection).",
          DJANGO),
    _choice("MNESIO_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"), "Level of the project's loggers (no memory text is ever logged).", DJANGO),
    _choice("MNESIO_LOG_FORMAT", "json", ("json", "plain"), "json: one object per line with the request id; plain: for "
            "a terminal.", DJANGO),
    _bool("MNESIO_READYZ_MODEL", True, "Whether /readyz waits for the active model to be loaded in this process; false "
          "for a process that never answers.", DJANGO),
    _int("MNESIO_READYZ_STORAGE_CACHE_S", 5, "How long a process reuses its /readyz blob storage check (a write, a read "
         "and a delete), seconds.", DJANGO, minimum=0),
    _int("MNESIO_TOKEN_DEFAULT_TTL_DAYS", 90, "Lifetime of a token made through the API when it names none, days "
         "(at most MNESIO_TOKEN_MAX_TTL_DAYS).", DJANGO, minimum=1),
    _int("MNESIO_TOKEN_MAX_TTL_DAYS", 365, "Longest lifetime a token made through the API may ask for, days.", DJANGO,
         minimum=1),
    # -- Cartridge blob storage
    _choice("MNESIO_BLOB_STORAGE", "local", ("local", "s3"), "Where cartridge blobs live: local files, or an S3 "
            "bucket shared by a fleet of hosts.", STORAGE),
    _text("MNESIO_BLOB_STORAGE_BACKEND", "", "Any other Django storage class for the blobs, by dotted path (no "
          "options); not with MNESIO_BLOB_STORAGE=s3.", STORAGE),
    Setting("MNESIO_BLOB_ROOT", "path", None, "The directory of local blobs.", STORAGE,
            default_doc="$MNESIO_DATA_DIR/cartridges"),
    _text("MNESIO_S3_BUCKET", "", "The bucket; required with MNESIO_BLOB_STORAGE=s3.", STORAGE),
    _text("MNESIO_S3_PREFIX", "", "A key prefix inside the bucket (empty: the bucket's root).", STORAGE),
    _text("MNESIO_S3_ENDPOINT_URL", "", "The S3 endpoint for MinIO, Ceph or another S3-compatible service (empty: "
          "AWS).", STORAGE),
    _text("MNESIO_S3_REGION", "", "The bucket's region (empty: boto3's own choice).", STORAGE),
    Setting("MNESIO_S3_ACCESS_KEY_ID", "secret", "", "The access key id (empty: boto3's own chain, e.g. an instance "
            "or pod role).", STORAGE),
    Setting("MNESIO_S3_SECRET_ACCESS_KEY", "secret", "", "The secret access key (empty: boto3's own chain).", STORAGE),
    _choice("MNESIO_S3_ADDRESSING_STYLE", "auto", ("auto", "path", "virtual"), "'path' for most self-hosted "
            "S3-compatible servers; auto lets boto3 choose.", STORAGE),
    # -- Master key and limits
    Setting("MNESIO_MASTER_KEY", "secret", "", "Base64 of 32 random bytes: wraps every subject and scope data key "
            "(AES-256-GCM); required when MNESIO_DEBUG is false.", KEYS,
            default_doc="required (generated once in $MNESIO_DATA_DIR with MNESIO_DEBUG)"),
    Setting("MNESIO_MASTER_KEY_OLD", "secret", "", "The previous master key during `manage.py rotate_master_key`: keys "
            "wrapped by it are still opened and re-wrapped.", KEYS),
    _int("MNESIO_MAX_MEMORY_BYTES", 8192, "Largest memory content the API accepts, UTF-8 bytes.", KEYS, minimum=1),
    _int("MNESIO_MAX_METADATA_BYTES", 4096, "Largest metadata object of one memory (JSON, nested at most 4 levels), "
         "canonical JSON bytes.", KEYS, minimum=2),
    _int("MNESIO_MAX_QUESTION_CHARS", 2000, "Largest question the API accepts, characters.", KEYS, minimum=1),
    # -- KV engine
    _choice("MNESIO_KV_BACKEND", "transformers", BACKENDS, "The engine: transformers runs a causal LM; fake answers "
            "with whole memory texts (tests only).", ENGINE),
    _bool("MNESIO_ALLOW_FAKE_BACKEND", False, "Allow MNESIO_KV_BACKEND=fake (the test suite sets it).", ENGINE),
    _text("MNESIO_KV_MODEL", "smollm2-135m-instruct", "The default model: a GGUF model id, a local directory, or a hub id (GPT-2, Qwen2, Llama "
          "family).", ENGINE),
    _choice("MNESIO_KV_DTYPE", "f32", DTYPES, "Precision of weights and KV (bf16r: bf16 with an f32 residual stream; f32w8: f32 KV and activations, weight-only int8 linear layers; bf16w8: the same over bf16 KV).",
            ENGINE),
    _choice("MNESIO_KV_QUANT", "none", QUANTS, "How a stored cartridge's KV state is quantized (q8: 0.31x the bytes of f32; q4: 0.16x).", ENGINE),
    _text("MNESIO_KV_DEVICE", "auto", "The torch device: auto (cuda when present), cpu or cuda.", ENGINE),
    _int("MNESIO_KV_BLOCK_SIZE", 64, "Tokens per KV block: smaller blocks append faster, larger compile faster; "
         "changing it makes new block ids.", ENGINE, minimum=64, maximum=8192, multiple_of=64, unit="tokens"),
    _bool("MNESIO_KV_COMPILE_STEP", False, "Decode single tokens through torch.compile (inductor): compiled once as "
          "each process loads the model (about a minute on a 2-core CPU). The compiled graph keeps "
          "torch's kernels, not the engine's fused single-row ones, so since those landed an eager step is the faster "
          "(BENCHMARKS.md, \"torch.compile of the decoding step\").", ENGINE),
    Setting("MNESIO_MODEL_CACHE_DIR", "path", None, "Converted model weights and other engine caches.", ENGINE,
            default_doc="~/.cache/mnesio"),
    Setting("MNESIO_KV_ALLOWED_MODELS", "list", ("smollm2-135m-instruct", "fake-model"), "Model ids an operator may "
            "switch to (comma-separated; MNESIO_KV_MODEL is always allowed).", ENGINE),
    _int("MNESIO_CARTRIDGE_CACHE_SIZE", 8, "How many loaded cartridges one process keeps (LRU); 0 disables the cache.",
         ENGINE, minimum=0),
    _int("MNESIO_BLOCK_CACHE_BYTES", 1 << 30, "Bytes of decrypted, verified KV blocks one process keeps (LRU; a block's "
         "key is still checked in the database on every read); 0 disables the cache.", ENGINE, minimum=0),
    _bool("MNESIO_WEB_LOADS_MODEL", True, "false: this web process never loads the model (never imports torch); asks "
          "go to gpu workers.", ENGINE),
    _bool("MNESIO_WORKER_WARMUP", True, "Whether each process of a gpu-queue worker loads the model as it starts.",
          ENGINE),
    # -- The gate and compiling
    _float("MNESIO_GATE_MIN_FIDELITY", 0.95, "Least top-1 next-token agreement with text re-reading on the probes.",
           GATE, maximum=1.0),
    _float("MNESIO_GATE_MAX_MEAN_KL", 0.02, "Most mean KL(f32 || variant) per answer position a quantized or bf16 "
           "variant may have.", GATE),
    _float("MNESIO_GATE_MIN_TOP1_PER_POSITION", 0.9, "Least top-1 agreement with f32 per answer position a quantized "
           "or bf16 variant must reach.", GATE, maximum=1.0),
    _float("MNESIO_GATE_ACCURACY_TOLERANCE", 0.0, "How far cartridge accuracy on the cases may fall below text "
           "re-reading (0: no loss allowed).", GATE, maximum=1.0),
    _bool("MNESIO_GATE_REQUIRE_RETRIEVAL", False, "Whether the cartridge must also match the top-k text retrieval "
          "baseline (false: it is recorded only).", GATE),
    _int("MNESIO_GATE_RETRIEVAL_TOP_K", 3, "How many memories the BM25 retrieval baseline re-reads per question.", GATE,
         minimum=1),
    _int("MNESIO_GATE_NUM_AUTO_PROBES", 4, "How many probe questions are made from the memories (bounds gate time).",
         GATE, minimum=1),
    _int("MNESIO_GATE_MAX_NEW_TOKENS", 16, "Greedy answer length when scoring evaluation cases.", GATE, minimum=1),
    _int("MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS", 8, "Greedy length of each fidelity probe.", GATE, minimum=1),
    _int("MNESIO_GATE_FULL_EVERY", 10, "Every Nth version of an incremental chain runs the whole gate (1: always).",
         GATE, minimum=1),
    _float("MNESIO_GATE_MAX_KV_ABS_DIFF", 1e-3, "Most max |KV difference| between a cartridge's new part and its "
           "one-pass re-reading.", GATE),
    _choice("MNESIO_DEFAULT_AUTO_REFRESH", "on_append", ("on_append", "manual"), "A new scope's refresh: on append "
            "(after 2 s), or a manual step; a scope's own setting wins.", GATE),
    _int("MNESIO_AUTO_REFRESH_MARKER_GRACE_S", 600, "How long past its debounce a scope's refresh-pending marker lives, "
         "seconds.", GATE, minimum=1),
    _int("MNESIO_ORPHAN_BLOB_GRACE_S", None, "Age after which `manage.py cartridge_sweep` removes a blob whose "
         "compile died, seconds.", GATE,
         minimum=0, default_doc="CELERY_TASK_TIME_LIMIT + 60"),
    _float("MNESIO_CARTRIDGE_COMPILE_PAUSE_S", 0.0, "Fault injection for tests: a pause between opening the log and "
           "compiling, seconds.", GATE, maximum=600.0),
    _float("MNESIO_CARTRIDGE_STORE_PAUSE_S", 0.0, "Fault injection for tests: a pause between writing a compile's "
           "blobs and recording its version, seconds.", GATE, maximum=600.0),
    # -- Serving and answering
    _int("MNESIO_ANSWER_MAX_NEW_TOKENS", 32, "Greedy answer length of an ask.", SERVING, minimum=1),
    _int("MNESIO_ANSWER_REQUEST_TTL_S", 3600, "How long an async answer waits to be collected before it expires and "
         "is swept (celery beat, `manage.py answer_requests_sweep`), seconds.", SERVING, minimum=1),
    _int("MNESIO_FRESH_MAX_MEMORIES", 32, "Most memories appended after the serving version that an ask compiles on "
         "top of it in memory (0: never).", SERVING, minimum=0),
    _int("MNESIO_FRESH_MAX_CONCURRENT", 1, "Fresh compiles at once per process; an ask past it is answered by its "
         "version alone.", SERVING, minimum=1),
    _int("MNESIO_MAX_WAITING_ASKS", 32, "How many asks one process holds at once before answering 429.", SERVING,
         minimum=1),
    _int("MNESIO_ASK_RETRY_AFTER_S", 2, "The Retry-After of a 429 for too many waiting asks, seconds.", SERVING,
         minimum=1),
    _int("MNESIO_MAX_PENDING_ASYNC_ASKS", 64, "How many unanswered async asks one process files before answering 429.",
         SERVING, minimum=1),
    _int("MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER", 16, "How many unanswered async asks one user may have (every "
         "process) before 429.", SERVING, minimum=1),
    _int("MNESIO_MCP_MAX_SESSIONS", 1000, "How many MCP sessions one process keeps open (503 past it).", SERVING,
         minimum=1),
    _int("MNESIO_MCP_MAX_SESSIONS_PER_USER", 8, "How many MCP sessions one user (all their tokens) holds open in one "
         "process before 429.", SERVING, minimum=1),
    _int("MNESIO_MCP_SESSION_IDLE_S", 600, "Seconds without a request after which an MCP session is closed.", SERVING,
         minimum=1),
    _int("MNESIO_REMOTE_ANSWER_TIMEOUT_S", 120, "How long a model-free web process waits for a gpu worker's answer "
         "before 504, seconds.", SERVING, minimum=1),
    _choice("MNESIO_SEARCH_RETRIEVER", "bm25", ("bm25", "hybrid"), "Search ranking: BM25 alone, or BM25 fused with "
            "all-MiniLM-L6-v2 similarity.", SERVING),
    _int("MNESIO_SEARCH_DENSE_WINDOW", 2000, "How many of the newest matching memories hybrid search embeds.", SERVING,
         minimum=1),
    # -- The routed layout
    _text("MNESIO_ROUTED_REPAIR", "full", "The repair of a routed answer: none, full, first-N or deviation-P%.",
          ROUTED),
    _choice("MNESIO_ROUTED_CHUNK_QUANT", "q8", CHUNK_QUANTS, "How a routed chunk is stored: q8, or none (the "
            "backend's dtype).", ROUTED),
    _int("MNESIO_ROUTED_TOP_K", 8, "How many memories a routed answer retrieves at most (BM25).", ROUTED, minimum=1,
         maximum=100),
    _int("MNESIO_ROUTED_TOKEN_BUDGET", 2048, "Most memory tokens a routed answer assembles.", ROUTED, minimum=1),
    _int("MNESIO_ROUTED_CHUNK_CACHE_SIZE", 512, "How many opened chunks one process keeps (LRU); 0 disables the cache.",
         ROUTED, minimum=0),
    # -- Celery and metrics
    _text("REDIS_URL", "", "The Redis of the Celery broker and results (empty: tasks run in-process).", CELERY),
    _text("CELERY_BROKER_URL", "", "The Celery broker.", CELERY, default_doc="$REDIS_URL"),
    _text("CELERY_RESULT_BACKEND", "", "Where Celery keeps task results.", CELERY, default_doc="$REDIS_URL"),
    _int("CELERY_TASK_SOFT_TIME_LIMIT", 1500, "Seconds after which a task is asked to stop (below the hard limit).",
         CELERY, minimum=1),
    _int("CELERY_TASK_TIME_LIMIT", 1800, "Seconds after which a task is killed (below the visibility timeout).",
         CELERY, minimum=1),
    _int("CELERY_VISIBILITY_TIMEOUT", 3600, "Seconds after which Redis redelivers an unacknowledged task.", CELERY,
         minimum=1),
    _text("PROMETHEUS_MULTIPROC_DIR", "", "An existing directory where every process writes its metrics for one "
          "/metrics (empty: this process only).", CELERY),
    # -- Scripts and commands: read outside Django's settings, by the program named
    _text("MNESIO_BIND", "127.0.0.1:8000", "The address bin/serve listens on (0.0.0.0:8000 behind a proxy).", SCRIPTS,
          read_by="bin/serve"),
    _text("MNESIO_WEB_WORKERS", "2", "bin/serve's worker processes (about one per core).", SCRIPTS,
          read_by="bin/serve"),
    _text("MNESIO_WEB_TIMEOUT", "120", "Seconds a bin/serve worker may stay silent before it is restarted.", SCRIPTS,
          read_by="bin/serve"),
    _text("MNESIO_FLEET_NAME", "fleet", "The prefix of bin/fleet's worker names.", SCRIPTS, read_by="Procfile.fleet"),
    _text("MNESIO_FLEET_DIR", "", "bin/fleet's directory: beat's schedule, metrics, its own Redis.", SCRIPTS,
          read_by="bin/fleet", default_doc="$MNESIO_DATA_DIR/fleet"),
    _text("MNESIO_FLEET_DEFAULT_CONCURRENCY", "2", "Processes of bin/fleet's default-queue worker.", SCRIPTS,
          read_by="Procfile.fleet"),
    _text("MNESIO_FLEET_GPU_CONCURRENCY", "1", "Processes of bin/fleet's gpu-queue worker.", SCRIPTS,
          read_by="Procfile.fleet"),
    _text("MNESIO_FLEET_REDIS_PORT", "6380", "The port of the Redis that bin/fleet --own-redis starts.", SCRIPTS,
          read_by="bin/fleet"),
    _text("MNESIO_LOCAL_S3_PORT", "9000", "The port of the local S3 server of bin/local-s3 and bin/fleet --local-s3.",
          SCRIPTS, read_by="bin/local-s3"),
    _text("MNESIO_SETUP_FORCE", "0", "1: bin/setup runs pip even when the requirements are those it last installed.",
          SCRIPTS, read_by="bin/setup"),
    _text("MNESIO_SKIP_CHROMIUM", "0", "1: bin/setup does not install Chromium for the browser tests.", SCRIPTS,
          read_by="bin/setup"),
    _text("MNESIO_TEST_ARTIFACTS", "", "Where bin/test writes the suite's figures and logs.", SCRIPTS,
          read_by="bin/test", default_doc="test-artifacts/ in the checkout"),
    _text("MNESIO_TEST_WORKERS", "2", "bin/test's pytest-xdist workers, each with its own test database, Redis db and data "
          "dir (0: one process).", SCRIPTS, read_by="bin/test"),
    _text("MNESIO_TOKEN", "", "The API token of `manage.py mcp` (stdio) when --token is not given.", SCRIPTS,
          read_by="manage.py mcp"),
    _text("MNESIO_DEMO_PASSWORD", "", "The demo operator's password (empty: generated once and kept).", SCRIPTS,
          read_by="manage.py mnesio_demo"),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in DECLARED}
assert len(SETTINGS) == len(DECLARED), "a variable is declared twice"
SECTIONS: tuple[str, ...] = tuple(dict.fromkeys(s.section for s in DECLARED))


def read(name: str, *, default: Any = _UNSET) -> Any:
    """The declared variable ``name`` read from the process environment (see Setting.read)."""
    return SETTINGS[name].read(default=default)
