"""Error pages and error logs never show key material or memory plaintext, in debug or not."""
from __future__ import annotations

import base64
import html
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .error_urls import PLAINTEXT

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.reliability.error_urls")]


def _forms(key: bytes) -> list[str]:
    """Every way a key shows up in text: repr (whole, and its ends: pprint splits long bytes over lines), hex,
    standard and urlsafe base64."""
    return [
        repr(key)[2:-1],
        repr(key[:10])[2:-1],
        repr(key[-10:])[2:-1],
        key.hex(),
        base64.b64encode(key).decode().rstrip("="),
        base64.urlsafe_b64encode(key).decode().rstrip("="),
    ]


def _leaks(text: str, secrets: dict[str, list[str]]) -> list[str]:
    text = html.unescape(text)
    return [f"{label}: {form!r}" for label, forms in secrets.items() for form in forms if form and form in text]


def _capture_keys(monkeypatch) -> list[bytes]:
    """Record every data key the view creates."""
    from memories import crypto

    made: list[bytes] = []
    original = crypto.new_data_key

    def new_data_key() -> bytes:
        made.append(original())
        return made[-1]

    monkeypatch.setattr(crypto, "new_data_key", new_data_key)
    return made


@pytest.mark.parametrize("debug", [True, False])
def test_it_shows_no_key_or_plaintext_on_a_500_page_or_in_its_log_record(settings, client, caplog, monkeypatch, debug):
    from django.views.debug import ExceptionReporter

    from memories import crypto

    settings.DEBUG = debug
    data_keys = _capture_keys(monkeypatch)
    client.raise_request_exception = False
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = client.post("/fail/decrypt/", {"content": PLAINTEXT, "note": "posted"})
    assert response.status_code == 500
    assert len(data_keys) == 1
    secrets = {
        "master key": _forms(crypto.master_key()),
        "data key": _forms(data_keys[0]),
        "plaintext": [PLAINTEXT, PLAINTEXT.encode().hex()],
    }
    page = response.content.decode(errors="replace")
    if debug:
        assert "InvalidTag" in page and "unseal" in page  # the traceback itself is still shown
    assert not _leaks(page, secrets), _leaks(page, secrets)

    records = [r for r in caplog.records if r.name == "django.request" and r.exc_info]
    assert len(records) == 1
    record = records[0]
    reporter = ExceptionReporter(record.request, *record.exc_info, is_email=True)
    for label, text in [
        ("message", record.getMessage()),
        ("traceback text", reporter.get_traceback_text()),
        ("traceback html", reporter.get_traceback_html()),
    ]:
        assert not _leaks(text, secrets), (label, _leaks(text, secrets))


def test_it_shows_no_memory_text_on_a_debug_500_page_after_the_selector_opened_memories(settings, client, scope_a, append):
    settings.DEBUG = True
    append(scope_a, PLAINTEXT)
    append(scope_a, PLAINTEXT + " (dana)", "dana")
    client.raise_request_exception = False
    response = client.get("/fail/open/")
    assert response.status_code == 500
    page = html.unescape(response.content.decode(errors="replace"))
    assert "failed after opening 2 memories" in page  # the error itself is shown
    assert PLAINTEXT not in page


def test_the_project_filter_is_active_with_debug_on(settings, rf):
    from django.views.debug import get_exception_reporter_filter

    settings.DEBUG = True
    reporter_filter = get_exception_reporter_filter(rf.get("/"))
    assert reporter_filter.is_active(rf.get("/"))
    assert settings.DEFAULT_EXCEPTION_REPORTER_FILTER == "mnesio_site.debug.SecretsExceptionReporterFilter"


SENSITIVE = {
    "memories.crypto": ["master_key", "master_key_id", "known_master_keys", "new_data_key", "seal", "unseal",
                        "seal_box", "open_box", "wrap", "unwrap"],
    "memories.selectors": ["memories_open"],
    "cartridges.storage": ["blob_reserve", "blob_write", "blob_read"],
    "cartridges.services.answer_requests": ["answer_request_key", "answer_request_file", "answer_request_answer",
                                            "answer_request_collect"],
}


@pytest.mark.parametrize("module_name", sorted(SENSITIVE))
def test_the_crypto_and_decryption_paths_are_marked_sensitive(module_name):
    """Belt and braces: were the project filter ever swapped for Django's, these frames would still be hidden."""
    import importlib

    module = importlib.import_module(module_name)
    unmarked = [name for name in SENSITIVE[module_name]
                if getattr(module, name).__code__.co_name != "sensitive_variables_wrapper"]
    assert not unmarked, f"{module_name}: {unmarked} lack @sensitive_variables()"


def test_djangos_own_filter_hides_the_marked_frames_with_debug_off(settings, rf):
    """With Django's filter (active when DEBUG is off) the decorators alone hide unseal's key."""
    import sys

    from django.views.debug import ExceptionReporter

    from memories import crypto

    settings.DEBUG = False
    settings.DEFAULT_EXCEPTION_REPORTER_FILTER = "django.views.debug.SafeExceptionReporterFilter"
    key = crypto.new_data_key()
    nonce, sealed = crypto.seal(key, PLAINTEXT.encode(), aad=b"right")
    try:
        crypto.unseal(key, nonce, sealed, aad=b"wrong")
    except crypto.InvalidTag:
        exc_info = sys.exc_info()
    frames = ExceptionReporter(rf.get("/"), *exc_info).get_traceback_frames()
    unseal = next(f for f in frames if f["function"] == "unseal")
    assert unseal["vars"] and all(value.strip("'") == "*" * 20 for _, value in unseal["vars"]), unseal["vars"]


# ---------------------------------------------------------------------------
# Debug is off unless asked for: only bin/run (the embedded demo) turns it on
# ---------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
SHOW_DEBUG = "from django.conf import settings; print('DEBUG', settings.DEBUG)"


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MNESIO_", "SECRET_KEY", "DJANGO_SETTINGS"))}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, timeout=120)


def test_debug_is_off_by_default_and_then_the_secrets_are_required():
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    shown = _manage("shell", "-c", SHOW_DEBUG, env={"SECRET_KEY": "s" * 60, "MNESIO_MASTER_KEY": key})
    assert shown.returncode == 0 and "DEBUG False" in shown.stdout, shown.stderr[-2000:]
    no_secret = _manage("shell", "-c", SHOW_DEBUG, env={"MNESIO_MASTER_KEY": key})
    assert no_secret.returncode != 0 and "`SECRET_KEY` (or `SECRET_KEY_FILE`) must be set" in no_secret.stderr
    no_key = _manage("shell", "-c", SHOW_DEBUG, env={"SECRET_KEY": "s" * 60})
    assert no_key.returncode != 0 and "`MNESIO_MASTER_KEY` (or `MNESIO_MASTER_KEY_FILE`) must be set" in no_key.stderr


def test_only_bin_run_turns_debug_on():
    assert "export MNESIO_DEBUG=true" in (ROOT / "bin" / "run").read_text()
    assert "MNESIO_DEBUG" not in (ROOT / "bin" / "test").read_text()


def test_the_test_processes_and_their_subprocesses_share_one_master_key():
    """tests/settings.py puts the session's master key into the environment every subprocess inherits."""
    from memories import crypto

    key_id = "from memories import crypto; print(crypto.master_key_id(crypto.master_key()))"
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", key_id], cwd=ROOT, env=dict(os.environ),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == crypto.master_key_id(crypto.master_key())
