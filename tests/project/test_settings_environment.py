"""mnesio_site/settings.py reads every variable through django-environ, with its default, and refuses bad values
loudly, naming the variable and what it accepts. Each case runs the settings file afresh with its own environment."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

ROOT = Path(__file__).resolve().parents[2]


def test_the_defaults_hold_with_nothing_set(load, tmp_path):
    s = load()
    assert s["DEBUG"] is False and s["SECURE_SSL_REDIRECT"] is True and s["SECURE_HSTS_SECONDS"] == 31536000
    assert s["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert s["DATABASES"]["default"]["NAME"] == str(tmp_path / "mnesio.sqlite3")
    assert s["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1", "[::1]", "testserver"] and s["CSRF_TRUSTED_ORIGINS"] == []
    assert (s["MNESIO_KV_BACKEND"], s["MNESIO_KV_DTYPE"], s["MNESIO_KV_QUANT"]) == ("transformers", "f32", "none")
    assert (s["CELERY_TASK_SOFT_TIME_LIMIT"], s["CELERY_TASK_TIME_LIMIT"], s["CELERY_VISIBILITY_TIMEOUT"]) == (1500, 1800, 3600)
    assert s["CELERY_BROKER_TRANSPORT_OPTIONS"] == {"visibility_timeout": 3600} and s["CELERY_TASK_ALWAYS_EAGER"]
    assert (s["MNESIO_GATE_MIN_FIDELITY"], s["MNESIO_GATE_ACCURACY_TOLERANCE"], s["MNESIO_GATE_REQUIRE_RETRIEVAL"]) == (
        0.95, 0.0, False
    )
    assert (s["MNESIO_GATE_RETRIEVAL_TOP_K"], s["MNESIO_GATE_NUM_AUTO_PROBES"], s["MNESIO_GATE_MAX_NEW_TOKENS"],
            s["MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS"], s["MNESIO_ANSWER_MAX_NEW_TOKENS"]) == (3, 4, 16, 8, 32)
    assert (s["MNESIO_ANSWER_REQUEST_TTL_S"], s["MNESIO_ORPHAN_BLOB_GRACE_S"], s["MNESIO_CARTRIDGE_COMPILE_PAUSE_S"]) == (
        3600, None, 0.0
    )
    assert s["MNESIO_KV_ALLOWED_MODELS"] == ["smollm2-135m-instruct", "fake-model"] and s["MNESIO_KV_BLOCK_SIZE"] == 64
    assert s["MNESIO_MASTER_KEY"] == b"k" * 32 and s["MNESIO_MASTER_KEY_OLD"] is None


def test_it_reads_values_and_treats_an_empty_variable_as_unset(load):
    s = load(MNESIO_DEBUG="On", MNESIO_GATE_MIN_FIDELITY="0.5", MNESIO_GATE_REQUIRE_RETRIEVAL="yes",
             MNESIO_CARTRIDGE_COMPILE_PAUSE_S="3", MNESIO_KV_ALLOWED_MODELS=" a, b ,,c", ALLOWED_HOSTS="x.example, y",
             MNESIO_ORPHAN_BLOB_GRACE_S="0", MNESIO_ANSWER_MAX_NEW_TOKENS="", DB_CONN_MAX_AGE="60",
             DATABASE_URL="postgres://u:p%40ss@db.example:5433/mnesio?sslmode=require",
             REDIS_URL="redis://127.0.0.1:6379/3", MNESIO_KV_BLOCK_SIZE="256")
    assert s["DEBUG"] is True and s["SECURE_SSL_REDIRECT"] is False and s["MNESIO_GATE_MIN_FIDELITY"] == 0.5
    assert s["MNESIO_GATE_REQUIRE_RETRIEVAL"] is True and s["MNESIO_CARTRIDGE_COMPILE_PAUSE_S"] == 3.0
    assert s["MNESIO_KV_ALLOWED_MODELS"] == ["a", "b", "c"] and s["ALLOWED_HOSTS"] == ["x.example", "y"]
    assert s["MNESIO_ORPHAN_BLOB_GRACE_S"] == 0 and s["MNESIO_ANSWER_MAX_NEW_TOKENS"] == 32 and s["MNESIO_KV_BLOCK_SIZE"] == 256
    db = s["DATABASES"]["default"]
    assert (db["ENGINE"], db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["CONN_MAX_AGE"]) == (
        "django.db.backends.postgresql", "mnesio", "u", "p@ss", "db.example", 5433, 60
    )
    assert db["OPTIONS"] == {"sslmode": "require"} and s["IS_POSTGRES"]
    assert s["CELERY_BROKER_URL"] == s["CELERY_RESULT_BACKEND"] == "redis://127.0.0.1:6379/3"
    assert not s["CELERY_TASK_ALWAYS_EAGER"]


def test_secrets_come_from_files_and_are_taken_literally(load, tmp_path):
    (tmp_path / "secret").write_text("$NOT_A_VARIABLE-secret\n")
    (tmp_path / "new.key").write_text(base64.b64encode(b"n" * 32).decode())
    (tmp_path / "old.key").write_text(base64.urlsafe_b64encode(b"o" * 32).decode())
    s = load(SECRET_KEY="ignored", SECRET_KEY_FILE=str(tmp_path / "secret"),
             MNESIO_MASTER_KEY_FILE=str(tmp_path / "new.key"), MNESIO_MASTER_KEY_OLD_FILE=str(tmp_path / "old.key"))
    # django-environ would read a leading `$` as the name of another variable; a secret is taken as written
    assert s["SECRET_KEY"] == "$NOT_A_VARIABLE-secret"
    assert (s["MNESIO_MASTER_KEY"], s["MNESIO_MASTER_KEY_OLD"]) == (b"n" * 32, b"o" * 32)
    assert load(SECRET_KEY="$HOME")["SECRET_KEY"] == "$HOME"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"MNESIO_DEBUG": "maybe"}, "`MNESIO_DEBUG` has to be one of ['true', 'false', '1', '0', 'yes', 'no', 'on', 'off'] but got 'maybe'"),
        ({"MNESIO_GATE_REQUIRE_RETRIEVAL": "sometimes"}, "`MNESIO_GATE_REQUIRE_RETRIEVAL` has to be one of"),
        ({"MNESIO_MAX_MEMORY_BYTES": "8k"}, "`MNESIO_MAX_MEMORY_BYTES` has to be an integer but got '8k'"),
        ({"MNESIO_MAX_MEMORY_BYTES": "0"}, "`MNESIO_MAX_MEMORY_BYTES` has to be >= 1 but got 0"),
        ({"MNESIO_CARTRIDGE_CACHE_SIZE": "-1"}, "`MNESIO_CARTRIDGE_CACHE_SIZE` has to be >= 0 but got -1"),
        ({"MNESIO_GATE_MIN_FIDELITY": "1.5"}, "`MNESIO_GATE_MIN_FIDELITY` has to be between 0.0 and 1.0 but got 1.5"),
        ({"MNESIO_GATE_MIN_FIDELITY": "0.0.1"}, "`MNESIO_GATE_MIN_FIDELITY` has to be a number but got '0.0.1'"),
        ({"MNESIO_CARTRIDGE_COMPILE_PAUSE_S": "601"}, "`MNESIO_CARTRIDGE_COMPILE_PAUSE_S` has to be between 0.0 and 600.0"),
        ({"MNESIO_GATE_RETRIEVAL_TOP_K": "0"}, "`MNESIO_GATE_RETRIEVAL_TOP_K` has to be >= 1 but got 0"),
        ({"MNESIO_ANSWER_REQUEST_TTL_S": "soon"}, "`MNESIO_ANSWER_REQUEST_TTL_S` has to be an integer but got 'soon'"),
        ({"MNESIO_KV_DTYPE": "f64"}, "`MNESIO_KV_DTYPE` has to be one of ['f32', 'bf16', 'f16', 'bf16r', 'f32w8', 'bf16w8'] but got 'f64'"),
        ({"MNESIO_KV_QUANT": "q3"}, "`MNESIO_KV_QUANT` has to be one of ['none', 'q8', 'q4'] but got 'q3'"),
        ({"MNESIO_KV_BLOCK_SIZE": "96"}, "`MNESIO_KV_BLOCK_SIZE` has to be a multiple of 64 tokens but got 96"),
        ({"MNESIO_KV_BLOCK_SIZE": "0"}, "`MNESIO_KV_BLOCK_SIZE` has to be >= 64 but got 0"),
        ({"MNESIO_KV_BLOCK_SIZE": "1048576"}, "`MNESIO_KV_BLOCK_SIZE` has to be <= 8192 but got 1048576"),
        ({"MNESIO_KV_BLOCK_SIZE": "64 tokens"}, "`MNESIO_KV_BLOCK_SIZE` has to be an integer but got '64 tokens'"),
        ({"MNESIO_LOG_LEVEL": "TRACE"}, "`MNESIO_LOG_LEVEL` has to be one of ['DEBUG', 'INFO', 'WARNING', 'ERROR']"),
        ({"MNESIO_KV_BACKEND": "fake"}, "unless `MNESIO_ALLOW_FAKE_BACKEND=true`"),
        ({"DATABASE_URL": "mysql://a@b/c"}, "`DATABASE_URL` has to name 'sqlite' or 'postgres' but names 'django.db.backends.mysql'"),
        ({"DATABASE_URL": "nonsense"}, "`DATABASE_URL` has to name 'sqlite' or 'postgres'"),
        ({"CELERY_TASK_TIME_LIMIT": "60", "CELERY_VISIBILITY_TIMEOUT": "60"},
         "`CELERY_TASK_TIME_LIMIT` (60) has to be below `CELERY_VISIBILITY_TIMEOUT` (60)"),
        ({"CELERY_TASK_SOFT_TIME_LIMIT": "1800"}, "`CELERY_TASK_SOFT_TIME_LIMIT` has to be below `CELERY_TASK_TIME_LIMIT`"),
        ({"SECRET_KEY": ""}, "`SECRET_KEY` (or `SECRET_KEY_FILE`) must be set when MNESIO_DEBUG is false"),
        ({"SECRET_KEY_FILE": "/nonexistent/secret"}, "`SECRET_KEY_FILE` points at '/nonexistent/secret'"),
        ({"MNESIO_MASTER_KEY": ""}, "`MNESIO_MASTER_KEY` (or `MNESIO_MASTER_KEY_FILE`) must be set"),
        ({"MNESIO_MASTER_KEY": base64.b64encode(b"short").decode()}, "`MNESIO_MASTER_KEY` has to decode to 32 bytes"),
        ({"PROMETHEUS_MULTIPROC_DIR": "/nonexistent/prometheus"}, "`PROMETHEUS_MULTIPROC_DIR` has to be an existing directory"),
        ({"MNESIO_MASTER_KEY_OLD": "***"}, "`MNESIO_MASTER_KEY_OLD` has to decode to 32 bytes"),
    ],
)
def test_it_refuses_bad_values_naming_the_variable(load, variables, message):
    with pytest.raises(ImproperlyConfigured) as exc:
        load(**variables)
    assert message in str(exc.value)


def test_the_lifecycle_accessors_read_settings_and_check_overrides(settings):
    from cartridges import conf

    settings.MNESIO_GATE_MIN_FIDELITY = 0.5
    settings.MNESIO_CARTRIDGE_COMPILE_PAUSE_S = 2
    settings.MNESIO_ORPHAN_BLOB_GRACE_S = None
    settings.CELERY_TASK_TIME_LIMIT = 100
    assert (conf.gate_min_fidelity(), conf.compile_pause_s(), conf.orphan_blob_grace_s()) == (0.5, 2.0, 160)
    settings.MNESIO_KV_ALLOWED_MODELS = ["a"]
    settings.MNESIO_KV_MODEL = "b"
    assert conf.allowed_models() == ["a", "b"]
    settings.MNESIO_GATE_MIN_FIDELITY = 2.0
    with pytest.raises(ImproperlyConfigured, match="`MNESIO_GATE_MIN_FIDELITY` has to be between 0.0 and 1.0"):
        conf.gate_min_fidelity()


def test_no_module_but_settings_reads_the_environment():
    """cartridges.conf and the Celery app read django.conf.settings only (kvengine, with no Django, reads its own)."""
    root = ROOT
    for path in ("cartridges/conf.py", "mnesio_site/celery.py"):
        text = (root / path).read_text()
        assert "os.environ.get" not in text and "getenv" not in text, path
