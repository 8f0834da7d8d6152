"""Each variable is declared once (core/settings_spec.py) and everything that reads it reads that declaration:
settings.py reads every declared variable and no other, the scripts' defaults are the declared ones, the engine's
choices are kvengine's own lists, and a test's override fails as a bad environment value does."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.settings_spec import DECLARED, SETTINGS, SETTINGS_PY
from kvengine.config import BACKENDS, CHUNK_QUANTS, DTYPES, QUANTS

ROOT = Path(__file__).resolve().parents[2]
# MNESIO_ names in the code (tests aside: their knobs are theirs) that are not variables the project reads: settings
# derived from the declared ones or fixed (settings.py), and prefixes in comments (MNESIO_KV_*, MNESIO_TOKEN_*).
NOT_VARIABLES = {
    "MNESIO_MASTER_KEY_DEV_FILE", "MNESIO_MAX_SUBJECT_CHARS", "MNESIO_MAX_IDEMPOTENCY_KEY_CHARS",
    "MNESIO_MAX_BATCH_ITEMS", "MNESIO_KV_", "MNESIO_TOKEN_",
}


def _tracked(*patterns: str) -> list[Path]:
    names = subprocess.run(["git", "ls-files", "--", *patterns, ":!tests"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in names.split()]


def test_every_mnesio_variable_the_code_names_is_declared():
    files = _tracked("*.py", "bin/*", "Procfile*")
    named = {m for path in files if path.is_file() for m in re.findall(r"MNESIO_[A-Z0-9_]+", path.read_text())}
    named = {n.removesuffix("_FILE") if n.removesuffix("_FILE") in SETTINGS else n for n in named}
    assert named - NOT_VARIABLES - set(SETTINGS) == set()
    assert {s.name for s in DECLARED if s.name.startswith("MNESIO_")} - named == set()  # nothing declared for nothing


def test_settings_py_reads_every_declared_variable_through_the_declaration():
    # settings.py and the pieces it builds its larger values with (mnesio_site/settings_parts/)
    files = [ROOT / "mnesio_site" / "settings.py", *sorted((ROOT / "mnesio_site" / "settings_parts").glob("*.py"))]
    text = "\n".join(path.read_text() for path in files)
    read = set(re.findall(r'\bread\("([A-Z0-9_]+)"', text))
    assert read == {s.name for s in DECLARED if s.read_by == SETTINGS_PY}
    assert "os.environ" not in text and "ENV.str(" not in text and "ENV.int(" not in text


@pytest.mark.parametrize("setting", [s for s in DECLARED if s.read_by.startswith(("bin/", "Procfile")) and not s.default_doc],
                         ids=lambda s: s.name)
def test_a_script_defaults_to_the_declared_value(setting):
    text = (ROOT / setting.read_by).read_text()
    assert f"${{{setting.name}:-{setting.default}}}" in text


def test_the_engine_choices_are_kvengines_own_lists():
    assert SETTINGS["MNESIO_KV_BACKEND"].choices == BACKENDS and SETTINGS["MNESIO_KV_DTYPE"].choices == DTYPES
    assert SETTINGS["MNESIO_KV_QUANT"].choices == QUANTS and SETTINGS["MNESIO_ROUTED_CHUNK_QUANT"].choices == CHUNK_QUANTS


def test_the_auto_refresh_choices_are_the_scope_settings_own():
    from cartridges.models import AutoRefresh

    assert set(SETTINGS["MNESIO_DEFAULT_AUTO_REFRESH"].choices) == set(AutoRefresh.values)


def test_reading_the_declaration_imports_neither_torch_nor_django_settings():
    code = "import sys, core.settings_spec; print('torch' in sys.modules, 'django.conf' in sys.modules and " \
           "sys.modules['django.conf'].settings.configured)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MNESIO_GATE_MIN_FIDELITY", "high", "`MNESIO_GATE_MIN_FIDELITY` has to be a number but got 'high'"),
        ("MNESIO_GATE_MAX_MEAN_KL", -1, "`MNESIO_GATE_MAX_MEAN_KL` has to be >= 0.0 but got -1.0"),
        ("MNESIO_ANSWER_MAX_NEW_TOKENS", 0, "`MNESIO_ANSWER_MAX_NEW_TOKENS` has to be >= 1 but got 0"),
        ("MNESIO_ROUTED_TOP_K", 101, "`MNESIO_ROUTED_TOP_K` has to be <= 100 but got 101"),
        ("MNESIO_ROUTED_CHUNK_QUANT", "q4", "`MNESIO_ROUTED_CHUNK_QUANT` has to be one of ['none', 'q8'] but got 'q4'"),
        ("MNESIO_WEB_LOADS_MODEL", "perhaps", "`MNESIO_WEB_LOADS_MODEL` has to be one of ['true', 'false'"),
    ],
)
def test_an_override_is_checked_like_the_environment(settings, name, value, message):
    from cartridges import conf

    setattr(settings, name, value)
    with pytest.raises(ImproperlyConfigured) as exc:
        conf.value(name)
    assert message in str(exc.value)


def test_the_routed_settings_come_from_the_environment(load):
    s = load(MNESIO_ROUTED_REPAIR="first-8", MNESIO_ROUTED_TOP_K="20", MNESIO_ROUTED_CHUNK_QUANT="none")
    assert (s["MNESIO_ROUTED_REPAIR"], s["MNESIO_ROUTED_TOP_K"], s["MNESIO_ROUTED_CHUNK_QUANT"]) == ("first-8", 20, "none")
    assert (s["MNESIO_ROUTED_TOKEN_BUDGET"], s["MNESIO_ROUTED_CHUNK_CACHE_SIZE"]) == (2048, 512)
    with pytest.raises(ImproperlyConfigured, match=r"`MNESIO_ROUTED_CHUNK_QUANT` has to be one of \['none', 'q8'\]"):
        load(MNESIO_ROUTED_CHUNK_QUANT="q4")
